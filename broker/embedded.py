"""The embedded default: broker, admission, results and one worker in this process.

With `VESSEL_BROKER_URL` unset, `vessel-workers call` still goes the whole way a
call goes in production: the client submits through admission, the call is
published as the same Celery task, a Celery worker (a thread here) consumes it,
and the result comes back through a result backend. Only the transports are
in-process: `memory://` for the broker, `cache+memory://` for results, and
`LocalAdmission` (a lock and dicts) for admission. Confinement is the real one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.contrib.testing.worker import TestWorkController
from celery.worker import state

from broker.admission import CancelOutcome, Claim, ClaimOutcome, Dispatched, Subscription
from broker.errors import DuplicateCall
from broker.queues import END_TURN_PREFIX, Kind, dedicated_lane, shared_lane

if TYPE_CHECKING:
    from broker.envelope import Envelope

__all__ = ["LocalAdmission", "embedded_worker"]

#: As in the Redis scripts: calls a lane may hold beyond its capacity.
_SLACK = 2


@dataclass(slots=True)
class _Call:
    kind: Kind
    agent: str
    message: str
    lane: str | None = None


@dataclass(slots=True)
class _Callbacks:
    items: list[Callable[[str], None]] = field(default_factory=list)

    def close(self) -> None:
        self.items.clear()


class LocalAdmission:
    """`broker.admission.Admission` for one process: the same rules, no Redis.

    Round-robin rings per lane, per-agent limits, lane windows, claims and the
    done guard behave as the Redis scripts do. Leases are not kept: a crash
    here takes the caller down with the worker, so there is nothing to recover.
    Turn affinity: there is one host, so it is every turn's home; a claim never
    moves a call and no workspace is ever lost (`claim_at_home`, `take_home`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, _Call] = {}
        self._pending: dict[tuple[Kind, str], deque[str]] = {}
        self._rings: dict[str, deque[tuple[Kind, str]]] = {}
        self._where: dict[tuple[Kind, str], str] = {}
        self._blocked: set[tuple[Kind, str]] = set()
        self._limits: dict[tuple[Kind, str], int] = {}
        self._running: dict[tuple[Kind, str], set[str]] = {}
        self._inflight: dict[str, set[str]] = {}
        self._windows: dict[str, int] = {}
        self._claims: dict[str, str] = {}
        self._done: set[str] = set()
        self._cancelled: set[str] = set()
        self._turns: dict[str, set[str]] = {}
        self._listeners = _Callbacks()

    # --- the rules, under the lock -------------------------------------------

    def _lane_for(self, kind: Kind, agent: str) -> str:
        dedicated = dedicated_lane(kind, agent)
        return dedicated if self._windows.get(dedicated, 0) > 0 else shared_lane(kind)

    def _enqueue_agent(self, key: tuple[Kind, str]) -> str:
        lane = self._lane_for(*key)
        self._where[key] = lane
        self._rings.setdefault(lane, deque()).append(key)
        return lane

    def _settle(self, key: tuple[Kind, str]) -> None:
        if not self._pending.get(key):
            self._where.pop(key, None)
            self._blocked.discard(key)
        elif len(self._running.get(key, ())) >= self._limits.get(key, 1):
            self._blocked.add(key)
        else:
            self._blocked.discard(key)
            self._enqueue_agent(key)

    def _dispatch(self, lane: str, out: list[Dispatched]) -> None:
        inflight = self._inflight.setdefault(lane, set())
        ring = self._rings.setdefault(lane, deque())
        free = self._windows.get(lane, 0) + _SLACK - len(inflight)
        if self._windows.get(lane, 0) <= 0:
            return
        while free > 0 and ring:
            key = ring.popleft()
            running = self._running.setdefault(key, set())
            pending = self._pending.get(key)
            if len(running) < self._limits.get(key, 1) and pending:
                call_id = pending.popleft()
                call = self._calls[call_id]
                call.lane = lane
                running.add(call_id)
                inflight.add(call_id)
                out.append(Dispatched(call_id=call_id, lane=lane, message=call.message))
                free -= 1
            self._settle(key)

    # --- the interface ----------------------------------------------------------

    def submit(
        self,
        *,
        call_id: str,
        kind: Kind,
        agent: str,
        message: str,
        limit: int,
        lease_ms: int,
        turn: str | None,
        ttl_seconds: int,
        envelope: Envelope | None = None,
        affinity: bool = False,
        seen: bool = False,
    ) -> list[Dispatched]:
        # Nothing expires in one process; every call is published by its caller;
        # one host is every turn's home, so affinity changes nothing.
        del lease_ms, ttl_seconds, envelope, affinity, seen
        out: list[Dispatched] = []
        with self._lock:
            if call_id in self._calls or call_id in self._done:
                raise DuplicateCall(call_id)
            key = (kind, agent)
            self._calls[call_id] = _Call(kind=kind, agent=agent, message=message)
            self._limits[key] = limit
            self._pending.setdefault(key, deque()).append(call_id)
            if turn is not None:
                self._turns.setdefault(turn, set()).add(call_id)
            lane = self._where.get(key) or self._enqueue_agent(key)
            self._dispatch(lane, out)
        return out

    def claim(self, call_id: str, hostname: str, lease_ms: int) -> ClaimOutcome:
        del lease_ms
        with self._lock:
            if call_id in self._done:
                return "done"
            if call_id in self._claims:
                return "busy"
            self._claims[call_id] = hostname
            return "cancelled" if call_id in self._cancelled else "run"

    def claim_at_home(
        self,
        call_id: str,
        hostname: str,
        lease_ms: int,
        *,
        host_id: str,
        home_ttl_seconds: int,
        here: bool,
    ) -> Claim:
        del host_id, home_ttl_seconds, here  # the one host is home
        return Claim(outcome=self.claim(call_id, hostname, lease_ms))

    def route_turn(self, kind: Kind, agent: str, turn: str) -> str:
        del turn
        with self._lock:
            return self._lane_for(kind, agent)

    def take_home(
        self,
        agent: str,
        turn: str,
        mine: str,
        *,
        home_ttl_seconds: int,
        here: bool,
        seen: bool,
    ) -> tuple[str, int]:
        del agent, turn, home_ttl_seconds, here, seen
        return mine, 0

    def finish(self, call_id: str, hostname: str, ttl_seconds: int) -> bool:
        del hostname, ttl_seconds
        with self._lock:
            if call_id in self._done:
                return False
            self._done.add(call_id)
            self._cancelled.discard(call_id)
            return True

    def release(self, call_id: str) -> list[Dispatched]:
        out: list[Dispatched] = []
        with self._lock:
            call = self._calls.pop(call_id, None)
            if call is None or call.lane is None:
                return out
            key = (call.kind, call.agent)
            self._running.get(key, set()).discard(call_id)
            self._inflight.get(call.lane, set()).discard(call_id)
            self._claims.pop(call_id, None)
            if key in self._blocked:
                self._settle(key)
            self._dispatch(call.lane, out)
            where = self._where.get(key)
            if where is not None and where != call.lane:
                self._dispatch(where, out)
        return out

    def cancel(self, call_id: str, ttl_seconds: int) -> tuple[CancelOutcome, str | None]:
        del ttl_seconds
        with self._lock:
            if call_id in self._done:
                return "finished", None
            call = self._calls.get(call_id)
            if call is None:
                return "unknown", None
            self._cancelled.add(call_id)
            pending = self._pending.get((call.kind, call.agent), deque())
            if call.lane is None and call_id in pending:
                pending.remove(call_id)
                del self._calls[call_id]
                return "queued", call.message
            listeners = list(self._listeners.items)
        for listener in listeners:
            listener(call_id)
        return "signalled", None

    def cancel_requested(self, call_id: str) -> bool:
        with self._lock:
            return call_id in self._cancelled

    def claimed(self, call_id: str) -> bool:
        with self._lock:
            return call_id in self._claims and call_id not in self._done

    def turn_calls(self, turn: str) -> list[str]:
        with self._lock:
            return sorted(self._turns.get(turn, ()))

    def end_turn(self, turn: str, agents: Iterable[str] = ()) -> None:
        del agents  # no home records: the one host is home
        with self._lock:
            self._turns.pop(turn, None)
            listeners = list(self._listeners.items)
        for listener in listeners:
            listener(f"{END_TURN_PREFIX}{turn}")

    def heartbeat(
        self, kind: Kind, hostname: str, lanes: Mapping[str, int], ttl_ms: int
    ) -> list[Dispatched]:
        del kind, hostname, ttl_ms  # one worker, registered for the process's life
        out: list[Dispatched] = []
        with self._lock:
            for lane, capacity in lanes.items():
                self._windows[lane] = capacity
                self._dispatch(lane, out)
        return out

    def recover(self, kind: Kind) -> tuple[list[Dispatched], list[tuple[str, str]]]:
        del kind
        return [], []

    def listen_cancels(self, on_cancel: Callable[[str], None]) -> Subscription:
        with self._lock:
            self._listeners.items.append(on_cancel)
        return self._listeners

    def close(self) -> None:
        pass


#: A task that does nothing: sent to wake the worker's poll so it stops at once.
_WAKEUP_TASK = "vessel.embedded_wakeup"


@contextmanager
def embedded_worker(
    app: Celery, *, queues: list[str], concurrency: int = 2, **options: Any
) -> Iterator[TestWorkController]:
    """Run a Celery worker on `app` in a thread until the block ends.

    The threads pool, because the sandbox runner must spawn from long-lived
    threads (bubblewrap's --die-with-parent follows the parent thread).
    """
    if _WAKEUP_TASK not in app.tasks:
        app.task(name=_WAKEUP_TASK, ignore_result=True)(_nothing)
    worker = TestWorkController(
        app=app,
        concurrency=concurrency,
        pool="threads",
        hostname="embedded@localhost",
        queues=queues,
        loglevel="WARNING",
        ready_callback=None,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        **options,
    )
    thread = threading.Thread(target=worker.start, name="vessel-embedded-worker", daemon=True)
    thread.start()
    worker.ensure_started()
    try:
        yield worker
    finally:
        # Warm shutdown (running calls finish). The consumer notices the flag
        # only between polls, and polls once more after noticing (a `finally`
        # in Celery's loop), each poll waiting up to 2 s for a message: two
        # wake-up messages end both polls at once.
        state.should_stop = 0
        for _ in range(2):
            app.send_task(_WAKEUP_TASK, queue=queues[0])
        thread.join(30)
        state.should_stop = None


def _nothing() -> None:
    """The wake-up task."""
