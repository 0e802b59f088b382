"""Per-agent admission: fair, bounded, crash-safe dispatch of calls to Celery lanes.

The problem
-----------
One Celery queue per agent does not scale: a worker polls with one BRPOP naming
every queue it consumes, and throughput falls with the number of queues (883 to
357 tasks/s at 500 queues). One shared FIFO queue does not scale either, in a
different way: agent A's 1,000 queued calls block agent B's 10.

The design
----------
Each worker kind has a fixed set of Celery queues, "lanes" (`broker.queues`):
`vessel.sandbox` and `vessel.service` shared by all agents, and
`vessel.<kind>.<agent>` for workers an operator dedicates with `--agents`. Calls
do not go straight into a lane. They wait in Redis, per agent, and enter a lane
only when it has room:

* `submit` stores the call's message under `vessel:call:<id>`, appends the id to
  the agent's pending list and, if the agent has no place yet, appends the agent
  to the round-robin ring of its lane. Then it dispatches.
* `dispatch` (one Lua script, atomic) runs while the lane holds fewer unfinished
  calls than its window: it pops the next agent off the ring, takes that agent's
  oldest pending call (if the agent is below its `max_concurrent_calls`), gives it
  a lease and puts the agent back at the end of the ring. An agent at its limit
  leaves the ring for a "blocked" set and comes back when one of its calls
  finishes; an agent with nothing pending leaves the ring. Each agent popped
  either yields a call or leaves, so dispatch costs O(1) per call whatever the
  number of agents. A call submitted with a prepared message (`broker.envelope`,
  the fast path) is pushed into the lane by the script itself; the caller (client
  or worker) publishes what dispatch returns as Celery tasks: task id = call id,
  the lane as queue, the message as args.
* A lane's **window** is the sum of the concurrency of the live workers consuming
  it, kept by their heartbeats (`vessel:window:<lane>`, expires with the last
  heartbeat), plus a slack of 2 so a freed worker finds its next call waiting.
  So a lane's Celery queue never holds more than about a window of calls: B's
  first call waits behind at most a window of A's, and from then on the ring
  alternates A, B, A, B.
* **Slots**: an agent's running calls are a sorted set call id -> lease expiry,
  shared by every worker and host, so `max_concurrent_calls` holds across all of
  them. When a call finishes, its worker releases the slot (unblocking its agent)
  and dispatches again, in one script.
* **Dedicated workers**: while a worker started with `--agents a` is live, agent
  `a` takes its turns on the lane `vessel.<kind>.a`, which only dedicated
  workers consume. When the last of them stops, the agent moves back to the
  shared lane.

Turns and homes
---------------
A turn's workspace is a folder on one host (`workers.sandbox.workspace`), so
every call of a turn must run where its folder is. A **host** is one workspace
root, named by `VESSEL_HOST_ID` (default: the machine's hostname): the worker
processes of one machine sharing a root serve each other's turns. Each sandbox
worker consumes its lane and that lane's **home lane** `<lane>@<host>`, which
only the workers of its host consume; a home lane's window is its host's live
capacity, from the same heartbeats.

* A turn's first call goes to the agent's lane like any call. The worker that
  claims it makes its host the turn's **home** (`vessel:home:<agent>:<turn>`,
  set in the claim script, atomically; it expires with the workspace's idle
  TTL and is renewed at every claim).
* `submit` of a call whose turn has a live home puts it in the agent's queue
  for that home lane, `vessel:<kind>:pending:<agent>:<home lane>`. Each home
  lane has a ring of its own, so the same round robin, `max_concurrent_calls`
  (the agent's slots are one set across all its lanes) and leases hold; an
  agent at its limit parks each of its queues (`vessel:<kind>:parked:<agent>`)
  until a slot comes free.
* A call of the turn that reached another host meanwhile (two calls of a new
  turn dispatched at once) is never run there: its claim finds the home alive
  elsewhere, puts the call back at the head of the agent's queue for the home
  lane and returns `moved`.
* When the home host's heartbeat expires (SIGKILL, a lost machine, a warm
  shutdown of its last worker), the recovery sweep moves the calls queued for
  its home lane, and those dispatched there that no worker claimed, back to
  their agents' own queues; the next claim of the turn finds its home dead and
  takes the turn with an empty folder: `lost` 2, and the result says
  `workspace_lost`. The same when Redis no longer has the home while the
  client saw one (`seen`: Redis lost its data), unless the folder is on the
  claiming host (then it was the home and nothing was lost).
* Workspace operations (`client.files`, `workers.workspace_ops`) are routed by
  `route_turn` to the home lane (or the agent's lane for a turn with no live
  home) and checked by `take_home` where they arrive, like a claim; they take no
  slot. An operation that found the workspace lost leaves the note owed to the
  next call (the `lost` field of the home), so the model is still told.

Leases and crashes
------------------
A call's lease is its tool's time limit plus `VESSEL_LEASE_GRACE_SECONDS`
(default 30 s): the longest a healthy worker can hold it, since the runner kills
the tool at its limit. The lease starts at dispatch (covering the short wait in
the lane) and starts again when a worker claims the call. Every worker runs a
recovery sweep every `VESSEL_SWEEP_SECONDS` (2 s): a call whose lease expired
without a result goes back to the head of its agent's queue and is dispatched
again, so a SIGKILLed worker's slots and calls come back within lease + 2 s.
(kombu's visibility-timeout redelivery would only repeat that, later: the
messages admission pushes keep no copy in its `unacked` hash, see
`broker.transport`; calls published with `send_task`, when `broker.fast_path`
has the fast path off, keep kombu's copy and its redelivery too.) A message
can still arrive twice (a requeue, a warm shutdown's restore racing the sweep);
every delivery ends in one run of the tool:

* `claim` (`SET vessel:claim:<id> NX PX lease`): a worker runs a call only if no
  result exists and no live worker holds it; otherwise it acks and returns.
* `finish` (`SET vessel:done:<id> NX`): only the first result is stored.
  When the result backend is this same Redis database (the default), the
  worker's `complete` script does `finish`, writes the result as Celery's Redis
  backend would (its key, its encoded value, SET with expiry + PUBLISH), and
  `release`, atomically: one round trip, and no moment where a call is done
  without its result.

Cancel
------
`cancel(id)` takes a queued call out of its agent's list (it never starts; the
canceller stores its `[cancelled]` result), or sets `vessel:cancel:<id>` (checked
by `claim`, so a dispatched call never starts) and publishes the id on the
`vessel:cancel` channel; the worker running it sets the call's cancel event and
the runner kills its process tree.

Limits, stated plainly
----------------------
* One Redis (or Sentinel), not Redis Cluster: the scripts compute the keys they
  touch. Redis must run with `maxmemory-policy noeviction` (workers check).
* With a result backend elsewhere (`VESSEL_RESULT_BACKEND` another Redis), a
  worker killed in the microseconds between marking a call done and writing
  its result: the call is not run again (it may have had its effect); the
  recovery sweep finds it done without a result and stores an error result
  saying the worker stopped, so the platform still gets an answer.
* A cancel reaches a running call only on the threads (default) and solo pools,
  where the call's cancel event lives in the worker process.

Measured on the shared 2-core machine (load average 8 from other work): one
service worker with 4 threads and a no-op tool did 41 calls/s with one agent and
41 calls/s with the same 1,000 calls spread over 1,000 agents (raw Celery with
the same settings: 30 calls/s at the same time). In the cluster test, 30 of
agent A's calls finished before agent B's 10th (the requirement: fewer than 50).

This module holds the interface (`Admission`) and its Redis implementation; the
embedded default has an in-process one with the same semantics
(`broker.embedded.LocalAdmission`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from broker.errors import BrokerUnavailable, DuplicateCall, TransientError
from broker.fast_path import FAST_PATH_OFF_KEY
from broker.queues import (
    CANCEL_CHANNEL,
    END_TURN_PREFIX,
    KINDS,
    Kind,
    base_lane,
    call_key,
    cancel_key,
    claim_key,
    done_key,
    home_key,
    meta_key,
    turn_key,
)
from broker.retrying import Outage, retry

if TYPE_CHECKING:
    import redis

    from broker.envelope import Envelope

__all__ = [
    "MAX_DISPATCH",
    "Admission",
    "CancelOutcome",
    "Claim",
    "ClaimOutcome",
    "Dispatched",
    "RedisAdmission",
    "Subscription",
    "lane_kind",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Calls one script may dispatch at once; keeps each script call short.
MAX_DISPATCH = 500
#: The end of the submit script's error reply for a call id it already knows.
_DUPLICATE_REPLY = "is already known"

ClaimOutcome = Literal["run", "done", "busy", "cancelled", "moved"]
CancelOutcome = Literal["queued", "signalled", "finished", "unknown"]


def lane_kind(lane: str) -> Kind:
    """The worker kind of a lane name (`vessel.<kind>[.<agent>][@<host>]`)."""
    parts = base_lane(lane).split(".")
    kind = parts[1] if len(parts) > 1 else ""
    for known in KINDS:
        if kind == known:
            return known
    raise ValueError(f"{lane!r} is not a lane")


@dataclass(frozen=True, slots=True)
class Dispatched:
    """A call admission let into a lane: publish it as a Celery task."""

    call_id: str
    lane: str
    #: The CallRequest message, as JSON text.
    message: str

    @property
    def kind(self) -> Kind:
        return lane_kind(self.lane)


@dataclass(frozen=True, slots=True)
class Claim:
    """What `claim_at_home` decided for one delivery of a call."""

    outcome: ClaimOutcome
    #: The turn's workspace is lost: the result must say so (and a worker
    #: taking the turn over empties any folder it had of it first: `rehomed`).
    workspace_lost: bool = False
    #: The home died (or Redis lost it) and this host took the turn now.
    rehomed: bool = False
    #: What the claim dispatched (a `moved` call went to its home lane).
    dispatched: tuple[Dispatched, ...] = ()


class Subscription(Protocol):
    def close(self) -> None: ...


class Admission(Protocol):
    """The admission state of every call; see the module docstring."""

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
        """Queue one call and dispatch; returns what the caller must publish.

        With an `envelope` (`broker.envelope`) the Redis implementation pushes
        the call into its lane itself when it is dispatched, and it is not returned.
        `affinity`: the call follows its turn's home (declared tools with a
        turn); `seen`: the client saw the turn homed before (a result came back).
        """
        ...

    def claim(self, call_id: str, hostname: str, lease_ms: int) -> ClaimOutcome: ...

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
        """`claim` for a worker of host `host_id`: a call following its turn runs
        only at the turn's home (see "Turns and homes"). `here`: the turn's
        folder exists on this host."""
        ...

    def route_turn(self, kind: Kind, agent: str, turn: str) -> str:
        """The lane a workspace operation of the turn goes to."""
        ...

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
        """For a workspace operation arriving on home lane `mine`: (the turn's
        home lane, lost: 0 no, 1 lost earlier, 2 lost now, empty the folder)."""
        ...

    def finish(self, call_id: str, hostname: str, ttl_seconds: int) -> bool: ...

    def release(self, call_id: str) -> list[Dispatched]: ...

    def cancel(self, call_id: str, ttl_seconds: int) -> tuple[CancelOutcome, str | None]:
        """The outcome, and for a call taken out of its queue its message."""
        ...

    def cancel_requested(self, call_id: str) -> bool: ...

    def claimed(self, call_id: str) -> bool:
        """True while a worker holds the call (it is running, not queued)."""
        ...

    def turn_calls(self, turn: str) -> list[str]: ...

    def end_turn(self, turn: str, agents: Iterable[str] = ()) -> None:
        """Forget the turn's calls and its homes (of `agents`), and tell every
        worker (`END_TURN_PREFIX`)."""
        ...

    def heartbeat(
        self, kind: Kind, hostname: str, lanes: Mapping[str, int], ttl_ms: int
    ) -> list[Dispatched]: ...

    def recover(self, kind: Kind) -> tuple[list[Dispatched], list[tuple[str, str]]]:
        """Dispatched again, and (call id, message) of calls done but never released."""
        ...

    def listen_cancels(self, on_cancel: Callable[[str], None]) -> Subscription: ...

    def close(self) -> None: ...


def _script(name: str) -> str:
    # The .lua files ship next to this module (package-data "*.lua").
    folder = Path(__file__).resolve().parent
    lib = (folder / "admission_lib.lua").read_text(encoding="utf-8")
    body = (folder / f"admission_{name}.lua").read_text(encoding="utf-8")
    return f"{lib}\n{body}"


def _dispatched(rows: Iterable[Any]) -> list[Dispatched]:
    return [Dispatched(call_id=r[0], lane=r[1], message=r[2]) for r in rows]


class _PubSubListener:
    """A thread receiving call ids on the cancel channel."""

    def __init__(self, client: redis.Redis[str], on_cancel: Callable[[str], None]) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(CANCEL_CHANNEL)
        self._on_cancel = on_cancel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vessel-cancel", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import redis  # noqa: PLC0415 (see RedisAdmission.from_url)

        while not self._stop.is_set():
            try:
                message = self._pubsub.get_message(timeout=0.5)
            except (redis.ConnectionError, redis.TimeoutError, ValueError):
                if self._stop.wait(0.5):
                    return
                continue
            if message and message.get("type") == "message":
                try:
                    self._on_cancel(str(message["data"]))
                except Exception:  # the listener must outlive a failing handler
                    _log.exception("cancel channel: handling %r failed", message["data"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._pubsub.close()


class RedisAdmission:
    """Admission in the broker's Redis: atomic Lua scripts, shared by all hosts."""

    def __init__(
        self,
        client: redis.Redis[str],
        *,
        outage: Outage | None = None,
        patience: float = 0.0,
    ) -> None:
        """`patience`: seconds of a broker outage each operation rides out
        (`broker.retrying`; a worker's VESSEL_BROKER_OUTAGE_SECONDS, 0 for a client)."""
        import redis  # noqa: PLC0415 (see from_url)

        self._redis = client
        self.outage = outage or Outage("the broker Redis")
        self.patience = patience
        self._redis_error: type[Exception] = redis.RedisError
        self._scripts = {
            name: client.register_script(_script(name))
            for name in (
                "submit",
                "claim",
                "finish",
                "release",
                "complete",
                "cancel",
                "heartbeat",
                "recover",
                "route",
                "home",
                "probe",
            )
        }

    @classmethod
    def from_url(
        cls, url: str, *, sentinel_master: str | None = None, patience: float = 0.0
    ) -> RedisAdmission:
        # Imported here: the embedded default never needs redis-py, which takes
        # a quarter of a second to import.
        from broker.config import hide_password  # noqa: PLC0415
        from broker.connect import redis_client  # noqa: PLC0415

        client = redis_client(url, sentinel_master=sentinel_master)
        outage = Outage(f"the broker Redis {hide_password(url)}")
        return cls(client, outage=outage, patience=patience)

    @property
    def redis(self) -> redis.Redis[str]:
        return self._redis

    def _run(self, name: str, *args: object) -> Any:
        script = self._scripts[name]
        try:
            return self.retrying(lambda: script(keys=[], args=list(args)))
        except TransientError as exc:
            cause = exc.__cause__
            if name == "submit" and str(cause).endswith(_DUPLICATE_REPLY):
                raise DuplicateCall(str(args[0])) from cause
            raise

    def retrying(self, operation: Callable[[], _T], *, patience: float | None = None) -> _T:
        """`operation` (Redis commands), riding out an outage for `patience` seconds
        (default this admission's); raises TransientError (BrokerUnavailable when
        Redis stayed unreachable)."""
        try:
            return retry(
                self.outage,
                operation,
                patience=self.patience if patience is None else patience,
            )
        except BrokerUnavailable:
            raise
        except self._redis_error as exc:
            raise TransientError(f"admission in Redis failed: {exc}") from exc

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
        rows = self._run(
            "submit",
            call_id,
            kind,
            agent,
            message,
            limit,
            lease_ms,
            ttl_seconds,
            turn or "",
            MAX_DISPATCH,
            *((envelope.payload, envelope.route, envelope.tag) if envelope else ("", "", "")),
            "1" if affinity and turn else "",
            "1" if seen else "",
        )
        return _dispatched(rows)

    def claim(self, call_id: str, hostname: str, lease_ms: int) -> ClaimOutcome:
        outcome: ClaimOutcome = self._run("claim", call_id, hostname, lease_ms)[0]
        return outcome

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
        outcome, lost, rows = self._run(
            "claim",
            call_id,
            hostname,
            lease_ms,
            host_id,
            home_ttl_seconds,
            "1" if here else "",
            MAX_DISPATCH,
        )
        return Claim(
            outcome=outcome,
            workspace_lost=int(lost) > 0,
            rehomed=int(lost) == 2,
            dispatched=tuple(_dispatched(rows)),
        )

    def route_turn(self, kind: Kind, agent: str, turn: str) -> str:
        return str(self._run("route", kind, agent, turn))

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
        home, lost = self._run(
            "home", agent, turn, mine, home_ttl_seconds, "1" if here else "", "1" if seen else ""
        )
        return str(home), int(lost)

    def finish(self, call_id: str, hostname: str, ttl_seconds: int) -> bool:
        return bool(self._run("finish", call_id, hostname, ttl_seconds))

    def release(self, call_id: str) -> list[Dispatched]:
        return _dispatched(self._run("release", call_id, MAX_DISPATCH))

    def complete(
        self,
        call_id: str,
        hostname: str,
        ttl_seconds: int,
        *,
        result_key: bytes | str,
        result_value: bytes | str,
        result_ttl_seconds: int | None,
    ) -> tuple[bool, list[Dispatched]]:
        """`finish`, the result write and `release` in one script (one round trip).

        Only for a result backend in this same Redis database: the key and
        value are the backend's own (`broker.client.finish_call` builds them).
        """
        stored, rows = self._run(
            "complete",
            call_id,
            hostname,
            ttl_seconds,
            result_key,
            result_value,
            result_ttl_seconds or 0,
            MAX_DISPATCH,
        )
        return bool(stored), _dispatched(rows)

    def same_database(self, connection_kwargs: Mapping[str, Any]) -> bool:
        """True if `connection_kwargs` (redis-py's) name this client's server and database."""
        mine = self._redis.connection_pool.connection_kwargs
        keys = ("host", "port", "path", "db")
        return all(str(mine.get(k, "")) == str(connection_kwargs.get(k, "")) for k in keys)

    def cancel(self, call_id: str, ttl_seconds: int) -> tuple[CancelOutcome, str | None]:
        outcome, message = self._run("cancel", call_id, ttl_seconds)
        return outcome, (message or None)

    def cancel_requested(self, call_id: str) -> bool:
        return bool(self.retrying(lambda: self._redis.exists(cancel_key(call_id))))

    def claimed(self, call_id: str) -> bool:
        return bool(self._redis.exists(claim_key(call_id)))

    def turn_calls(self, turn: str) -> list[str]:
        members = self.retrying(lambda: self._redis.smembers(turn_key(turn)))
        return sorted(str(m) for m in members)

    def end_turn(self, turn: str, agents: Iterable[str] = ()) -> None:
        homes = [home_key(agent, turn) for agent in agents]

        def end() -> None:
            self._redis.delete(turn_key(turn), *homes)
            self._redis.publish(CANCEL_CHANNEL, f"{END_TURN_PREFIX}{turn}")

        self.retrying(end)

    def reassert_claims(self, call_ids: Iterable[str], hostname: str, ttl_ms: int) -> None:
        """After an outage: mark the calls running here as claimed, where no claim exists.

        A Redis that came back empty lost them; the claim tells a waiting client
        (`call_known`) that a worker still runs the call and will store its result.
        """
        ids = list(call_ids)
        if not ids:
            return

        def claim() -> None:
            with self._redis.pipeline(transaction=False) as pipe:
                for call_id in ids:
                    pipe.set(claim_key(call_id), hostname, nx=True, px=ttl_ms)
                pipe.execute()

        self.retrying(claim)

    def call_known(self, call_id: str) -> bool:
        """True while the broker holds any record of the call (queued, running or done)."""
        keys = [meta_key(call_id), call_key(call_id), done_key(call_id), claim_key(call_id)]
        return bool(self.retrying(lambda: self._redis.exists(*keys), patience=0))

    def heartbeat(
        self, kind: Kind, hostname: str, lanes: Mapping[str, int], ttl_ms: int
    ) -> list[Dispatched]:
        args: list[object] = [kind, hostname, ttl_ms, MAX_DISPATCH]
        for lane, capacity in lanes.items():
            args += [lane, capacity]
        return _dispatched(self._run("heartbeat", *args))

    def recover(self, kind: Kind) -> tuple[list[Dispatched], list[tuple[str, str]]]:
        rows, finished = self._run("recover", kind, MAX_DISPATCH)
        return _dispatched(rows), [(str(f[0]), str(f[1])) for f in finished]

    def listen_cancels(self, on_cancel: Callable[[str], None]) -> Subscription:
        return _PubSubListener(self._redis, on_cancel)

    def push_probe(self, probe_id: str, queue: str, envelope: Envelope) -> None:
        """Push `envelope` into `queue` as dispatch pushes a call's (the worker self-test)."""
        self._run("probe", probe_id, queue, envelope.payload, envelope.route, envelope.tag)

    def fast_path_off(self) -> str | None:
        """Why a worker turned the fast path off (`broker.fast_path`), or None."""
        try:
            reason = self._redis.get(FAST_PATH_OFF_KEY)
        except self._redis_error as exc:
            raise TransientError(f"admission in Redis failed: {exc}") from exc
        return None if reason is None else str(reason)

    def turn_fast_path_off(self, reason: str, ttl_ms: int) -> None:
        """Until `ttl_ms` from now: no envelopes are pushed, clients build none."""
        self._redis.set(FAST_PATH_OFF_KEY, reason, px=ttl_ms)

    def close(self) -> None:
        self._redis.close()
