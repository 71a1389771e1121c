"""Old module paths kept for one release after the 0.2 floor plan moved them.

Each old module (``outbox.health``, ``outbox.worker``, ...) is a three-line shim whose
``__getattr__`` comes from :func:`forward`: an attribute read from the old path warns
with a :class:`DeprecationWarning` naming the new path, then returns the new module's
attribute. The shims go in 0.3.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def forward(old: str, *new: str, renamed: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for the shim at ``old`` that reads each name
    from the first of the modules ``new`` that has it (a module split in two names both);
    ``renamed`` maps a name that changed to its new dotted path.

    Raises (from the returned function):
        AttributeError: none of ``new`` has the attribute.
    """

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if renamed and name in renamed:
            path, _, attribute = renamed[name].rpartition(".")
        else:
            path = next((p for p in new if hasattr(importlib.import_module(p), name)), "")
            attribute = name
        if not path:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {path}.{attribute} in django-redis-outbox 0.2; the old path goes in 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(path), attribute)

    return __getattr__
