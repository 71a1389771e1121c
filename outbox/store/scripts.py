"""The Lua scripts of ``lua/``, loaded once per process.

Standalone calls go through redis-py's :class:`redis.commands.core.Script` (EVALSHA,
reloading on NOSCRIPT). Inside a MULTI/EXEC pipeline a NOSCRIPT error would not roll
back the other commands, so there the full source is sent with EVAL instead; Redis
caches the compiled script by its SHA1 either way (Redis docs, "Scripting with Lua").
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files("outbox.store").joinpath("lua", f"{name}.lua").read_text()
