"""One HTTP exchange under a whole-call deadline and a cancel flag.

httpx's timeouts are per operation (one connect, one read): a server that
drips a byte every 0.2 s never trips a 1 s read timeout. Seed 001's limit is on
the whole call, and a cancel must end a call within ~100-200 ms, in whatever
phase it is (DNS, connect, waiting for headers, reading a dripping body).

With the default transport (`transport.py`, `stops_by_itself`) the exchange
runs on the calling thread: every socket operation obeys the call's deadline
and cancel flag (`watching`), and connects run on a helper thread. That keeps
a service call to one thread, with no hand-over between threads (measured
here: 0.30 ms of CPU per local call against 0.50 ms with a thread per
exchange; at volume a service worker is bound by the CPU one call costs it).

With any other transport (an injected one, or httpx changed under us) the
socket operations cannot be told to stop, so the exchange runs on a
short-lived thread of its own while the calling thread waits for it, for at
most the time left, looking at the cancel flag every `CANCEL_POLL_SECONDS`.
A lock orders "finished" against "given up", so a result is either returned by
the waiting thread or dropped, never both; the given-up thread is told to stop
and checks between body chunks.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from workers.service.reading import (
    BodyTooLarge,
    ReadStopped,
    declared_length,
    decode_content,
    read_limited,
)
from workers.service.transport import watching

__all__ = ["CANCEL_POLL_SECONDS", "Exchange", "Failure", "reads_body", "run_exchange"]

log = logging.getLogger(__name__)

#: How often a waiting call (threaded path) looks at its cancel flag: the
#: promise is "cancelled within ~100-200 ms", so half of the low end.
CANCEL_POLL_SECONDS = 0.05


class Failure(enum.Enum):
    """Why an exchange produced no body to show."""

    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    UNREACHABLE = "unreachable"
    TOO_LARGE = "too large"


@dataclass(frozen=True, slots=True)
class Exchange:
    """What came back: a status (None when no status line arrived), and either a
    body (2xx and 4xx, decoded from any content coding), no body (any other
    status: not read), or a failure."""

    status: int | None = None
    body: bytes | None = None
    failure: Failure | None = None


def reads_body(status: int) -> bool:
    """Seed 001 shows the body of a 2xx or 4xx only; other bodies are never read."""
    return 200 <= status < 300 or 400 <= status < 500


class _Progress:
    """What the exchange has seen so far, and whether it should stop."""

    __slots__ = ("status", "stop")

    def __init__(self, stop: Callable[[], bool]) -> None:
        self.stop = stop
        #: The status line, as soon as it arrived (reported by a call given up later).
        self.status: int | None = None


def _read(response: httpx.Response, progress: _Progress, limit: int) -> Exchange:
    status = response.status_code
    progress.status = status
    if not reads_body(status):
        return Exchange(status=status)
    length = declared_length(response.headers)
    if length is not None and length > limit:
        return Exchange(status=status, failure=Failure.TOO_LARGE)
    try:
        raw = read_limited(response.iter_raw(), limit=limit, stop=progress.stop)
        body = decode_content(raw, response.headers.get("content-encoding"), limit=limit)
    except BodyTooLarge:
        return Exchange(status=status, failure=Failure.TOO_LARGE)
    except (ReadStopped, httpx.TimeoutException):
        return Exchange(status=status, failure=Failure.TIMEOUT)
    except httpx.HTTPError:
        # Closed or reset mid-body, or a broken chunked encoding: see texts.py.
        return Exchange(status=status, failure=Failure.UNREACHABLE)
    return Exchange(status=status, body=body)


def _exchange(
    client: httpx.Client, request: httpx.Request, progress: _Progress, limit: int
) -> Exchange:
    try:
        try:
            response = client.send(request, stream=True)
        except httpx.TimeoutException:
            return Exchange(failure=Failure.TIMEOUT)
        except httpx.HTTPError:
            # Refused, reset, DNS failure, not HTTP at all: no answer to show.
            return Exchange(failure=Failure.UNREACHABLE)
        try:
            return _read(response, progress, limit)
        finally:
            # Closes the connection unless the body was read to its end.
            response.close()
    except Exception as exc:  # nothing the server does may escape as an exception
        # The type only: a message could quote the response, and with it a secret.
        log.error("service exchange failed inside the worker: %s", type(exc).__name__)
        return Exchange(status=progress.status, failure=Failure.UNREACHABLE)


def run_exchange(
    client: httpx.Client,
    request: httpx.Request,
    *,
    deadline: float,
    cancel: threading.Event | None,
    limit: int,
    inline: bool,
    name: str = "vessel-service-call",
) -> Exchange:
    """Send `request` and read its answer, giving up at `deadline` (time.monotonic)
    or as soon as `cancel` is set. Never raises for anything the server does.

    `inline`: the client's transport obeys `watching` (`stops_by_itself`), so
    the exchange runs on this thread; otherwise on a thread of its own.
    """
    if inline:
        return _run_inline(client, request, deadline=deadline, cancel=cancel, limit=limit)
    return _run_on_thread(client, request, deadline=deadline, cancel=cancel, limit=limit, name=name)


def _run_inline(
    client: httpx.Client,
    request: httpx.Request,
    *,
    deadline: float,
    cancel: threading.Event | None,
    limit: int,
) -> Exchange:
    def cancelled() -> bool:
        return cancel is not None and cancel.is_set()

    def ended() -> bool:
        return cancelled() or time.monotonic() >= deadline

    progress = _Progress(ended)
    with watching(cancelled, deadline):
        result = _exchange(client, request, progress, limit)
    if result.failure is None or result.failure is Failure.TOO_LARGE:
        return result  # a whole answer (or a refused one) wins over a late cancel
    # The transport reports a given-up call as a read, write or connect error,
    # or a timeout: say which it was.
    if cancelled():
        return Exchange(status=result.status, failure=Failure.CANCELLED)
    if time.monotonic() >= deadline:
        return Exchange(status=result.status, failure=Failure.TIMEOUT)
    return result


class _Call:
    """The state shared by the waiting thread and the exchange thread (threaded path)."""

    __slots__ = ("_aborted", "_lock", "_result", "done", "progress")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborted = False
        self._result: Exchange | None = None
        self.done = threading.Event()
        self.progress = _Progress(self.aborted)

    def aborted(self) -> bool:
        return self._aborted

    def finished(self) -> Exchange:
        """The result of a call that finished (`done` set, or `abort` returned False)."""
        result = self._result
        if result is None:
            raise RuntimeError("the exchange has no result yet")
        return result

    def finish(self, result: Exchange) -> None:
        """Record the result unless the call was given up; idempotent."""
        with self._lock:
            if self._aborted or self._result is not None:
                return
            self._result = result
            self.done.set()

    def abort(self) -> bool:
        """Give the call up; False when it had already finished (use its result)."""
        with self._lock:
            if self._result is not None:
                return False
            self._aborted = True
            return True


def _run(client: httpx.Client, request: httpx.Request, call: _Call, limit: int) -> None:
    with watching(call.aborted):
        result = _exchange(client, request, call.progress, limit)
    call.finish(result)


def _run_on_thread(
    client: httpx.Client,
    request: httpx.Request,
    *,
    deadline: float,
    cancel: threading.Event | None,
    limit: int,
    name: str,
) -> Exchange:
    call = _Call()
    thread = threading.Thread(target=_run, args=(client, request, call, limit), name=name)
    # Daemon: a thread stuck in a connect or DNS lookup must not hold up exit.
    thread.daemon = True
    thread.start()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return _give_up(call, Failure.TIMEOUT)
        wait = left if cancel is None else min(left, CANCEL_POLL_SECONDS)
        if call.done.wait(wait):
            return call.finished()
        if cancel is not None and cancel.is_set():
            return _give_up(call, Failure.CANCELLED)


def _give_up(call: _Call, why: Failure) -> Exchange:
    if call.abort():
        return Exchange(status=call.progress.status, failure=why)
    return call.finished()
