"""The Lua scripts of ``lua/``, read once per process.

They are called by SHA1 with ``EVALSHA`` (see
:meth:`outbox.store.MessageRepository.run_scripts`). A repository loads every script
(``SCRIPT LOAD``) before its first call, so a pipeline of several scripts never meets
``NOSCRIPT`` half-way (which would run a later script before an earlier one), and again
after Redis answers ``NOSCRIPT`` (after a restart, or ``SCRIPT FLUSH``); Redis caches a
compiled script by the SHA1 of its source (Redis docs, "Scripting with Lua").

A line ``--! include <name>`` in a script is replaced by ``lua/lib/<name>.lua``: code
that several scripts share is written once. A library file that uses another's functions
says so in a line ``--! needs <name> ...``: :func:`source` refuses a script that includes
it before them.

Scripts take their keys in ``KEYS`` (built by :mod:`outbox.store.keys`) and their other
inputs by name where they have more than three (:func:`named`, read by
``lua/lib/args.lua``), except ``send()``'s scripts, ``lua/create.lua`` and
``lua/create_one.lua`` (one plain message), which take their inputs by position (named
on the Python side, ``outbox.store.messages.CREATE_HEADER``, ``CREATE_GROUP``,
``CREATE_FIELDS``, ``CREATE_ONE``), since every argument costs the client and Redis
about 0.3 µs and the names and their parsing were a third of its arguments and about
3 µs of its server time (issue 30, item 10).

Why ``EVALSHA`` and not Redis Functions (``FUNCTION LOAD`` once, then ``FCALL``; Redis
7.0+, https://redis.io/docs/latest/develop/interact/programmability/functions-intro/),
whose library code runs once at load instead of at every call: measured on a private
Redis 7.0 (``INFO commandstats``, µs per call of a script that only defines
``create.lua``'s library functions and returns, against an empty one with the same KEYS
and ARGV), those definitions cost about 1 to 2 µs of ``create.lua``'s 15 to 17 for one
message; its KEYS and ARGV (about 3 µs) and its seven writes are the rest. That gain
does not pay for a second way of loading and calling every script while Redis 5 and 6
stay supported on a single server (docs/compatibility.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

INCLUDE = "--! include "
NEEDS = "--! needs "


def needs(library: str) -> tuple[str, ...]:
    """The library files ``lua/lib/<library>.lua`` declares it needs included before it
    (its ``--! needs`` lines)."""
    text = (
        resources.files("outbox.store").joinpath("lua").joinpath("lib").joinpath(f"{library}.lua").read_text()
    )
    return tuple(
        n for line in text.splitlines() if line.startswith(NEEDS) for n in line[len(NEEDS) :].split()
    )


def include_order_errors(
    script: str, libraries: Sequence[str], needs: Callable[[str], Sequence[str]]
) -> list[str]:
    """What is wrong with including ``libraries`` in this order in ``lua/<script>.lua``: each
    library included before one it ``needs``."""
    return [
        f"lua/{script}.lua includes lib/{library}.lua before {missing}"
        for i, library in enumerate(libraries)
        for missing in needs(library)
        if missing not in libraries[:i]
    ]


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua``, its ``--! include`` lines replaced by the library
    files they name.

    Raises:
        ValueError: a library is included before one it needs (:func:`needs`).
    """
    folder = resources.files("outbox.store").joinpath("lua")
    lines = folder.joinpath(f"{name}.lua").read_text().splitlines(keepends=True)
    included: list[str] = []
    out = []
    for line in lines:
        if not line.startswith(INCLUDE):
            out.append(line)
            continue
        library = line[len(INCLUDE) :].strip()
        included.append(library)
        errors = include_order_errors(name, included, needs)
        if errors:
            raise ValueError(errors[0])
        out.append(folder.joinpath("lib").joinpath(f"{library}.lua").read_text())
    return "".join(out)


@cache
def sha(name: str) -> str:
    """The SHA1 (hex) by which Redis knows ``lua/<name>.lua``."""
    return hashlib.sha1(source(name).encode()).hexdigest()


@cache
def names() -> tuple[str, ...]:
    """The names of every script in ``lua/`` (without ``.lua``), sorted."""
    folder = resources.files("outbox.store").joinpath("lua")
    return tuple(sorted(p.name[: -len(".lua")] for p in folder.iterdir() if p.name.endswith(".lua")))


def named(**values: Any) -> list[Any]:
    """Named inputs of a script, as ``named_args()`` of ``lua/lib/args.lua`` reads them at
    the start of ARGV: their number, then name/value pairs (values as redis-py sends
    them: str, bytes, int or float; the script gets strings).

    Example: ``named(now="1.5", queue="q")`` -> ``[2, "now", "1.5", "queue", "q"]``.
    """
    out: list[Any] = [len(values)]
    for pair in values.items():
        out += pair
    return out


def field_names(names: Sequence[str]) -> str:
    """The names of a repeated group's fields (``row_at`` of ``lua/lib/args.lua``), as one
    comma-separated input."""
    return ",".join(names)
