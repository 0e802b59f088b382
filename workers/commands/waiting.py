"""How `vessel-workers call` and `result` wait: a live status line, and Ctrl-C.

While a call runs and stderr is a terminal, one line on stderr is rewritten
twice a second: `call 3f2a…: queued · 2.4 s`, `running on sandbox-1@host · 5.0 s`
(workers on Redis), `running here · 1.1 s` (the embedded default). It is
erased before the result is printed. Nothing is written when stderr is not a
terminal or with `--json`, so scripts and logs see only the result.

Ctrl-C (SIGINT) while waiting cancels the call (`client.cancel`: a queued call
never starts, a running one has its process tree or request stopped), says so
on stderr and the command exits 130. Further Ctrl-Cs are ignored while the
cancel is sent and the embedded worker stops.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from broker.errors import TransientError
from broker.status import call_state

if TYPE_CHECKING:
    from broker.client import CallHandle
    from broker.result import ToolResult

__all__ = ["STATUS_PERIOD_SECONDS", "Interrupted", "LiveStatus", "state_reader", "wait"]

#: How often the live status line is rewritten: often enough to see a call
#: start, seldom enough to cost Redis nothing (one pipelined read).
STATUS_PERIOD_SECONDS = 0.5
_ERASE = "\r\x1b[K"


class Interrupted(Exception):
    """Ctrl-C while waiting; the message says what became of the call."""

    def __init__(self, call_id: str, what: str) -> None:
        self.call_id = call_id
        super().__init__(f"interrupted: call {call_id} {what}")


def state_reader(handle: CallHandle) -> Callable[[], str]:
    """What the status line says of the call's state, read where the call is."""
    redis = getattr(handle.client.admission, "redis", None)
    if redis is None:  # the embedded default: the call runs in this process
        return lambda: "running here"

    def read() -> str:
        try:
            found = call_state(redis, handle.call_id)
        except Exception:  # a status line must never end the wait
            return "waiting (broker not answering)"
        if found.state == "running":
            return f"running on {found.worker}"
        if found.state == "dispatched":
            return "sent to a worker"
        return found.state

    return read


class LiveStatus:
    """The status line's thread; a context manager that erases the line at its end."""

    def __init__(self, call_id: str, read_state: Callable[[], str], stream: TextIO) -> None:
        self._call_id = call_id
        self._read = read_state
        self._stream = stream
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="vessel-status", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            state = self._read()
            elapsed = time.monotonic() - self._started
            if self._stop.is_set():
                break
            line = f"call {self._call_id[:8]}…: {state} · {elapsed:.1f} s"
            try:
                self._stream.write(_ERASE + line)
                self._stream.flush()
            except (OSError, ValueError):
                return
            self._stop.wait(STATUS_PERIOD_SECONDS)

    def __enter__(self) -> LiveStatus:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        try:
            self._stream.write(_ERASE)
            self._stream.flush()
        except (OSError, ValueError):
            pass


def wait(
    handle: CallHandle, *, timeout: float | None, live: bool, cancel: bool = True
) -> ToolResult:
    """`handle.result(timeout)`, with the live status line when `live` and stderr
    is a terminal; Interrupted on Ctrl-C, after cancelling the call if `cancel`
    (`vessel-workers result` only stops waiting)."""
    show = live and sys.stderr.isatty()
    try:
        if not show:
            return handle.result(timeout=timeout)
        with LiveStatus(handle.call_id, state_reader(handle), sys.stderr):
            return handle.result(timeout=timeout)
    except KeyboardInterrupt:
        # A second Ctrl-C must not cut the cancel short (or print a traceback).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not cancel:
            raise Interrupted(handle.call_id, "goes on (not cancelled)") from None
        try:
            what = "cancelled" if handle.cancel() else "had already finished"
        except TransientError as exc:
            what = f"could not be cancelled ({exc}): cancel it with `vessel-workers cancel`"
        raise Interrupted(handle.call_id, what) from None
