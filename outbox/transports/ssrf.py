"""The webhook transport's network layer: an httpcore network backend that

* refuses private networks (server-side request forgery): every connection resolves
  its host name itself and checks **each** address before connecting (so a DNS answer
  cannot point a public-looking name at ``169.254.169.254``, and a later answer cannot
  rebind it: the socket connects to the address that was checked, while TLS still
  verifies the URL's host name). Refused: loopback, private (RFC 1918, ULA ``fc00::/7``),
  link-local (``169.254.0.0/16`` with the cloud metadata address, ``fe80::/10``), shared
  address space (``100.64.0.0/10``), unspecified, multicast, reserved and documentation
  ranges, IPv4-mapped or NAT64 forms of those, i.e. every address that is not
  ``ipaddress``' ``is_global``. Svix refuses the same by default.
* enforces an attempt's hard **deadline**: name resolution (in a helper thread), every
  connect, TLS handshake, read and write gets at most the time left before the deadline
  as its timeout, so a receiver dripping one byte at a time cannot hold an attempt past
  it (httpx's own timeouts are per operation, not per request).

:class:`GuardedTransport` is an ``httpx.HTTPTransport`` whose connection pool uses the
backend. Use :meth:`GuardedTransport.deadline` around a request.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypedDict
from urllib.parse import urlsplit

import httpcore
import httpx

from outbox.exceptions import DeliveryError, OutboxError
from outbox.transports.deadlines import call_with_deadline


class PrivateAddressRefused(OutboxError):
    """A webhook's host resolved only to addresses the SSRF guard refuses.

    Raised from the connection attempt; the webhook transport turns it into a permanent
    :class:`~outbox.exceptions.DeliveryError`.

    Attributes:
        host: the host name of the URL.
        addresses: the refused addresses it resolved to.
    """

    def __init__(self, host: str, addresses: list[str]) -> None:
        super().__init__(
            f"refused to connect to {host!r}: it resolves to {', '.join(addresses) or 'no address'}, "
            "a loopback, private, link-local or otherwise non-public address (OUTBOX['BLOCK_PRIVATE_NETWORKS'])"
        )
        self.host = host
        self.addresses = addresses


def is_public_address(address: str) -> bool:
    """True if ``address`` (an IPv4 or IPv6 literal) is globally routable.

    IPv4-mapped (``::ffff:a.b.c.d``), 6to4 and NAT64 (``64:ff9b::/96``) addresses are
    judged by the IPv4 address they carry.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in ipaddress.ip_network("64:ff9b::/96"):
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            ip = embedded
    return ip.is_global and not ip.is_multicast


def resolve(host: str, port: int, timeout: float | None = None) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in resolver order.

    An IP literal is returned as is. A name is resolved in a helper thread waited for at
    most ``timeout`` seconds (``getaddrinfo`` itself cannot be interrupted).

    Raises:
        httpcore.ConnectError: the name does not resolve.
        httpcore.ConnectTimeout: it did not resolve within ``timeout``.
    """
    try:
        return [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        pass

    def lookup() -> list[Any]:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)

    try:
        infos = lookup() if timeout is None else call_with_deadline(lookup, timeout, f"resolving {host!r}")
    except DeliveryError as exc:
        raise httpcore.ConnectTimeout(f"resolving {host!r} took longer than {timeout:g}s") from exc
    except (OSError, UnicodeError) as exc:
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _Deadline(threading.local):
    at: float | None = None


class DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation ends by the backend's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, backend: GuardedBackend) -> None:
        self._stream = stream
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._backend.remaining(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._backend.remaining(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> Any:
        timeout = self._backend.remaining(timeout, httpcore.ConnectTimeout)
        return DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, timeout), self._backend)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore's sync backend with the address check and the deadline (module docstring).

    Args:
        block_private: refuse non-public addresses.
    """

    def __init__(self, *, block_private: bool) -> None:
        self.block_private = block_private
        self._inner = httpcore.SyncBackend()
        self._deadline = _Deadline()

    def remaining(self, timeout: float | None, error: type[Exception]) -> float | None:
        """The socket timeout to use: ``timeout`` shortened to the time left.

        Raises:
            error: the deadline has passed.
        """
        at = self._deadline.at
        if at is None:
            return timeout
        left = at - time.monotonic()
        if left <= 0:
            raise error("the attempt's deadline passed")
        return left if timeout is None else min(timeout, left)

    @contextmanager
    def deadline(self, seconds: float | None) -> Iterator[None]:
        """Within the block, this thread's network operations end ``seconds`` from now."""
        previous = self._deadline.at
        self._deadline.at = None if seconds is None else time.monotonic() + seconds
        try:
            yield
        finally:
            self._deadline.at = previous

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = self.remaining(timeout, httpcore.ConnectTimeout)
        if not self.block_private:
            return DeadlineStream(
                self._inner.connect_tcp(host, port, timeout, local_address, socket_options), self
            )
        addresses = resolve(host, port)
        allowed = [a for a in addresses if is_public_address(a)]
        if not allowed:
            raise PrivateAddressRefused(host, addresses)
        error: Exception | None = None
        for address in allowed:  # connect to the checked address itself, never the name again
            try:
                stream = self._inner.connect_tcp(
                    address,
                    port,
                    self.remaining(timeout, httpcore.ConnectTimeout),
                    local_address,
                    socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
                continue
            return DeadlineStream(stream, self)
        assert error is not None
        raise error

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        raise httpcore.ConnectError("the outbox does not deliver webhooks over Unix sockets")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``,
    minus ``NO_PROXY``; the standard library's reading of them), or None."""

    proxies = urllib.request.getproxies_environment()
    parts = urlsplit(url)
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    # proxy_bypass_environment: in urllib.request since Python 3.x but not in typeshed's stubs.
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxy or bypass(parts.hostname or "", proxies):
        return None
    return proxy


class _HandedConnectionsKept:
    """httpcore's connection pool (mixed in before it), whose assignment pass never
    closes a connection it has handed to a request that is still using it.

    httpcore 1.0.9 hands an idle connection to a waiting request, and the request starts
    on it only when its thread wakes; a pass made meanwhile by another thread (a response
    closed, a request added) still sees the connection idle, and closes it when it finds
    it expired (``keepalive_expiry``) or surplus (``max_keepalive_connections``). The close
    runs after the pass, by when the request may have been sent: its read then fails
    ("Bad file descriptor") after the receiver accepted it, and the retry delivers it a
    second time (encode/httpcore#1110; a fix proposed upstream, #1111, not released).

    Here every connection held by a request of the pool (handed to it, or in use) is kept
    out of each pass and put back after it, under the pool's lock: the pass neither closes
    it nor hands it to a second request. It is cleaned up by the first pass after its
    request is done (expired: closed then). Those connections do not count toward
    ``max_connections`` during a pass, so the pool may open up to that many more than its
    cap while they are held (a worker's attempts in flight bound it). With an httpcore
    whose pool lacks the two lists this reads, the pass is httpcore's own.
    """

    _connections: list[Any]
    _requests: list[Any]

    def _assign_requests_to_connections(self) -> list[Any]:
        pass_of_httpcore = super()._assign_requests_to_connections  # type: ignore[misc]
        connections = getattr(self, "_connections", None)
        requests = getattr(self, "_requests", None)
        if not isinstance(connections, list) or not isinstance(requests, list):
            return pass_of_httpcore()  # type: ignore[no-any-return]
        held = {id(c): c for c in (getattr(r, "connection", None) for r in requests) if c is not None}
        if not held:
            return pass_of_httpcore()  # type: ignore[no-any-return]
        kept = [c for c in connections if id(c) in held]
        connections[:] = [c for c in connections if id(c) not in held]
        try:
            return pass_of_httpcore()  # type: ignore[no-any-return]
        finally:
            connections.extend(kept)


class _ConnectionPool(_HandedConnectionsKept, httpcore.ConnectionPool):
    """``httpcore.ConnectionPool`` with :class:`_HandedConnectionsKept`'s pass."""


class _ProxyPool(_HandedConnectionsKept, httpcore.HTTPProxy):
    """``httpcore.HTTPProxy`` with :class:`_HandedConnectionsKept`'s pass."""


class _PoolOptions(TypedDict):
    """The arguments :class:`GuardedTransport` gives both httpcore pools (direct and proxied)."""

    ssl_context: ssl.SSLContext
    max_connections: int | None
    max_keepalive_connections: int | None
    keepalive_expiry: float | None
    http1: bool
    http2: bool
    network_backend: httpcore.NetworkBackend


class GuardedTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` over a :class:`GuardedBackend`, directly or through an
    HTTP(S) proxy (then the backend connects to the proxy, which the operator chose, so
    its address is not checked; the proxy connects to the receiver).

    Args:
        verify: as httpx takes it (bool or SSL context).
        block_private: refuse non-public addresses (direct connections).
        proxy: an ``http://`` or ``https://`` proxy URL, or None.
        limits: the connection pool's limits.

    Raises:
        ValueError: a proxy of another scheme (SOCKS is not supported).
    """

    def __init__(
        self,
        *,
        verify: Any,
        block_private: bool,
        proxy: str | None = None,
        limits: httpx.Limits | None = None,
    ) -> None:
        limits = limits or httpx.Limits()
        super().__init__(verify=verify, trust_env=False, limits=limits)
        self.backend = GuardedBackend(block_private=block_private and proxy is None)
        # httpx.HTTPTransport builds its pool without a network_backend argument; build
        # the same pool with ours (httpcore's public API).
        common: _PoolOptions = {
            "ssl_context": httpx.create_ssl_context(verify=verify, trust_env=False),
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry,
            "http1": True,
            "http2": False,
            "network_backend": self.backend,
        }
        if proxy is None:
            self._pool = _ConnectionPool(**common)
            return
        parsed = httpx.Proxy(url=proxy)
        if parsed.url.scheme not in ("http", "https"):
            raise ValueError(f"only http:// and https:// proxies are supported, not {parsed.url.scheme}://")
        self._pool = _ProxyPool(
            proxy_url=httpcore.URL(
                scheme=parsed.url.raw_scheme,
                host=parsed.url.raw_host,
                port=parsed.url.port,
                target=parsed.url.raw_path,
            ),
            proxy_auth=parsed.raw_auth,
            proxy_headers=parsed.headers.raw,
            proxy_ssl_context=parsed.ssl_context,
            **common,
        )

    def deadline(self, seconds: float | None) -> Any:
        """Context manager: the block's network operations end ``seconds`` from now."""
        return self.backend.deadline(seconds)
