"""Every Lua script reads or writes a key it finds at run time only after the guard has
checked it (``keys_here`` of ``lua/lib/guard.lua``), unless it says here why it need not.

On a cluster, a script runs on the node of its declared keys (KEYS); a key it builds at
run time (``K.resend(prefix, id)`` of an id read from an index...) may, while a legacy
migration holds its slot half-moved, already be on the other node: the script then aborts
at that key ("Script attempted to access a non local key", a ``ResponseError`` no caller
treats as a cluster in flux), its earlier writes kept. ``keys_here`` asks first, in one
command with a declared key, and turns that into ``TRYAGAIN`` with nothing written.

The check is static, over each script's source as Redis runs it (its ``--! include``
files inlined, :func:`outbox.store.scripts.source`), comments and string contents left
out:

* a *key access* is a ``redis.call``/``redis.pcall`` whose command takes a key (all but
  :data:`KEYLESS`); its key is its second argument;
* it is *declared* when that argument is ``KEYS[...]``, or a name every assignment of
  which (``local x = ...``, ``x = ...``, ``C.x = ...``, one of several names assigned
  at once) is made of ``KEYS[...]`` and names already found declared alone, such as
  ``local key = opts.lane == 'q' and KEYS[2] or KEYS[1]``;
* every other key access must be *guarded*: run after a guard call (``keys_here(`` or
  ``heirs_here(``, ``lua/lib/ordering.lua``, which calls it) in the order the script runs
  its top level. An access inside a function takes the places of the calls of that
  function (through the functions calling it); it is guarded when each of those places
  is after a guard call of the top level, or, in a function that calls the guard
  itself, when it comes after that call. A function the script never calls is not run.

What the guard's list names is checked by the tests that hold a slot half-moved on the
real cluster (``tests/operations/test_actions_on_a_half_moved_slot.py``,
``tests/delivery/test_deliver_on_cluster.py``); this test makes sure no script reads a
run-time key before any check at all, and that each exception is written down
(:data:`UNGUARDED`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import pytest

from outbox.store.scripts import names, source

#: Commands a script sends that take no key.
KEYLESS = {"PUBLISH", "PUBSUB"}
#: The calls that check run-time keys (lib/guard.lua, lib/ordering.lua).
GUARDS = ("keys_here", "heirs_here")

#: Key accesses no guard call comes before, per script, and why each is sound: the key
#: expressions as the script writes them (a new one fails the test until it is guarded or
#: written down here). Keep each reason true when its script changes.
UNGUARDED: dict[str, tuple[str, set[str]]] = {
    "backfill": (
        "the upgrade of version 0.1 data (unpartitioned, on one server: no slot moves)",
        {"K.resend(prefix, id)", "K.due(K.part(prefix, id), cur[1])"},
    ),
    "claim": (
        "runs with one partition only (one server: no slot moves); with more, a claim is "
        "pick.lua, gate.lua and claim_apply.lua",
        {
            "key",
            "unpack(args, first, last)",
            "rkey",
            "unpack(mkeys)",
            "K.dest(GATE.prefix, dest)",
            "K.gcra(GATE.prefix, dest)",
            "K.resend(C.prefix, id)",
            "pkey",
        },
    ),
    "claim_apply": (
        "the caller declares every key it may touch after its two: the records, status and "
        "parked indexes of each message its pick saw (PartitionedMessageStore."
        "claim_apply_keys), the index writes (lib/writes.lua) name those; the payload "
        "records of the deliveries it took (pkey, lib/claimed.lua) are read last, with "
        "pcall: one the script cannot read is left out of the reply and read by the caller",
        {"key", "unpack(args, first, last)", "rkey", "unpack(mkeys)", "K.resend(C.prefix, id)", "pkey"},
    ),
    "create": (
        "every key it touches is declared (a group of KEYS per message, named in the "
        "message's row: the order keys included, which lib/join.lua reads as q and st); the wake-up flags are set here "
        "with one partition only (lib/wakeup.lua)",
        {"key", "unpack(args, first, last)"},
    ),
    "filter": (
        "the sorted sets it reads are KEYS, handed to lib/merge.lua and its loops in "
        "tables; resend records are built with one partition only (with more, the caller "
        "declares them: rkeys)",
        {"keys[1]", "key", "rkeys and rkeys[i] or K.resend(prefix, id)"},
    ),
    "gate": (
        "runs in one destination's home slot; lib/gate.lua builds again the keys the caller "
        "declares (its state, GCRA and in-flight keys)",
        {"K.dest(GATE.prefix, dest)", "K.gcra(GATE.prefix, dest)"},
    ),
    "health": (
        "runs in one destination's home slot; it builds again the keys the caller declares "
        "(destination_state.health_keys: state, in-flight, health of the minute and of the "
        "breaker's window, errors of the hour, the run's counted mark); the run's one mark "
        "(K.counted_run) and a carried minute's hash (flush_carried's hkey) only with one "
        "partition (one server: no slot moves)",
        {
            "K.dest(prefix, dest)",
            "K.inflight(prefix, dest)",
            "K.counted(prefix, dest, run)",
            "K.counted_run(prefix, run)",
            "K.health(prefix, dest, m)",
            "hkey",
            "dkey",
            "ekey",
        },
    ),
    "transition": (
        "an ordered message's key queue q, read by order_next before heirs_here, is "
        "declared by the caller (MessageStore.transition_keys)",
        {"q"},
    ),
}


@dataclass
class Access:
    """A ``redis.call``/``redis.pcall`` of a key that is not declared."""

    line: int
    command: str
    key: str
    offset: int


def masked(text: str) -> str:
    """``text`` with its comments blanked and the contents of its string literals replaced
    by ``_`` (same length: offsets and lines stay)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif c in "'\"":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                out[k] = "_"
            i = j + 1
        else:
            i += 1
    return "".join(out)


def arguments(code: str, open_paren: int) -> tuple[list[str], int]:
    """The arguments of the call whose ``(`` is at ``open_paren``, and the offset of its ``)``."""
    depth, start, args = 0, open_paren + 1, []
    for i in range(open_paren, len(code)):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(code[start:i].strip())
                return args, i
        elif c == "," and depth == 1:
            args.append(code[start:i].strip())
            start = i + 1
    raise AssertionError(f"unbalanced call at {open_paren}")


WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPENERS = {"function", "if", "do", "repeat"}
CLOSERS = {"end", "until"}


def functions(code: str) -> dict[str, tuple[int, int]]:
    """Named functions (``local function f``, ``function K.f``, ``local f = function``):
    name (the last part of a dotted one) -> (offset of its body, offset of its ``end``)."""
    spans: dict[str, tuple[int, int]] = {}
    stack: list[tuple[str | None, int]] = []
    for m in WORD.finditer(code):
        word = m.group()
        if word in OPENERS:
            name = None
            if word == "function":
                after = re.match(r"\s*([A-Za-z_][\w.:]*)\s*\(", code[m.end() :])
                before = re.search(r"local\s+([A-Za-z_]\w*)\s*=\s*$", code[: m.start()])
                if after:
                    name = re.split(r"[.:]", after.group(1))[-1]
                elif before:
                    name = before.group(1)
            stack.append((name, m.end()))
        elif word in CLOSERS:
            name, start = stack.pop()
            if name is not None:
                spans[name] = (start, m.start())
    assert not stack, "unbalanced blocks"
    return spans


def enclosing(spans: dict[str, tuple[int, int]], offset: int) -> str | None:
    """The innermost named function whose body holds ``offset`` (None: the top level)."""
    inside = [(s, name) for name, (s, e) in spans.items() if s <= offset < e]
    return max(inside)[1] if inside else None


def assignments(code: str) -> list[tuple[str, str, int]]:
    """Every assignment of ``code`` (masked): (target name or ``C.x`` field, the expression
    assigned to it, offset), one per name of an assignment of several."""
    out = []
    pattern = re.compile(r"(?:local\s+)?([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=(?!=)([^\n]*)")
    for m in pattern.finditer(code):
        if code[m.start() - 1 : m.start()] in ".=~<>" or code[m.start() - 1 : m.start()].isalnum():
            continue  # part of a longer name or of an operator
        targets = [t.strip() for t in m.group(1).split(",")]
        exprs = split_top(m.group(2).strip())
        for i, target in enumerate(targets):
            out.append((target, exprs[i] if i < len(exprs) else "nil", m.start()))
    return out


def split_top(expr: str) -> list[str]:
    """``expr`` split at its commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(expr):
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "," and depth == 0:
            parts.append(expr[start:i].strip())
            start = i + 1
    parts.append(expr[start:].strip())
    return parts


def only_keys(expr: str, declared: set[tuple[str | None, str]], scope: str | None) -> bool:
    """Whether ``expr`` (in function ``scope``) can only be a declared key: ``KEYS[...]``
    or a declared name, with ``and``/``or`` conditions (whose other names are not keys)
    around them."""
    for choice in re.split(r"\bor\b", expr):
        value = re.split(r"\band\b", choice)[-1].strip()
        if re.fullmatch(r"KEYS\[[^\]]+\]", value):
            continue
        if (scope, value) in declared or (None, value) in declared or ("*", value) in declared:
            continue
        return False
    return True


class Script:
    """One script as Redis runs it: its functions, which names hold declared keys, where
    it calls the guard."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.original = source(name)
        self.code = masked(self.original)
        self.spans = functions(self.code)
        self.params = {}
        for fname, (start, _) in self.spans.items():
            opening = self.code.index("(", start)
            inside = self.code[opening + 1 : self.code.index(")", opening)]
            self.params[fname] = [p.strip() for p in inside.split(",") if p.strip()]
        self.declared = self.declared_names()

    def scope(self, offset: int) -> str | None:
        return enclosing(self.spans, offset)

    def calls_of(self, fname: str) -> list[tuple[int, list[str]]]:
        """The calls of function ``fname``: (offset, arguments)."""
        out = []
        for m in re.finditer(r"(?<![\w.:])" + re.escape(fname) + r"\s*\(", self.code):
            if re.search(r"function\s+[\w.]*$", self.code[: m.start()]):
                continue  # its definition
            args, _ = arguments(self.code, m.end() - 1)
            out.append((m.start(), args))
        return out

    def declared_names(self) -> set[tuple[str | None, str]]:
        """(scope, name) of the names that hold only declared keys: every assignment of
        the name in its scope (a ``C.x`` field: anywhere, scope "*"), and for a function's
        parameter every argument of its calls, can only be a declared key. Repeated until
        nothing changes."""
        values: dict[tuple[str | None, str], list[tuple[str, str | None]]] = {}
        for target, expr, at in assignments(self.code):
            scope = self.scope(at)
            key = ("*", target) if "." in target else (scope, target)
            values.setdefault(key, []).append((expr, scope))
        for fname, params in self.params.items():
            calls = self.calls_of(fname)
            for i, param in enumerate(params):
                values.setdefault((fname, param), []).extend(
                    (args[i] if i < len(args) else "nil", self.scope(at)) for at, args in calls
                )
        found: set[tuple[str | None, str]] = set()
        while True:
            more = {
                key
                for key, exprs in values.items()
                if exprs and all(only_keys(e, found, scope) for e, scope in exprs)
            } - found
            if not more:
                return found
            found |= more


def run_time_accesses(script: Script) -> list[Access]:
    """Every key access of ``script`` whose key is not declared (the guard's own EXISTS
    left out)."""
    code, out = script.code, []
    for m in re.finditer(r"\bredis\.p?call\s*\(", code):
        scope = script.scope(m.start())
        if scope in GUARDS and scope == "keys_here":
            continue  # the guard itself
        args, _ = arguments(code, m.end() - 1)
        first = code.index(args[0], m.end())
        command = script.original[first : first + len(args[0])].strip("'\"")
        if command in KEYLESS:
            continue
        key = args[1] if len(args) > 1 else ""
        if only_keys(key, script.declared, scope):
            continue
        out.append(Access(code.count("\n", 0, m.start()) + 1, command, key, m.start()))
    return out


def guard_calls(code: str) -> list[int]:
    """Offsets of the guard calls of ``code`` (not their definitions)."""
    return [
        m.start()
        for m in re.finditer(r"\b(" + "|".join(GUARDS) + r")\s*\(", code)
        if not re.search(r"function\s+$", code[: m.start()])
    ]


def places(script: Script, offset: int, seen: frozenset[str] = frozenset()) -> list[int]:
    """The top-level offsets at which code at ``offset`` runs: itself at the top level,
    else the places of every call of its function (none: never run)."""
    name = script.scope(offset)
    if name is None:
        return [offset]
    if name in seen:
        return []
    start, end = script.spans[name]
    out = []
    for at, _ in script.calls_of(name):
        if not start <= at < end:  # not a recursive call
            out += places(script, at, seen | {name})
    return out


def unguarded(name: str) -> list[tuple[str, str]]:
    """The key accesses of script ``name`` that no guard call comes before: (the key
    expression, the line of the source as run)."""
    script = Script(name)
    code = script.code
    guards = guard_calls(code)
    top_guards = [p for g in guards for p in places(script, g)]
    lines = script.original.splitlines()
    bad = []
    for access in run_time_accesses(script):
        own = script.scope(access.offset)
        if own is not None and any(g < access.offset and script.scope(g) == own for g in guards):
            continue  # after the guard call of its own function
        if all(any(g < p for g in top_guards) for p in places(script, access.offset)):
            continue  # every call of it runs after a guard call (none: never run)
        bad.append((access.key, f"{name}.lua (as run) line {access.line}: {lines[access.line - 1].strip()}"))
    return bad


def test_every_script_is_looked_at():
    assert {"pick", "claim_apply", "transition", "bulk"} <= set(names())
    assert set(UNGUARDED) <= set(names()), "an exception names a script that is gone"


@pytest.mark.parametrize("name", names())
def test_a_script_reads_a_run_time_key_only_after_the_guard(name):
    _, allowed = UNGUARDED.get(name, ("", set()))
    found = unguarded(name)
    assert [line for key, line in found if key not in allowed] == []
    assert {key for key, _ in found} == allowed, f"{name}: an exception no longer needed"


def test_the_check_finds_a_read_before_the_guard(monkeypatch):
    """The check itself: pick.lua as it was before issue 31 (its records read, no guard)
    is refused, and so is release.lua with its first guard call taken out."""
    from outbox.store import scripts

    real = scripts.source.__wrapped__
    edits = {
        "pick": ("local refused = keys_here(key, rkeys)", "local refused = nil"),
        "release": ("local refused = keys_here(KEYS[1], sending)", "local refused = nil"),
    }

    def edited(name: str) -> str:
        text = real(name)
        if name in edits:
            old, new = edits[name]
            assert old in text
            text = text.replace(old, new)
        return text

    monkeypatch.setattr(sys.modules[__name__], "source", edited)
    assert [key for key, _ in unguarded("pick")] == ["rkey"]
    assert "key" in [key for key, _ in unguarded("release")]
