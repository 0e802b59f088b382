"""Waiting for a call's result: on its result channel, across broker outages.

A Redis result backend PUBLISHes each result it stores on the task's key; a
wait subscribes there (one subscription connection per wait, idle ones kept
for the next) and reads the store once after subscribing, so a result stored
before or after is seen at once. Other backends (the embedded default's
in-memory one) are polled every few milliseconds.

While it waits, `_LostCheck` asks admission now and then whether the broker
still knows the call: a Redis that came back empty lost it, and the wait ends
with `BrokerLostCall` instead of lasting forever.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from celery import Celery

from broker.admission import Admission, RedisAdmission
from broker.errors import BrokerLostCall, CallTimeout
from broker.protocol import ToolResult, backend_notifies, result_from_meta
from broker.retrying import MAX_PAUSE_SECONDS, unreachable

__all__ = ["ResultWaiter"]

#: The longest pause between two reads of a backend that cannot notify.
_POLL_CAP_SECONDS = 0.005
#: How long a wait on a result channel goes without reading the store again.
_WAIT_CHUNK_SECONDS = 1.0
#: Subscription connections kept between waits, at most.
_IDLE_PUBSUBS = 64
#: Quiet waits (of `_WAIT_CHUNK_SECONDS`) between two checks that the broker
#: still knows the call; after an outage it is checked at every one.
_LOST_CHECK_EVERY = 5
#: A call is reported lost only when two checks this far apart (plus a
#: heartbeat period) find nothing: a queued call being cancelled has no records
#: between the cancel script and its `[cancelled]` result, and after an outage
#: a worker still running a call marks it claimed again with its first
#: heartbeat (`workers.worker`), which comes within a heartbeat and a retry pause.
_LOST_CONFIRM_SECONDS = 2 * MAX_PAUSE_SECONDS


class _ChannelLost(Exception):
    """The connection of a wait on a result channel failed."""


class _LostCheck:
    """Whether the broker still knows a call a client waits for (`BrokerLostCall`).

    A call is lost when two checks a few seconds apart (`_LOST_CONFIRM_SECONDS`)
    find neither its result nor any record in admission (queued, dispatched,
    claimed by a worker running it, or done). Read in
    that order, a result stored between the reads is never missed: the done
    mark is set before (or with) the result and outlives it. Checked (one
    EXISTS) after the wait's first quiet second, then every `_LOST_CHECK_EVERY`
    quiet seconds, and at every turn after an outage: a result that comes
    within a second, as nearly all do, costs no check (a round trip less a
    call), and a lost call is found a second later at most.
    A result backend elsewhere: only admission's Redis is asked, the result is
    read from the backend as always.
    """

    def __init__(self, waiter: ResultWaiter, call_id: str) -> None:
        self._waiter = waiter
        self._call_id = call_id
        #: Quiet seconds waited so far (`check` is first called before any).
        self._quiet = -1
        self._first_miss: float | None = None
        self.after_outage = False

    def check(self) -> bool:
        admission = self._waiter.admission
        if not isinstance(admission, RedisAdmission):
            return False  # the embedded default never loses a call
        self._quiet += 1
        due = self._quiet == 1 or (self._quiet > 0 and self._quiet % _LOST_CHECK_EVERY == 0)
        if not (due or self.after_outage):
            return False
        if admission.call_known(self._call_id):
            self._first_miss = None
            return False
        now = time.monotonic()
        confirm = _LOST_CONFIRM_SECONDS + self._waiter.heartbeat_seconds
        if self._first_miss is None:
            self._first_miss = now
            time.sleep(confirm)
            now = time.monotonic()
        if now - self._first_miss < confirm:
            return False
        if self._waiter._stored_now(self._call_id) is not None:
            return False
        return not admission.call_known(self._call_id)


class ResultWaiter:
    """Waits for results of calls in `app`'s result backend (`VesselClient.result`)."""

    def __init__(self, app: Celery, admission: Admission, *, heartbeat_seconds: float) -> None:
        self.app = app
        self.admission = admission
        #: The workers' heartbeat period: a lost call is confirmed after it (`_LostCheck`).
        self.heartbeat_seconds = heartbeat_seconds
        self._pubsub_lock = threading.Lock()
        self._idle_pubsubs: list[Any] = []
        self._closed = False

    def wait(self, call_id: str, timeout: float | None = None) -> ToolResult:
        """Wait for the call's result; CallTimeout after `timeout` seconds (None: forever).

        With a Redis result backend this waits on the channel the backend
        PUBLISHes each stored result on (one subscription per wait, closed when
        it ends), so a result is seen as soon as it is stored; otherwise (the
        embedded default's in-memory backend) it polls every few milliseconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if backend_notifies(self.app.backend):
            found = self._wait_across_outages(call_id, deadline)
            if found is not None:
                return found
            raise CallTimeout(f"no result for call {call_id} within {timeout} s")
        pause = 0.001
        while True:
            found = self.stored(call_id)
            if found is not None:
                return found
            if deadline is not None and time.monotonic() >= deadline:
                raise CallTimeout(f"no result for call {call_id} within {timeout} s")
            wait = pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0))
            time.sleep(wait)
            pause = min(pause * 2, _POLL_CAP_SECONDS)

    def stored(self, call_id: str) -> ToolResult | None:
        """The call's result if the backend holds it now."""
        return result_from_meta(self.app.backend.get_task_meta(call_id))

    def _stored_now(self, call_id: str) -> ToolResult | None:
        """The call's result if the Redis result backend holds it now, read once.

        Not `stored`: Celery's reads retry on their own while Redis is unreachable
        (`result_backend_always_retry`), silently and with a backoff of up to seconds,
        so a wait whose read fell in an outage slept through it unreported and noticed
        Redis back late. This read raises `_ChannelLost` instead, and the wait says so
        and goes on across the outage as for its subscription (`_wait_across_outages`).
        """
        import redis  # noqa: PLC0415 (only with a Redis backend: redis-py is installed)

        backend = self.app.backend
        try:
            stored = backend.client.get(backend.get_key_for_task(call_id))
        except (redis.RedisError, OSError) as exc:
            raise _ChannelLost from exc
        return None if stored is None else result_from_meta(backend.decode_result(stored))

    def _wait_across_outages(self, call_id: str, deadline: float | None) -> ToolResult | None:
        """`_wait_published`, again after each connection failure, until `deadline`.

        Raises BrokerLostCall when the broker came back without the call
        (`_LostCheck`).
        """
        outage = self.admission.outage if isinstance(self.admission, RedisAdmission) else None
        lost = _LostCheck(self, call_id)
        pause = 0.05
        while True:
            try:
                found = self._wait_published(call_id, deadline, lost)
            except Exception as exc:
                error = exc.__cause__ if isinstance(exc, _ChannelLost) else exc
                if error is None or not unreachable(error):
                    raise
                if outage is not None:
                    outage.failed(error)  # one warning per outage, not per call
                lost.after_outage = True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                time.sleep(pause if left is None else min(pause, left))
                pause = min(pause * 2, MAX_PAUSE_SECONDS)
                continue
            if outage is not None:
                outage.succeeded()
            return found

    def _wait_published(
        self, call_id: str, deadline: float | None, lost: _LostCheck | None = None
    ) -> ToolResult | None:
        """The result, waiting on its channel until `deadline`; None at the deadline.

        Each wait holds a subscription connection of its own (so any number of
        threads may wait at once); an idle one is kept for the next wait and
        closed by `close`.
        """
        import redis  # noqa: PLC0415 (only with a Redis backend: redis-py is installed)

        backend = self.app.backend
        channel = backend.get_key_for_task(call_id)
        pubsub = self._take_pubsub(backend)
        reusable = False
        try:
            try:
                pubsub.subscribe(channel)
            except redis.RedisError as exc:
                raise _ChannelLost from exc
            # Subscribe first, then read once: a result stored before the
            # subscription is seen by the read, one stored after it by the
            # subscription. The read goes on another connection, so it waits
            # for Redis to confirm the subscription.
            found = self._next_published(pubsub, channel, deadline, until_subscribed=True)
            while found is None:
                found = self._stored_now(call_id)
                if found is not None:
                    break
                if lost is not None and lost.check():
                    raise BrokerLostCall(
                        f"the broker lost this call ({call_id}); submit it again "
                        "(its Redis came back without the call's records or result)"
                    )
                found = self._next_published(pubsub, channel, deadline)
                if deadline is not None and time.monotonic() >= deadline:
                    break
            try:
                pubsub.unsubscribe(channel)
                reusable = True
            except redis.RedisError:
                pass
            return found
        finally:
            self._give_back(pubsub, reusable=reusable)

    def _next_published(
        self,
        pubsub: Any,
        channel: bytes,
        deadline: float | None,
        *,
        until_subscribed: bool = False,
    ) -> ToolResult | None:
        """A result published on `channel`; None after a quiet second or at the deadline.

        `until_subscribed`: None as soon as Redis confirms the subscription.
        """
        import redis  # noqa: PLC0415 (see _wait_published)

        quiet_until = time.monotonic() + _WAIT_CHUNK_SECONDS
        while True:
            now = time.monotonic()
            left = quiet_until - now
            if deadline is not None:
                left = min(left, deadline - now)
            if left <= 0:
                # Quiet for a while: the caller reads the store again (it is
                # cheap), in case a message was missed.
                return None
            try:
                message = pubsub.get_message(timeout=left)
            except (redis.RedisError, OSError, ValueError) as exc:
                raise _ChannelLost from exc
            if message is None or message.get("channel") != channel:
                continue  # nothing yet, or a late message of the connection's previous wait
            kind = message.get("type")
            if kind == "subscribe" and until_subscribed:
                return None
            if kind != "message":
                continue
            found = result_from_meta(self.app.backend.decode_result(message["data"]))
            if found is not None:
                return found

    def _take_pubsub(self, backend: Any) -> Any:
        with self._pubsub_lock:
            if self._idle_pubsubs:
                return self._idle_pubsubs.pop()
        return backend.client.pubsub()

    def _give_back(self, pubsub: Any, *, reusable: bool) -> None:
        if reusable:
            with self._pubsub_lock:
                if not self._closed and len(self._idle_pubsubs) < _IDLE_PUBSUBS:
                    self._idle_pubsubs.append(pubsub)
                    return
        pubsub.close()

    def close(self) -> None:
        """Close the idle subscription connections; later waits close their own."""
        with self._pubsub_lock:
            self._closed = True
            idle, self._idle_pubsubs = self._idle_pubsubs, []
        for pubsub in idle:
            pubsub.close()
