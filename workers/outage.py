"""A worker and an unreachable broker: waiting at start, riding out an outage, the exit.

* **At start** (`wait_for_broker`): a worker started before its Redis pings it,
  one log line per attempt, for up to `VESSEL_BROKER_OUTAGE_SECONDS`; then it
  refuses to start (exit 2) with one line naming the URL (password hidden) and
  what to check. A wrong password or database never heals: refused at once.
* **During an outage**: every admission operation retries (`broker.retrying`,
  one warning when the outage starts, one when it ends); Celery's consumer
  reconnects by itself, here with a pause of at most `MAX_PAUSE_SECONDS` between
  attempts (Celery's own grows to 30 s, which would leave a worker idle for up
  to half a minute after Redis is back) and without a limit on attempts
  (`broker_connection_max_retries=None`): the outage limit is ours.
* **The exit** (`OutageExit`): when an outage outlasts the limit, the
  housekeeper asks Celery to stop (`state.should_stop`, which Celery checks
  between polls and between reconnect attempts); `run_worker` then returns
  `EXIT_BROKER_LOST` after printing one line.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from broker.errors import BrokerUnavailable, ConfigError
from broker.retrying import MAX_PAUSE_SECONDS, Outage

if TYPE_CHECKING:
    import redis

__all__ = ["EXIT_BROKER_LOST", "OutageExit", "consumer_class", "wait_for_broker"]

_log = logging.getLogger(__name__)

#: The exit status of a worker whose broker stayed unreachable past the limit
#: (Celery's own failure status; 2 is for a worker that refused to start).
EXIT_BROKER_LOST = 1
#: The longest pause between two start-up attempts: one log line each.
_START_PAUSE_MAX_SECONDS = 2.0
#: After the outage limit, how long Celery's warm shutdown may take before
#: the process ends anyway: with the broker gone, kombu's closing of its
#: channels retries every Redis command it still has to send (redis-py's
#: backoff, several seconds each), which can go on for minutes.
_EXIT_GRACE_SECONDS = 10.0

_CHECK = (
    "check that Redis runs there and that VESSEL_BROKER_URL names it "
    "(host, port, password, database, TLS)"
)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def wait_for_broker(client: redis.Redis[Any], what: str, limit_seconds: float) -> None:
    """Ping `client` until it answers; ConfigError or BrokerUnavailable (one line) if never."""
    import redis  # noqa: PLC0415 (the embedded default never needs redis-py)

    started = time.monotonic()
    attempt = 0
    pause = 0.25
    while True:
        attempt += 1
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            raise ConfigError(
                f"the {what} refused the credentials ({_one_line(exc)}): check the password "
                "(and user) in VESSEL_BROKER_URL"
            ) from None
        except redis.ResponseError as exc:
            raise ConfigError(
                f"the {what} refused the connection ({_one_line(exc)}): {_CHECK}"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            waited = time.monotonic() - started
            if waited >= limit_seconds:
                raise BrokerUnavailable(
                    f"cannot reach the {what} after {waited:.0f} s ({_one_line(exc)}): {_CHECK}; "
                    f"VESSEL_BROKER_OUTAGE_SECONDS={limit_seconds:g} is how long a worker waits"
                ) from None
            wait = min(pause, limit_seconds - waited)
            _log.warning(
                "waiting for the %s (%s): attempt %d, next in %.1f s, giving up after %g s",
                what,
                _one_line(exc),
                attempt,
                wait,
                limit_seconds,
            )
            time.sleep(max(wait, 0.0))
            pause = min(pause * 2, _START_PAUSE_MAX_SECONDS)
            continue
        if attempt > 1:
            _log.warning("the %s answers after %.1f s", what, time.monotonic() - started)
        return


class OutageExit:
    """The reason a worker stops for an outage, set once by whichever thread sees it."""

    def __init__(self, prefix: str = "vessel-workers worker") -> None:
        self._lock = threading.Lock()
        self.reason: str | None = None
        self.prefix = prefix
        self._reported = False

    def stop(self, error: BaseException, limit_seconds: float) -> None:
        """Ask Celery to stop (warm: running calls end) because the broker stayed away."""
        from celery.worker import state  # noqa: PLC0415

        with self._lock:
            if self.reason is not None:
                return
            self.reason = (
                f"{error}; VESSEL_BROKER_OUTAGE_SECONDS={limit_seconds:g} reached: stopping "
                "(calls this worker held are dispatched again once Redis is back)"
            )
        _log.critical("%s", self.reason)
        state.should_stop = EXIT_BROKER_LOST
        threading.Thread(target=self._end_anyway, name="vessel-outage-exit", daemon=True).start()

    def _end_anyway(self) -> None:
        time.sleep(_EXIT_GRACE_SECONDS)
        self.report()
        os._exit(EXIT_BROKER_LOST)  # see _EXIT_GRACE_SECONDS

    def report(self) -> None:
        with self._lock:
            reason = None if self._reported else self.reason
            self._reported = True  # printed once
        if reason is not None:
            # The real stderr: Celery redirects sys.stderr into its log.
            stream = sys.__stderr__ or sys.stderr
            print(f"{self.prefix}: {reason}", file=stream, flush=True)


def consumer_class(outage: Outage) -> type:
    """Celery's Consumer, reconnecting every second at most and logging through `outage`."""
    from celery.worker.consumer import Consumer  # noqa: PLC0415

    class VesselConsumer(Consumer):  # type: ignore[misc]
        def ensure_connected(self, conn: Any) -> Any:
            ensure = conn.ensure_connection

            def quick(errback: Any = None, max_retries: Any = None, **options: Any) -> Any:
                def note(exc: BaseException, interval: float) -> None:
                    outage.failed(exc)  # one warning per outage, not one per attempt

                options.update(
                    interval_start=0.1, interval_step=0.3, interval_max=MAX_PAUSE_SECONDS
                )
                return ensure(note, max_retries, **options)

            conn.ensure_connection = quick
            return super().ensure_connected(conn)

    return VesselConsumer
