"""Turn affinity: homes, home lanes, moved calls, dead homes, the agent's limit
across its lanes (`broker.admission`, "Turns and homes"). Several hosts exist
only in Redis, so most rules here run on the Redis scripts; what both
admissions share runs on both. The cluster tests run the same with real workers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from broker.admission import Admission, Claim, LocalAdmission, RedisAdmission
from broker.admission.keys import home_key
from broker.queues import home_lane

from .conftest import HOME_A, HOME_B, SHARED, beat, is_redis, lanes
from .conftest import claim_at as claim
from .conftest import submit_in_turn as submit


@pytest.fixture
def admission(redis_url: str) -> Iterator[RedisAdmission]:
    """Here `admission` is the Redis one: the rules below need several hosts."""
    found = RedisAdmission.from_url(redis_url)
    yield found
    found.close()


@pytest.fixture(params=["redis", "in_process"])
def either(request: pytest.FixtureRequest) -> Iterator[Admission]:
    """Both admissions, for the rules of one host."""
    if request.param == "in_process":
        yield LocalAdmission()
        return
    found = RedisAdmission.from_url(request.getfixturevalue("redis_url"))
    yield found
    found.close()


def test_on_one_host_a_turns_calls_run_there_and_end_turn_forgets_them(
    either: Admission,
) -> None:
    beat(either, "host-a")
    assert lanes(submit(either, "c1")) == [("c1", SHARED)]
    assert claim(either, "c1", "host-a") == Claim(outcome="run")
    either.release("c1")
    # Redis sends the turn's next call to its home's lane; in one process the
    # one host is every turn's home, and there are no home lanes.
    later = HOME_A if is_redis(either) else SHARED
    assert lanes(submit(either, "c2")) == [("c2", later)]
    assert claim(either, "c2", "host-a") == Claim(outcome="run")
    assert either.route_turn("sandbox", "a", "t1") == later
    assert either.take_home("a", "t1", HOME_A, home_ttl_seconds=600, here=True, seen=True) == (
        HOME_A,
        0,
    )
    assert either.turn_calls("t1") == ["c1", "c2"]
    either.end_turn("t1", ["a"])
    assert either.turn_calls("t1") == []
    assert either.route_turn("sandbox", "a", "t1") == SHARED


def test_the_first_claim_makes_the_home_and_later_calls_go_to_its_lane(
    admission: RedisAdmission, redis_url: str
) -> None:
    beat(admission, "host-a")
    beat(admission, "host-b")
    assert lanes(submit(admission, "c1")) == [("c1", SHARED)]
    assert claim(admission, "c1", "host-a") == Claim(outcome="run")
    found = redis.Redis.from_url(redis_url, decode_responses=True)
    assert found.hget(home_key("a", "t1"), "lane") == HOME_A
    assert 0 < found.ttl(home_key("a", "t1")) <= 600
    found.close()
    assert lanes(submit(admission, "c2")) == [("c2", HOME_A)]
    # A call without a turn, and one of another turn, still take the shared lane.
    assert lanes(submit(admission, "c3", turn=None)) == [("c3", SHARED)]
    assert lanes(submit(admission, "c4", turn="t2")) == [("c4", SHARED)]


def test_a_call_that_reached_another_host_is_put_back_for_the_home(
    admission: RedisAdmission,
) -> None:
    beat(admission, "host-a")
    beat(admission, "host-b")
    # Two calls of a new turn, dispatched together before either is claimed.
    assert lanes(submit(admission, "c1") + submit(admission, "c2")) == [
        ("c1", SHARED),
        ("c2", SHARED),
    ]
    assert claim(admission, "c1", "host-a").outcome == "run"
    moved = claim(admission, "c2", "host-b")
    assert moved.outcome == "moved" and not moved.workspace_lost
    assert lanes(moved.dispatched) == [("c2", HOME_A)]
    assert claim(admission, "c2", "host-a").outcome == "run"


def test_a_dead_home_rehomes_the_turn_with_the_workspace_lost(admission: RedisAdmission) -> None:
    beat(admission, "host-a")
    beat(admission, "host-b")
    submit(admission, "c1")
    assert claim(admission, "c1", "host-a").outcome == "run"
    admission.release("c1")
    # host-a's last worker leaves (a warm shutdown; a SIGKILL lets its beat expire).
    admission.heartbeat("sandbox", "w@host-a", {SHARED: 0, HOME_A: 0}, 10_000)
    assert lanes(submit(admission, "c2")) == [("c2", SHARED)]
    taken = claim(admission, "c2", "host-b")
    assert taken == Claim(outcome="run", workspace_lost=True, rehomed=True)
    admission.release("c2")
    # Said once: the turn's next call at its new home is an ordinary one.
    assert lanes(submit(admission, "c3")) == [("c3", HOME_B)]
    assert claim(admission, "c3", "host-b") == Claim(outcome="run")


def test_calls_queued_for_a_dead_home_move_and_run_elsewhere(admission: RedisAdmission) -> None:
    beat(admission, "host-a")
    beat(admission, "host-b")
    submit(admission, "c0")
    assert claim(admission, "c0", "host-a").outcome == "run"
    admission.finish("c0", "w@host-a", 600)
    admission.release("c0")
    # host-a's home lane takes 1 + slack 2; the other two wait in its queue.
    sent = [d for i in range(1, 6) for d in submit(admission, f"c{i}")]
    assert lanes(sent) == [(f"c{i}", HOME_A) for i in (1, 2, 3)]
    assert claim(admission, "c1", "host-a").outcome == "run"  # running when host-a dies
    admission.heartbeat("sandbox", "w@host-a", {SHARED: 0, HOME_A: 0}, 10_000)
    dispatched, _ = admission.recover("sandbox")
    # Queued (c4, c5) and dispatched-but-unclaimed (c2, c3) calls go to the
    # shared lane, oldest first; c1 waits for its lease like any running call.
    assert sorted(lanes(dispatched)) == [(f"c{i}", SHARED) for i in (2, 3, 4)]
    first = claim(admission, "c2", "host-b")
    assert first.outcome == "run" and first.workspace_lost and first.rehomed
    assert claim(admission, "c3", "host-b") == Claim(outcome="run")
    assert claim(admission, "c4", "host-b") == Claim(outcome="run")


def test_the_agents_limit_holds_across_its_home_lanes_and_the_shared_lane(
    admission: RedisAdmission,
) -> None:
    beat(admission, "host-a", 4)
    beat(admission, "host-b", 4)
    for turn, host in (("ta", "host-a"), ("tb", "host-b")):
        submit(admission, f"{turn}-0", turn=turn, limit=2)
        assert claim(admission, f"{turn}-0", host).outcome == "run"
    running = {"ta-0", "tb-0"}
    dispatched = []
    for i in range(1, 6):
        dispatched += submit(admission, f"ta-{i}", turn="ta", limit=2)
        dispatched += submit(admission, f"tb-{i}", turn="tb", limit=2)
        dispatched += submit(admission, f"free-{i}", turn=None, limit=2)
    assert dispatched == []  # two run already: the limit
    order = []
    while running:
        call_id = sorted(running)[0]
        running.discard(call_id)
        admission.finish(call_id, "w", 600)
        for d in admission.release(call_id):
            host = "host-a" if d.lane == HOME_A else "host-b"
            assert claim(admission, d.call_id, host).outcome == "run"
            running.add(d.call_id)
            order.append(d)
        assert len(running) <= 2
    assert len(order) == 15
    # Each turn's calls on its own home lane, the others on the shared lane.
    assert {d.lane for d in order if d.call_id.startswith("ta")} == {HOME_A}
    assert {d.lane for d in order if d.call_id.startswith("tb")} == {HOME_B}
    assert {d.lane for d in order if d.call_id.startswith("free")} == {SHARED}


def test_a_home_lanes_round_robin_keeps_a_turn_to_its_agents_share(
    admission: RedisAdmission,
) -> None:
    beat(admission, "host-a", 1)
    for agent in ("a", "b"):
        submit(admission, f"{agent}-0", agent, turn=f"t-{agent}")
        assert claim(admission, f"{agent}-0", "host-a").outcome == "run"
        admission.finish(f"{agent}-0", "w", 600)
    for agent in ("a", "b"):
        admission.release(f"{agent}-0")
    sent = []
    for i in range(1, 20):
        sent += submit(admission, f"a-{i}", "a", turn="t-a")
    for i in range(1, 4):
        sent += submit(admission, f"b-{i}", "b", turn="t-b")
    assert [d.lane for d in sent] == [HOME_A] * 3  # window 1 + slack 2, all a's
    order = []
    for d in sent:
        order += admission.release(d.call_id)
    # Then the home lane's ring alternates a and b: b waits one window, no more.
    assert [d.call_id for d in order] == ["a-4", "b-1", "a-5"]


def test_redis_losing_a_home_the_client_saw_is_said_unless_the_folder_is_here(
    admission: RedisAdmission,
) -> None:
    beat(admission, "host-a")
    submit(admission, "c1", seen=True)
    taken = claim(admission, "c1", "host-a", here=False)
    assert taken.workspace_lost and taken.rehomed
    submit(admission, "c2", turn="t2", seen=True)
    assert claim(admission, "c2", "host-a", here=True) == Claim(outcome="run")


def test_workspace_operations_route_to_the_home_and_leave_the_note_owed(
    admission: RedisAdmission,
) -> None:
    beat(admission, "host-a")
    beat(admission, "host-b")
    assert admission.route_turn("sandbox", "a", "t1") == SHARED
    assert admission.take_home("a", "t1", HOME_A, home_ttl_seconds=600, here=False, seen=False) == (
        HOME_A,
        0,
    )
    assert admission.route_turn("sandbox", "a", "t1") == HOME_A
    # Arriving at the wrong host: told where the home is.
    assert admission.take_home("a", "t1", HOME_B, home_ttl_seconds=600, here=False, seen=True) == (
        HOME_A,
        0,
    )
    admission.heartbeat("sandbox", "w@host-a", {SHARED: 0, HOME_A: 0}, 10_000)
    assert admission.route_turn("sandbox", "a", "t1") == SHARED
    assert admission.take_home("a", "t1", HOME_B, home_ttl_seconds=600, here=False, seen=True) == (
        HOME_B,
        2,
    )
    # The next call still tells the model, once.
    submit(admission, "c1")
    assert claim(admission, "c1", "host-b") == Claim(outcome="run", workspace_lost=True)
    admission.release("c1")
    submit(admission, "c2")
    assert claim(admission, "c2", "host-b") == Claim(outcome="run")


def test_a_call_queued_for_a_home_lane_can_be_cancelled(admission: RedisAdmission) -> None:
    beat(admission, "host-a")
    submit(admission, "c0")
    assert claim(admission, "c0", "host-a").outcome == "run"
    for i in range(1, 5):
        submit(admission, f"c{i}")  # c1..c3 dispatched to host-a's home lane, c4 queued
    outcome, message = admission.cancel("c4", 600)
    assert outcome == "queued" and message is not None


def test_end_turn_forgets_the_home(admission: RedisAdmission) -> None:
    beat(admission, "host-a")
    submit(admission, "c1")
    claim(admission, "c1", "host-a")
    admission.end_turn("t1", ["a", "other"])
    assert admission.route_turn("sandbox", "a", "t1") == SHARED


def test_the_embedded_admission_is_every_turns_home() -> None:
    local = LocalAdmission()
    local.heartbeat("sandbox", "embedded", {SHARED: 2}, 0)
    [first] = submit(local, "c1")
    assert first.lane == SHARED
    assert local.claim_at_home(
        "c1", "embedded", 5_000, host_id="h", home_ttl_seconds=600, here=False
    ) == Claim(outcome="run")
    assert local.route_turn("sandbox", "a", "t1") == SHARED
    assert local.take_home("a", "t1", "mine", home_ttl_seconds=1, here=False, seen=True) == (
        "mine",
        0,
    )


def test_dedicated_workers_have_home_lanes_of_their_own(admission: RedisAdmission) -> None:
    dedicated = "vessel.sandbox.a"
    beat(admission, "host-s")
    admission.heartbeat(
        "sandbox", "d@host-d", {dedicated: 1, home_lane(dedicated, "host-d"): 1}, 10_000
    )
    assert lanes(submit(admission, "c1")) == [("c1", dedicated)]
    assert claim(admission, "c1", "host-d") == Claim(outcome="run")
    assert lanes(submit(admission, "c2")) == [("c2", "vessel.sandbox.a@host-d")]
    # Another agent's turn stays with the shared workers and their home lanes.
    assert lanes(submit(admission, "o1", "other")) == [("o1", SHARED)]
    assert claim(admission, "o1", "host-s").outcome == "run"
    assert lanes(submit(admission, "o2", "other")) == [("o2", home_lane(SHARED, "host-s"))]
    # The dedicated host stops: its turns go back to the shared workers, lost.
    admission.heartbeat(
        "sandbox", "d@host-d", {dedicated: 0, home_lane(dedicated, "host-d"): 0}, 10_000
    )
    admission.recover("sandbox")
    assert lanes(submit(admission, "c3")) == [("c3", SHARED)]
    taken = claim(admission, "c3", "host-s")
    assert taken.workspace_lost and taken.rehomed


def test_a_host_is_one_workspace_root(tmp_path) -> None:
    import socket

    from broker.errors import ConfigError
    from workers.preflight import host_id_from_environ
    from workers.sandbox.workspace import DEFAULT_WORKSPACE_ROOT
    from workers.worker import lanes_for

    assert host_id_from_environ({"VESSEL_HOST_ID": "box-3"}) == "box-3"
    with pytest.raises(ConfigError, match="VESSEL_HOST_ID"):
        host_id_from_environ({"VESSEL_HOST_ID": "a@b"})
    # Unset: the hostname for the default root; two other roots are two hosts,
    # and processes sharing a root agree.
    plain = host_id_from_environ({}, DEFAULT_WORKSPACE_ROOT)
    assert plain == socket.gethostname()
    one, two = (host_id_from_environ({}, tmp_path / n) for n in ("one", "two"))
    assert len({plain, one, two}) == 3
    assert host_id_from_environ({}, tmp_path / "one") == one
    assert lanes_for("sandbox", None, "h") == ["vessel.sandbox", "vessel.sandbox@h"]
    assert lanes_for("sandbox", ["a"], "h") == ["vessel.sandbox.a", "vessel.sandbox.a@h"]
    assert lanes_for("service", None) == ["vessel.service"]
