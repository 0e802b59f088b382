"""Riding out a broker outage: bounded retries, logged once per outage.

A Redis restart, an upgrade or a Sentinel failover makes the broker
unreachable for seconds. Every Redis operation of a worker (admission's
scripts, heartbeats, the sweep, claim and complete) goes through `retry`:
while the error says "unreachable" (`unreachable`), it sleeps with a growing
pause (50 ms doubling to `MAX_PAUSE_SECONDS`) and tries again, until the
*outage* (not the call: the first failure of any thread starts it, the first
success ends it) has lasted `patience` seconds; then it raises
`BrokerUnavailable`. A worker's patience is `VESSEL_BROKER_OUTAGE_SECONDS`
(300 s); a client's `submit` has none (it raises at once: the platform
decides), its `result()` waits up to its own timeout.

`Outage` is the shared state of one process's view of one Redis: it logs one
WARNING when the outage starts and one when it ends, whatever the number of
threads and calls that hit it, and remembers when it ended so a worker can
give held results a moment to land before it sweeps leases
(`workers.worker`).

Which errors are retried, and which are not:

* retried: redis-py's ConnectionError (refused, reset, closed, a Redis still
  loading its data set), TimeoutError, ReadOnlyError (a Sentinel failover: the
  old master became a replica), OSError, kombu's OperationalError;
* not retried: AuthenticationError (a wrong password never heals) and every
  other Redis reply error (a bug or a misconfiguration: retrying hides it).

A command can fail after Redis ran it (Redis was killed before its reply):
retrying runs it again. The worker-side operations tolerate that: heartbeat,
recover and release are idempotent; a second `claim` of one's own call says
`busy` (the call waits for its lease and is dispatched again, once); a second
`complete` finds the done mark set and stores nothing more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from broker.errors import BrokerUnavailable

__all__ = ["MAX_PAUSE_SECONDS", "Outage", "retry", "unreachable"]

_T = TypeVar("_T")

#: The longest pause between two attempts: a worker notices Redis is back
#: within this, so a new call after a restart starts within a second or two.
MAX_PAUSE_SECONDS = 1.0
#: The first pause: a dropped connection in a live Redis reconnects at once.
_FIRST_PAUSE_SECONDS = 0.05


def unreachable(exc: BaseException) -> bool:
    """True if `exc`, or an error it was raised from (Celery's result backend
    wraps them), says the broker cannot be reached now (module docstring)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, BrokerUnavailable) or _unreachable_here(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _unreachable_here(exc: BaseException) -> bool:
    import redis  # noqa: PLC0415 (the embedded default never loads redis-py)

    if isinstance(exc, redis.AuthenticationError):
        return False
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError):
        return True
    try:
        from kombu.exceptions import OperationalError  # noqa: PLC0415
    except ImportError:  # pragma: no cover (kombu is a dependency)
        return isinstance(exc, OSError)
    return isinstance(exc, OSError | OperationalError)


class Outage:
    """When `what` (e.g. "broker Redis redis://…") became unreachable, shared by threads."""

    def __init__(self, what: str, *, logger: logging.Logger | None = None) -> None:
        self.what = what
        self._log = logger or logging.getLogger(__name__)
        self._lock = threading.Lock()
        self._since: float | None = None
        self._ended: float | None = None
        #: How many outages ended so far (a worker acts once after each).
        self.recoveries = 0

    def failed(self, exc: BaseException) -> float:
        """Note a failure; returns how long the outage has lasted (0 for the first)."""
        now = time.monotonic()
        with self._lock:
            if self._since is None:
                self._since = now
                first = True
            else:
                first = False
            since = self._since
        if first:
            self._log.warning("%s is unreachable (%s): retrying", self.what, _one_line(exc))
        return now - since

    def succeeded(self) -> None:
        """Note a success: the outage, if any, is over."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            since: float | None = self._since
            self._since = None
            self._ended = time.monotonic()
            if since is not None:
                self.recoveries += 1
        if since is None:
            return
        self._log.warning("%s is reachable again after %.1f s", self.what, time.monotonic() - since)

    def down_for(self) -> float | None:
        """Seconds since the outage began, or None while the broker answers."""
        since = self._since
        return None if since is None else time.monotonic() - since

    def since_recovery(self) -> float | None:
        """Seconds since the last outage ended, or None if there was none."""
        ended = self._ended
        return None if ended is None else time.monotonic() - ended


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def retry(
    outage: Outage,
    operation: Callable[[], _T],
    *,
    patience: float,
    deadline: float | None = None,
) -> _T:
    """`operation()`, tried again while the broker is unreachable (module docstring).

    Raises BrokerUnavailable once the outage has lasted `patience` seconds (0:
    at the first failure) or at `deadline` (a `time.monotonic()` value);
    any other error is raised as it is.
    """
    pause = _FIRST_PAUSE_SECONDS
    while True:
        try:
            value = operation()
        except Exception as exc:
            if not unreachable(exc):
                raise
            lasted = outage.failed(exc)
            left = patience - lasted
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
            if left <= 0:
                raise BrokerUnavailable(
                    f"{outage.what} is unreachable ({_one_line(exc)})"
                    + (f" for {lasted:.0f} s" if lasted >= 1 else "")
                ) from exc
            time.sleep(min(pause, left))
            pause = min(pause * 2, MAX_PAUSE_SECONDS)
            continue
        outage.succeeded()
        return value
