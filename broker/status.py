"""What the cluster is doing now, read from admission's keys (`broker.admission.keys`), read-only.

`read_status` answers `vessel-workers status`: the live workers of every lane
(shared, dedicated and home lanes `<lane>@<host>`) with their concurrency and
last heartbeat, and per agent its calls queued and running, whether it is
blocked at its `max_concurrent_calls`, and its oldest queued call's age.

It never scans the keyspace: the lanes are the shared lane of each kind plus
the set `vessel:<kind>:lanes` workers announce; the agents are the
deployment's. Everything is read in two pipelined round trips, whatever the
number of agents and lanes.

`call_state` answers the live status line of `vessel-workers call`: whether
a call is queued, running (on which worker) or finished.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from broker.admission.keys import (
    ALIVE,
    BLOCKED,
    LANES,
    PENDING,
    RUNNING,
    WORKERS,
    claim_key,
    done_key,
    kind_key,
    meta_key,
)
from broker.queues import KINDS, Kind, is_home_lane, shared_lane

if TYPE_CHECKING:
    import redis

__all__ = [
    "HEARTBEAT_TTL_BEATS",
    "AgentStatus",
    "CallState",
    "ClusterStatus",
    "WorkerStatus",
    "call_state",
    "read_status",
]

#: A worker's heartbeat entry expires this many beats after it was written
#: (`workers.worker`): its last heartbeat is its expiry minus that.
HEARTBEAT_TTL_BEATS = 3


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One live worker on one lane."""

    name: str
    lane: str
    concurrency: int
    #: Unix time (s) of its last heartbeat.
    last_heartbeat: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "lane": self.lane,
            "concurrency": self.concurrency,
            "last_heartbeat": round(self.last_heartbeat, 3),
        }


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """One agent's calls in admission (all its worker kinds together)."""

    id: str
    queued: int
    running: int
    #: At its max_concurrent_calls with calls waiting.
    blocked: bool
    #: Age (s) of its oldest queued call; None when nothing is queued.
    oldest_queued_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        oldest = self.oldest_queued_seconds
        return {
            "id": self.id,
            "queued": self.queued,
            "running": self.running,
            "blocked": self.blocked,
            "oldest_queued_seconds": None if oldest is None else round(oldest, 3),
        }


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    workers: tuple[WorkerStatus, ...]
    agents: tuple[AgentStatus, ...]

    @property
    def oldest_queued_seconds(self) -> float | None:
        ages = [a.oldest_queued_seconds for a in self.agents if a.oldest_queued_seconds is not None]
        return max(ages, default=None)

    def to_dict(self) -> dict[str, Any]:
        oldest = self.oldest_queued_seconds
        return {
            "workers": [w.to_dict() for w in self.workers],
            "agents": [a.to_dict() for a in self.agents],
            "oldest_queued_seconds": None if oldest is None else round(oldest, 3),
        }


def read_status(
    client: redis.Redis[str],
    agents: Mapping[str, Iterable[Kind]],
    *,
    heartbeat_seconds: float,
) -> ClusterStatus:
    """The cluster now. `agents`: agent id -> the worker kinds of its tools;
    `heartbeat_seconds`: the workers' VESSEL_HEARTBEAT_SECONDS."""
    pipe = client.pipeline(transaction=False)
    for kind in KINDS:
        pipe.smembers(kind_key(kind, LANES))
    pipe.time()
    *announced, server_time = pipe.execute()
    now_ms = int(server_time[0]) * 1000 + int(server_time[1]) // 1000
    lanes: dict[Kind, list[str]] = {
        kind: [shared_lane(kind), *sorted(str(x) for x in found)]
        for kind, found in zip(KINDS, announced, strict=True)
    }

    pipe = client.pipeline(transaction=False)
    every_lane = [lane for kind in KINDS for lane in lanes[kind]]
    for lane in every_lane:
        pipe.hgetall(f"{WORKERS}{lane}")
        pipe.zrange(f"{ALIVE}{lane}", 0, -1, withscores=True)
    # Per agent and kind: its queue lists (the base one, one per home lane), running, blocked.
    plan: list[tuple[str, Kind, int]] = []
    for agent, kinds in agents.items():
        for kind in sorted(set(kinds)):
            queues = [kind_key(kind, PENDING, agent)]
            queues += [
                kind_key(kind, PENDING, agent, lane) for lane in lanes[kind] if is_home_lane(lane)
            ]
            for queue in queues:
                pipe.llen(queue)
                pipe.lindex(queue, 0)
            pipe.zcard(kind_key(kind, RUNNING, agent))
            pipe.sismember(kind_key(kind, BLOCKED), agent)
            plan.append((agent, kind, len(queues)))
    answers = iter(pipe.execute())

    ttl_ms = heartbeat_seconds * 1000 * HEARTBEAT_TTL_BEATS
    workers: list[WorkerStatus] = []
    for lane in every_lane:
        capacity: dict[str, str] = next(answers)
        alive: list[tuple[str, float]] = next(answers)
        for name, expiry in alive:
            if expiry <= now_ms or name not in capacity:
                continue  # its heartbeat expired: taken for dead by admission
            workers.append(
                WorkerStatus(
                    name=str(name),
                    lane=lane,
                    concurrency=int(capacity[name]),
                    last_heartbeat=(expiry - ttl_ms) / 1000,
                )
            )

    totals: dict[str, dict[str, Any]] = {}
    heads: list[tuple[str, str]] = []
    for agent, _kind, n_queues in plan:
        entry = totals.setdefault(agent, {"queued": 0, "running": 0, "blocked": False})
        for _ in range(n_queues):
            entry["queued"] += int(next(answers))
            head = next(answers)
            if head is not None:
                heads.append((agent, str(head)))
        entry["running"] += int(next(answers))
        entry["blocked"] = entry["blocked"] or bool(next(answers))

    oldest: dict[str, float] = {}
    if heads:
        pipe = client.pipeline(transaction=False)
        for _agent, call_id in heads:
            pipe.hget(meta_key(call_id), "at")
        for (agent, _call_id), at in zip(heads, pipe.execute(), strict=True):
            if at is not None:
                age = max(now_ms - int(at), 0) / 1000
                oldest[agent] = max(oldest.get(agent, 0.0), age)

    return ClusterStatus(
        workers=tuple(sorted(workers, key=lambda w: (w.lane, w.name))),
        agents=tuple(
            AgentStatus(
                id=agent,
                queued=entry["queued"],
                running=entry["running"],
                blocked=entry["blocked"],
                oldest_queued_seconds=oldest.get(agent),
            )
            for agent, entry in totals.items()
        ),
    )


@dataclass(frozen=True, slots=True)
class CallState:
    state: Literal["queued", "dispatched", "running", "finished", "unknown"]
    #: The worker running it (state "running").
    worker: str | None = None


def call_state(client: redis.Redis[str], call_id: str) -> CallState:
    """Where one call is now (one pipelined round trip)."""
    pipe = client.pipeline(transaction=False)
    pipe.exists(done_key(call_id))
    pipe.get(claim_key(call_id))
    pipe.hget(meta_key(call_id), "lane")
    pipe.exists(meta_key(call_id))
    done, claim, lane, meta = pipe.execute()
    if done:
        return CallState("finished")
    if claim:
        return CallState("running", str(claim))
    if lane:
        return CallState("dispatched")
    if meta:
        return CallState("queued")
    return CallState("unknown")
