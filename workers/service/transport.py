"""The default transport: httpx's, over a network backend that obeys a whole-call limit.

httpx's timeouts are per socket operation (one connect, one read): a server
that drips a byte every 0.2 s never trips a 1 s read timeout, and a call given
up (deadline, cancel) would stay blocked in a socket operation until that
operation's own timeout. Seed 001's limit is on the whole call, so this
backend lets the thread that runs an exchange set a `Watch` (`watching`): a
stop flag (the call's cancel) and the call's deadline, and every socket
operation honours both:

* reads wait in slices of at most `SLICE_SECONDS`, looking at the flag
  between slices, and end at the deadline (`ReadTimeout`);
* writes send in slices the same way, so a server that never reads a large
  request holds the call no longer than a slice past its cancel;
* connecting (name lookup and TCP connect) and the TLS handshake cannot be
  sliced, so they run on a short-lived helper thread while the calling thread
  waits in slices; a given-up helper closes what it made when it finishes.
  Only new connections pay for that thread: keep-alive connections are reused.

So an exchange runs on the calling thread (`workers.service.exchange`), and
ends within a slice of its deadline or cancel in every phase (waiting for
headers on a reused connection, an endless stream of `100 Continue`, a
dripping body, a request nobody reads, a connect nobody answers); httpcore then
discards its connection. Only the thread that owns a connection ever touches
its socket.

httpx offers no public way to choose a network backend, so the pool is
replaced after the transport is built (httpx's own `_pool`, built with the same
settings through httpcore's public constructor). If a future httpx moves that
attribute, the transport is used as built and `stops_by_itself` says False:
the exchange then runs on a thread of its own while the calling thread keeps
the limit (`workers.service.exchange`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

__all__ = [
    "SLICE_SECONDS",
    "SocketOption",
    "StoppingBackend",
    "Watch",
    "build_transport",
    "stops_by_itself",
    "watching",
]

log = logging.getLogger(__name__)

#: How long one socket wait may block before the exchange looks at its stop
#: flag again; well inside the "cancelled within ~100-200 ms" promise. A read
#: or write that can proceed returns at once: the slice only bounds idle waits.
SLICE_SECONDS = 0.1
#: How often a thread waiting for a connect or TLS handshake on the helper
#: thread looks at its flag and deadline.
_HELPER_POLL_SECONDS = 0.05

_local = threading.local()
#: Transports `build_transport` fitted with the stopping backend.
_STOPPING: weakref.WeakSet[httpx.BaseTransport] = weakref.WeakSet()

SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


@dataclass(frozen=True, slots=True)
class Watch:
    """What a thread's socket operations obey: a stop flag and a deadline (time.monotonic)."""

    should_stop: Callable[[], bool]
    deadline: float | None = None

    def end_of(self, timeout: float | None) -> float | None:
        """The earlier of the deadline and `timeout` seconds from now (None: no end)."""
        if timeout is None:
            return self.deadline
        end = time.monotonic() + timeout
        return end if self.deadline is None else min(end, self.deadline)


@contextlib.contextmanager
def watching(should_stop: Callable[[], bool], deadline: float | None = None) -> Iterator[None]:
    """Make this thread's socket operations stop once `should_stop()` is true or at `deadline`."""
    previous = getattr(_local, "watch", None)
    _local.watch = Watch(should_stop, deadline)
    try:
        yield
    finally:
        _local.watch = previous


def _never() -> bool:
    return False


#: Socket reads outside `watching` still read in slices, to their own timeout only.
_UNWATCHED = Watch(_never)


def _watch() -> Watch | None:
    watch: Watch | None = getattr(_local, "watch", None)
    return watch


def _slice(end: float | None, timeout_error: type[Exception]) -> float:
    """The next wait: a slice, cut at `end`; raises `timeout_error` once `end` has passed."""
    if end is None:
        return SLICE_SECONDS
    left = end - time.monotonic()
    if left <= 0:
        raise timeout_error("timed out")
    return min(SLICE_SECONDS, left)


def _on_helper(
    action: Callable[[], httpcore.NetworkStream],
    watch: Watch,
    end: float | None,
    timeout_error: type[Exception],
    stop_error: type[Exception],
) -> httpcore.NetworkStream:
    """Run `action` on a helper thread; wait for it while the watch allows.

    A given-up helper closes the stream it makes when it finishes; nothing else
    ever sees that stream.
    """
    lock = threading.Lock()
    done = threading.Event()
    outcome: list[tuple[httpcore.NetworkStream | None, BaseException | None]] = []
    abandoned = False

    def run() -> None:
        try:
            made: tuple[httpcore.NetworkStream | None, BaseException | None] = (action(), None)
        except BaseException as exc:  # handed to the waiting thread, or dropped if it left
            made = (None, exc)
        with lock:
            if not abandoned:
                outcome.append(made)
                done.set()
                return
        if made[0] is not None:
            with contextlib.suppress(Exception):
                made[0].close()

    threading.Thread(target=run, name="vessel-service-connect", daemon=True).start()
    while not done.wait(_HELPER_POLL_SECONDS):
        stopped = watch.should_stop()
        if stopped or (end is not None and time.monotonic() >= end):
            with lock:
                if not outcome:
                    abandoned = True
                    raise (stop_error if stopped else timeout_error)("the call was given up")
            break
    stream, error = outcome[0]
    if stream is None:  # `run` hands over a stream or the error that stopped it
        raise error or RuntimeError("the connecting thread made no stream")
    return stream


class _StoppingStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        watch = _watch() or _UNWATCHED
        end = watch.end_of(timeout)
        while True:
            if watch.should_stop():
                raise httpcore.ReadError("the call was given up")
            wait = _slice(end, httpcore.ReadTimeout)  # raises at the end: not caught below
            try:
                return self._inner.read(max_bytes, wait)
            except httpcore.ReadTimeout:
                # A slice ran out, not the read's own time: a timed-out recv
                # leaves the socket (and a TLS session) usable.
                continue

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        watch = _watch()
        if watch is None:
            self._inner.write(buffer, timeout)
            return
        sock = self._inner.get_extra_info("socket")
        if not isinstance(sock, socket.socket):  # not httpcore's SyncStream: one bounded write
            if watch.should_stop():
                raise httpcore.WriteError("the call was given up")
            self._inner.write(buffer, _slice(watch.end_of(timeout), httpcore.WriteTimeout))
            return
        end = watch.end_of(timeout)
        view = memoryview(buffer)
        while view:
            if watch.should_stop():
                raise httpcore.WriteError("the call was given up")
            sock.settimeout(_slice(end, httpcore.WriteTimeout))
            try:
                sent = sock.send(view)
            except TimeoutError:
                # Nothing was sent in this slice (a TLS socket wants the same
                # buffer again, which the next turn gives it).
                continue
            except OSError as exc:
                raise httpcore.WriteError(exc) from exc
            view = view[sent:]

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        watch = _watch()
        if watch is None:
            return _StoppingStream(self._inner.start_tls(ssl_context, server_hostname, timeout))
        end = watch.end_of(timeout)
        inner = _on_helper(
            lambda: self._inner.start_tls(ssl_context, server_hostname, _time_left(end, timeout)),
            watch,
            end,
            httpcore.ConnectTimeout,
            httpcore.ConnectError,
        )
        return _StoppingStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def _time_left(end: float | None, timeout: float | None) -> float | None:
    """The whole time left until `end` (a helper's own timeout), or `timeout` without one."""
    if end is None:
        return timeout
    return max(end - time.monotonic(), 0.001)


class StoppingBackend(httpcore.NetworkBackend):
    """httpcore's sync backend with streams and connects that honour `watching`."""

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
        watch = _watch()
        if watch is None:
            stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
            return _StoppingStream(stream)
        if watch.should_stop():
            raise httpcore.ConnectError("the call was given up")
        end = watch.end_of(timeout)
        # The name lookup has no timeout of its own and the connect blocks in
        # one system call: both run on the helper.
        stream = _on_helper(
            lambda: self._inner.connect_tcp(
                host, port, _time_left(end, timeout), local_address, socket_options
            ),
            watch,
            end,
            httpcore.ConnectTimeout,
            httpcore.ConnectError,
        )
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


def stops_by_itself(transport: httpx.BaseTransport) -> bool:
    """True if `transport` is `build_transport`'s with the stopping backend in place."""
    return transport in _STOPPING


def build_transport(
    *, limits: httpx.Limits, socket_options: list[SocketOption]
) -> httpx.HTTPTransport:
    """An httpx transport (no retries: a POST may not be idempotent) on `StoppingBackend`.

    If httpx has changed and the backend cannot be put in place, the transport
    is returned as built and `stops_by_itself(transport)` is False.
    """
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
    _STOPPING.add(transport)
    return transport
