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

    def view(
        self,
        key: tuple[Hashable, ...],
        load: Callable[[], tuple[T, Sequence[str]] | tuple[T, Sequence[str], float]],
        *,
        keep: bool = True,
        read_at: list[float] | None = None,
    ) -> T: ...


_cache: list[Cache] = []


def register(cache: Cache) -> None:
    """Make ``cache`` the one :func:`forget` and :func:`view` use."""
    _cache[:] = [cache]


def forget(names: Iterable[str]) -> None:
    """:meth:`EndpointCache.forget <outbox.destinations.config.EndpointCache.forget>`."""
    for cache in _cache:
        cache.forget(names)


def view(
    key: tuple[Hashable, ...],
    load: Callable[[], tuple[T, Sequence[str]] | tuple[T, Sequence[str], float]],
    *,
    keep: bool = True,
    read_at: list[float] | None = None,
) -> T:
    """:meth:`EndpointCache.view <outbox.destinations.config.EndpointCache.view>`
    (no cache registered: ``load()``'s value, kept nowhere)."""
    if not _cache:
        return load()[0]
    return _cache[0].view(key, load, keep=keep, read_at=read_at)


__all__ = ["Cache", "forget", "register", "view"]
