"""Both admissions, for one suite of rules: `admission` runs a test against the
Redis scripts (a real redis-server, `redis_url`) and the in-process one of the
embedded default; `redis_admission` is for the rules only Redis has (leases,
hosts, prepared messages).

Where the two differ by design the test says so with `is_redis`: the
in-process admission lives and dies with its one worker (no leases to expire)
and its one host is every turn's home.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from broker.admission import Admission, Claim, Dispatched, LocalAdmission, RedisAdmission
from broker.queues import Kind, home_lane

#: The shared lanes the rules are checked on.
LANE = "vessel.service"
SHARED = "vessel.sandbox"
HOME_A = home_lane(SHARED, "host-a")
HOME_B = home_lane(SHARED, "host-b")


@pytest.fixture(params=["redis", "in_process"])
def admission(request: pytest.FixtureRequest) -> Iterator[Admission]:
    if request.param == "in_process":
        yield LocalAdmission()
        return
    found = RedisAdmission.from_url(request.getfixturevalue("redis_url"))
    yield found
    found.close()


@pytest.fixture
def redis_admission(redis_url: str) -> Iterator[RedisAdmission]:
    found = RedisAdmission.from_url(redis_url)
    yield found
    found.close()


def is_redis(admission: Admission) -> bool:
    return isinstance(admission, RedisAdmission)


def submit(
    a: Admission,
    call_id: str,
    agent: str = "a",
    *,
    kind: Kind = "service",
    limit: int = 100,
    turn: str | None = None,
    lease_ms: int = 60_000,
    affinity: bool = False,
    seen: bool = False,
) -> list[Dispatched]:
    message = json.dumps({"call_id": call_id, "agent": agent, "tool": "t", "owner": "a/b"})
    return a.submit(
        call_id=call_id,
        kind=kind,
        agent=agent,
        message=message,
        limit=limit,
        lease_ms=lease_ms,
        turn=turn,
        ttl_seconds=600,
        affinity=affinity,
        seen=seen,
    )


def submit_in_turn(
    a: Admission,
    call_id: str,
    agent: str = "a",
    *,
    turn: str | None = "t1",
    limit: int = 100,
    seen: bool = False,
) -> list[Dispatched]:
    """A sandbox call that follows its turn's home (declared tools with a turn)."""
    return submit(
        a, call_id, agent, kind="sandbox", limit=limit, turn=turn, affinity=True, seen=seen
    )


def ids(dispatched: Iterable[Dispatched]) -> list[str]:
    return [d.call_id for d in dispatched]


def lanes(dispatched: Iterable[Dispatched]) -> list[tuple[str, str]]:
    return [(d.call_id, d.lane) for d in dispatched]


def claim_at(a: Admission, call_id: str, host: str, *, here: bool = False) -> Claim:
    return a.claim_at_home(
        call_id, f"w@{host}", 5_000, host_id=host, home_ttl_seconds=600, here=here
    )


def beat(a: Admission, host: str, capacity: int = 1) -> list[Any]:
    """A sandbox worker of `host` on the shared lane and its host's home lane."""
    return a.heartbeat(
        "sandbox", f"w@{host}", {SHARED: capacity, home_lane(SHARED, host): capacity}, 10_000
    )
