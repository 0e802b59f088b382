"""`RedisAdmission`: admission's rules as atomic Lua scripts in the broker's Redis.

The rules are described in `broker.admission`; the scripts are in `scripts/`
(loaded by `broker.admission.lua`), their keys named in `broker.admission.keys`.
Every operation rides out a broker outage for `patience` seconds
(`broker.retrying`) and raises `TransientError` (`BrokerUnavailable`) after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from broker.admission.keys import (
    CANCEL_CHANNEL,
    END_TURN_PREFIX,
    FAST_PATH_OFF_KEY,
    MAX_DISPATCH,
    call_key,
    claim_key,
    done_key,
    home_key,
    meta_key,
    turn_key,
)
from broker.admission.listener import CancelListener
from broker.admission.lua import SCRIPTS, script_text
from broker.admission.protocol import CancelOutcome, Claim, ClaimOutcome, Dispatched, Subscription
from broker.errors import BrokerUnavailable, DuplicateCall, TransientError
from broker.queues import Kind
from broker.retrying import Outage, retry

if TYPE_CHECKING:
    import redis

    from broker.envelope import Envelope

__all__ = ["RedisAdmission"]

_T = TypeVar("_T")

#: The end of the submit script's error reply for a call id it already knows.
_DUPLICATE_REPLY = "is already known"


def _dispatched(rows: Iterable[Any]) -> list[Dispatched]:
    return [Dispatched(call_id=r[0], lane=r[1], message=r[2]) for r in rows]


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
        self._scripts = {name: client.register_script(script_text(name)) for name in SCRIPTS}

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
        value are the backend's own (`broker.admission.finish.finish_call` builds them).
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
        return CancelListener(self._redis, on_cancel)

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
        """Until `ttl_ms` from now: no envelopes are pushed, clients build none.

        Retried across an outage like every heartbeat (a worker refreshes it
        at each): past the limit, BrokerUnavailable stops the worker.
        """
        self.retrying(lambda: self._redis.set(FAST_PATH_OFF_KEY, reason, px=ttl_ms))

    def close(self) -> None:
        self._redis.close()
