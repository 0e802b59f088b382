"""`LocalAdmission`: admission's rules in one process, for the embedded default.

With `VESSEL_BROKER_URL` unset (`vessel-workers call`, `broker.embedded`) the
client and one worker share this process: admission is a lock and dicts with
the rules of the Redis scripts (`broker.admission`), the same constants
(`broker.admission.keys`), and the same interface (`Admission`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.admission.keys import END_TURN_PREFIX, SLACK, UNKNOWN_AGENT_LIMIT
from broker.admission.protocol import CancelOutcome, Claim, ClaimOutcome, Dispatched, Subscription
from broker.errors import DuplicateCall
from broker.queues import Kind, dedicated_lane, shared_lane

if TYPE_CHECKING:
    from broker.envelope import Envelope

__all__ = ["LocalAdmission"]


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
        elif len(self._running.get(key, ())) >= self._limits.get(key, UNKNOWN_AGENT_LIMIT):
            self._blocked.add(key)
        else:
            self._blocked.discard(key)
            self._enqueue_agent(key)

    def _dispatch(self, lane: str, out: list[Dispatched]) -> None:
        inflight = self._inflight.setdefault(lane, set())
        ring = self._rings.setdefault(lane, deque())
        free = self._windows.get(lane, 0) + SLACK - len(inflight)
        if self._windows.get(lane, 0) <= 0:
            return
        while free > 0 and ring:
            key = ring.popleft()
            running = self._running.setdefault(key, set())
            pending = self._pending.get(key)
            if len(running) < self._limits.get(key, UNKNOWN_AGENT_LIMIT) and pending:
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
