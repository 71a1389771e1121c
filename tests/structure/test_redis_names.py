"""Every Redis name has one definition (docs/architecture.md, "Floor plan"): Python builds
key names in ``outbox/store/keys.py`` only (and Lua in ``lua/lib/keys.lua`` only, compared
with it by ``tests/store/test_lua_keys.py``); the numbers and include order both sides
depend on are declared once and checked."""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

import pytest

from outbox.destinations import health
from outbox.store import Keys, destination_state, scripts

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "outbox"
KEY_MODULE = PACKAGE / "store" / "keys.py"
#: Names built outside keys.py on purpose, each with its reason.
ALLOWED = {
    # OUTBOX["EVENTS_CHANNEL"]'s default, "<KEY_PREFIX>:events": outbox.conf is public and a
    # leaf below the store, so it cannot ask keys.py; it is the one definition of that name.
    ("outbox/conf.py", ":events"),
}


def _prefix_like(node: ast.AST) -> bool:
    return "prefix" in ast.unparse(node).lower()


def built_names(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string of ``path`` that starts with a key prefix and goes on
    with ``:``: an f-string ``f"{...prefix...}:..."`` or ``<...prefix...> + ":..."``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr) and len(node.values) >= 2:
            first, second = node.values[0], node.values[1]
            if (
                isinstance(first, ast.FormattedValue)
                and _prefix_like(first.value)
                and isinstance(second, ast.Constant)
                and str(second.value).startswith(":")
            ):
                found.append((node.lineno, str(second.value).split("{")[0]))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Add)
            and _prefix_like(node.left)
            and isinstance(node.right, ast.Constant)
            and str(node.right.value).startswith(":")
        ):
            found.append((node.lineno, str(node.right.value)))
    return found


def outside_the_key_module(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        if path == KEY_MODULE or "migrations" in path.parts:
            continue
        shown = str(path.relative_to(package.parent))
        for line, text in built_names(path):
            if (shown, text) not in ALLOWED:
                out.append(f"{shown}:{line}: {text!r}")
    return out


def test_no_key_name_is_built_outside_the_key_module():
    assert outside_the_key_module(PACKAGE) == [], "build key names in outbox/store/keys.py (Keys)"


def test_a_key_name_built_elsewhere_is_found(tmp_path):
    module = tmp_path / "outbox" / "store" / "somewhere.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def a(keys):\n    return f'{keys.prefix}:schema'\n\n\n"
        "def b(prefix, k):\n    return prefix + ':durability:' + k\n"
    )
    assert outside_the_key_module(tmp_path / "outbox") == [
        "outbox/store/somewhere.py:2: ':schema'",
        "outbox/store/somewhere.py:6: ':durability:'",
    ]


def test_the_latency_bucket_count_is_defined_once():
    """Python reads the histogram with the count lua/health.lua is given (health_args
    passes it); the script spells no count of its own."""
    assert health.BUCKETS == destination_state.LATENCY_BUCKETS
    args = destination_state.health_args(Keys("outbox"), "", [], "{}", 1.0)
    named = dict(zip(args[1::2], args[2::2], strict=True))
    assert named["buckets"] == destination_state.LATENCY_BUCKETS
    text = resources.files("outbox.store").joinpath("lua", "health.lua").read_text()
    assert re.search(r"local NB = tonumber\(opts\.buckets\)", text)


@pytest.mark.parametrize("script", scripts.names())
def test_every_script_includes_what_its_libraries_need_first(script):
    scripts.source.cache_clear()
    scripts.source(script)  # raises ValueError on a library included before one it needs


def test_a_library_included_before_what_it_needs_is_refused():
    assert scripts.include_order_errors("x", ["move", "keys", "writes"], scripts.needs) == [
        "lua/x.lua includes lib/move.lua before writes",
        "lua/x.lua includes lib/move.lua before keys",
    ]
    assert scripts.include_order_errors("x", ["keys", "writes", "move"], scripts.needs) == []
