"""The process's versioned cache of endpoint configurations as :mod:`outbox.destinations.
endpoints` reaches it (without importing :mod:`outbox.destinations.config`, which imports
it): :mod:`~outbox.destinations.config` registers its
:class:`~outbox.destinations.config.EndpointCache` here when it is imported."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Cache(Protocol):
    def forget(self, names: Iterable[str]) -> None: ...

    def view(self, key: Hashable, load: Callable[[], tuple[T, Sequence[str]]], *, keep: bool = True) -> T: ...


_cache: list[Cache] = []


def register(cache: Cache) -> None:
    """Make ``cache`` the one :func:`forget` and :func:`view` use."""
    _cache[:] = [cache]


def forget(names: Iterable[str]) -> None:
    """:meth:`EndpointCache.forget <outbox.destinations.config.EndpointCache.forget>`."""
    for cache in _cache:
        cache.forget(names)


def view(key: Hashable, load: Callable[[], tuple[T, Sequence[str]]], *, keep: bool = True) -> T:
    """:meth:`EndpointCache.view <outbox.destinations.config.EndpointCache.view>`
    (no cache registered: ``load()``'s value, kept nowhere)."""
    if not _cache:
        return load()[0]
    return _cache[0].view(key, load, keep=keep)


__all__ = ["Cache", "forget", "register", "view"]
