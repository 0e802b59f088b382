"""The default transport: httpx's, over a network backend that can be told to stop.

httpx's timeouts are per socket operation, and a call given up by its waiting
thread (deadline, cancel) leaves the exchange thread blocked in a socket read
until that read's own timeout. This backend reads in slices of at most
`READ_SLICE_SECONDS` and, between slices and before every read, write and
connect, asks the exchange thread's `should_stop` (set with `watching`). A given
up exchange therefore ends within a slice, in every phase (waiting for headers
on a reused connection, an endless stream of `100 Continue`, a dripping body),
and httpcore discards its connection. Only the thread that owns a connection
ever touches its socket.

httpx offers no public way to choose a network backend, so the pool is
replaced after the transport is built (httpx's own `_pool`, built with the same
settings through httpcore's public constructor). If a future httpx moves that
attribute, the transport is used as built: calls still end on time (the
waiting thread enforces the deadline), only a given-up thread may linger until
its socket timeout, which is never longer than the call's limit.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpcore
import httpx

__all__ = [
    "READ_SLICE_SECONDS",
    "SocketOption",
    "StoppingBackend",
    "build_transport",
    "watching",
]

log = logging.getLogger(__name__)

#: How long one socket read may block before the exchange looks at its stop
#: flag again; well inside the "cancelled within ~100-200 ms" promise.
READ_SLICE_SECONDS = 0.1

_local = threading.local()

SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


@contextlib.contextmanager
def watching(should_stop: Callable[[], bool]) -> Iterator[None]:
    """Make this thread's socket operations stop once `should_stop()` is true."""
    previous = getattr(_local, "should_stop", None)
    _local.should_stop = should_stop
    try:
        yield
    finally:
        _local.should_stop = previous


def _stopped() -> bool:
    check: Callable[[], bool] | None = getattr(_local, "should_stop", None)
    return check is not None and check()


class _StoppingStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if _stopped():
                raise httpcore.ReadError("the call was given up")
            piece = READ_SLICE_SECONDS
            if deadline is not None:
                piece = min(piece, deadline - time.monotonic())
                if piece <= 0:
                    raise httpcore.ReadTimeout("timed out")
            try:
                return self._inner.read(max_bytes, piece)
            except httpcore.ReadTimeout:
                # A slice ran out, not the read's own timeout: a timed-out
                # recv leaves the socket (and a TLS session) usable.
                continue

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if _stopped():
            raise httpcore.WriteError("the call was given up")
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _StoppingStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class StoppingBackend(httpcore.NetworkBackend):
    """httpcore's sync backend with streams that honour `watching`."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.NetworkStream:
        if _stopped():
            raise httpcore.ConnectError("the call was given up")
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _StoppingStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, timeout, socket_options)
        return _StoppingStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def build_transport(
    *, limits: httpx.Limits, socket_options: list[SocketOption]
) -> httpx.HTTPTransport:
    """An httpx transport (no retries: a POST may not be idempotent) on `StoppingBackend`."""
    # trust_env=True here only reads SSL_CERT_FILE / SSL_CERT_DIR, which an
    # operator with an internal CA needs; proxies are off at the client.
    ssl_context = httpx.create_ssl_context(trust_env=True)
    transport = httpx.HTTPTransport(
        verify=ssl_context, limits=limits, retries=0, socket_options=socket_options
    )
    if not isinstance(getattr(transport, "_pool", None), httpcore.ConnectionPool):
        log.warning("httpx has changed: service calls run without the stopping backend")
        return transport
    transport._pool = httpcore.ConnectionPool(
        ssl_context=ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        retries=0,
        socket_options=socket_options,
        network_backend=StoppingBackend(),
    )
    return transport
