"""Admission's rules, checked on both implementations: the Redis scripts and the
in-process one of the embedded default must agree (round-robin, limits, windows,
claims, the done guard, cancel, leases). Prepared messages (the fast path) are
Redis's alone."""

from __future__ import annotations

import json
import time

import redis

from broker.admission import Admission, LocalAdmission, RedisAdmission

from .conftest import LANE, ids, submit


def test_nothing_is_dispatched_without_a_live_worker(admission: Admission) -> None:
    assert submit(admission, "a1", "a") == []
    # A worker registering capacity 1 gets 1 + the slack of 2.
    assert ids(admission.heartbeat("service", "w1", {LANE: 1}, 10_000)) == ["a1"]


def test_round_robin_lets_a_late_agent_through_after_one_window(admission: Admission) -> None:
    for i in range(20):
        submit(admission, f"a{i}", "a")
    for i in range(3):
        submit(admission, f"b{i}", "b")
    first = ids(admission.heartbeat("service", "w1", {LANE: 2}, 10_000))
    assert first == ["a0", "b0", "a1", "b1"]  # window 2 + slack 2, alternating
    order = []
    for call_id in first:
        order += ids(admission.release(call_id))
    assert order == ["a2", "b2", "a3", "a4"]


def test_the_agent_limit_blocks_and_a_release_unblocks(admission: Admission) -> None:
    admission.heartbeat("service", "w1", {LANE: 10}, 10_000)
    got = [ids(submit(admission, f"a{i}", "a", limit=2)) for i in range(4)]
    assert got == [["a0"], ["a1"], [], []]
    assert ids(admission.release("a0")) == ["a2"]
    assert ids(admission.release("a0")) == []  # a second release frees nothing
    assert ids(admission.release("a1")) == ["a3"]


def test_a_dedicated_lane_takes_the_agent_while_its_worker_lives(admission: Admission) -> None:
    admission.heartbeat("service", "shared", {LANE: 4}, 10_000)
    admission.heartbeat("service", "mine", {"vessel.service.a": 1}, 10_000)
    [dispatched] = submit(admission, "a1", "a")
    assert dispatched.lane == "vessel.service.a"
    [other] = submit(admission, "b1", "b")
    assert other.lane == LANE


def test_claim_runs_a_call_once_and_finish_keeps_the_first_result(
    admission: Admission,
) -> None:
    admission.heartbeat("service", "w1", {LANE: 4}, 10_000)
    submit(admission, "a1", "a")
    assert admission.claim("a1", "w1", 5_000) == "run"
    assert admission.claim("a1", "w2", 5_000) == "busy"
    assert admission.finish("a1", "w1", 600) is True
    assert admission.finish("a1", "w2", 600) is False
    admission.release("a1")
    assert admission.claim("a1", "w3", 5_000) == "done"


def test_cancel_takes_a_queued_call_out_and_signals_a_dispatched_one(
    admission: Admission,
) -> None:
    seen: list[str] = []
    subscription = admission.listen_cancels(seen.append)
    try:
        admission.heartbeat("service", "w1", {LANE: 1}, 10_000)
        for i in range(4):
            submit(admission, f"a{i}", "a", turn="t1")  # a0..a2 dispatched, a3 queued
        outcome, message = admission.cancel("a3", 600)
        assert outcome == "queued"
        assert message is not None and json.loads(message)["call_id"] == "a3"
        assert admission.cancel("a0", 600) == ("signalled", None)
        assert admission.claim("a0", "w1", 5_000) == "cancelled"
        assert admission.cancel("nope", 600) == ("unknown", None)
        assert admission.turn_calls("t1") == ["a0", "a1", "a2", "a3"]
        # The queued call never comes out again.
        released = []
        for call_id in ("a0", "a1", "a2"):
            released += ids(admission.release(call_id))
        assert "a3" not in released
        deadline = time.monotonic() + 5
        while "a0" not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "a0" in seen
    finally:
        subscription.close()


def test_recovery_requeues_a_call_whose_lease_expired(redis_admission: RedisAdmission) -> None:
    admission = redis_admission
    admission.heartbeat("service", "w1", {LANE: 1}, 10_000)
    admission.submit(
        call_id="a1",
        kind="service",
        agent="a",
        message=json.dumps({"call_id": "a1"}),
        limit=1,
        lease_ms=200,
        turn=None,
        ttl_seconds=600,
    )
    assert admission.claim("a1", "dead-worker", 200) == "run"
    assert submit(admission, "a2", "a", limit=1) == []  # the dead worker holds the slot
    time.sleep(0.3)
    dispatched, finished = admission.recover("service")
    # a1 goes back to the head of the queue and is dispatched again; a2 waits.
    assert ids(dispatched) == ["a1"] and finished == []
    assert admission.claim("a1", "w2", 5_000) == "run"


def test_in_process_nothing_expires_and_nothing_is_recovered() -> None:
    """The in-process admission dies with its one worker: a lease never runs out
    there, so the slot stays held until the call is released (Redis: above)."""
    admission = LocalAdmission()
    admission.heartbeat("service", "w1", {LANE: 1}, 10_000)
    submit(admission, "a1", limit=1, lease_ms=1)
    assert admission.claim("a1", "w1", 1) == "run"
    assert submit(admission, "a2", limit=1) == []
    assert admission.recover("service") == ([], [])
    assert ids(admission.release("a1")) == ["a2"]


def test_admission_keys_live_under_the_vessel_prefix(
    redis_admission: RedisAdmission, redis_url: str
) -> None:
    admission = redis_admission
    admission.heartbeat("service", "w1", {LANE: 1}, 10_000)
    submit(admission, "a1", "a", turn="t")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert client.keys("*") and all(k.startswith("vessel:") for k in client.keys("*"))
    client.close()


def test_recovery_releases_a_call_done_whose_worker_died_before_releasing(
    redis_admission: RedisAdmission,
) -> None:
    admission = redis_admission
    admission.heartbeat("service", "w1", {LANE: 1}, 10_000)
    message = json.dumps({"call_id": "a1", "agent": "a", "tool": "t", "owner": "a/b"})
    admission.submit(
        call_id="a1",
        kind="service",
        agent="a",
        message=message,
        limit=1,
        lease_ms=200,
        turn=None,
        ttl_seconds=600,
    )
    submit(admission, "a2", "a", limit=1)  # waits for a1's slot
    assert admission.claim("a1", "w1", 200) == "run"
    assert admission.finish("a1", "w1", 600)
    time.sleep(0.3)  # the worker died before release()
    dispatched, finished = admission.recover("service")
    assert finished == [("a1", message)]
    assert ids(dispatched) == ["a2"]  # the slot came back
    assert admission.claim("a1", "w2", 5_000) == "done"


def _enveloped(admission: RedisAdmission, app, call_id: str, agent: str, **kw):
    from broker.envelope import build_envelope

    message = {"call_id": call_id, "agent": agent, "tool": "t", "owner": "a/b"}
    envelope = build_envelope(app, "service", call_id, message)
    assert envelope is not None
    return admission.submit(
        call_id=call_id,
        kind="service",
        agent=agent,
        message=json.dumps(message),
        limit=kw.get("limit", 100),
        lease_ms=kw.get("lease_ms", 60_000),
        turn=None,
        ttl_seconds=600,
        envelope=envelope,
    )


def _waiting(redis_url: str, lane: str) -> list[dict]:
    """The kombu messages waiting in a lane, oldest first."""
    client = redis.Redis.from_url(redis_url)
    found = [json.loads(m) for m in reversed(client.lrange(lane, 0, -1))]
    client.close()
    return found


def test_a_prepared_message_is_pushed_into_its_lane_by_admission(redis_url: str) -> None:
    from broker.celery_app import make_app
    from broker.config import Settings

    app = make_app(Settings(broker_url=redis_url))
    admission = RedisAdmission.from_url(redis_url)
    admission.heartbeat("service", "w1", {LANE: 1}, 10_000)
    assert _enveloped(admission, app, "e1", "a", lease_ms=200) == []  # nothing to publish
    [message] = _waiting(redis_url, LANE)
    # What Celery and kombu would have published, with a delivery tag of its own.
    assert message["headers"]["id"] == "e1" and message["headers"]["task"] == "vessel.service_call"
    assert message["properties"]["delivery_info"]["routing_key"] == LANE
    assert message["properties"]["delivery_tag"] == "vessel-e1-1"
    # Delivered again after its lease ran out: a new tag, so kombu's unacked
    # bookkeeping of the first delivery is not mistaken for this one.
    assert admission.claim("e1", "dead-worker", 200) == "run"
    time.sleep(0.3)
    assert admission.recover("service") == ([], [])
    again = _waiting(redis_url, LANE)[-1]
    assert again["headers"]["id"] == "e1"
    assert again["properties"]["delivery_tag"] == "vessel-e1-2"
    app.close()
    admission.close()


def test_a_prepared_message_goes_to_the_dedicated_lane_with_its_routing_key(
    redis_url: str,
) -> None:
    from broker.celery_app import make_app
    from broker.config import Settings

    app = make_app(Settings(broker_url=redis_url))
    admission = RedisAdmission.from_url(redis_url)
    admission.heartbeat("service", "shared", {LANE: 4}, 10_000)
    admission.heartbeat("service", "mine", {"vessel.service.a": 1}, 10_000)
    assert _enveloped(admission, app, "e1", "a") == []
    assert _waiting(redis_url, LANE) == []
    [message] = _waiting(redis_url, "vessel.service.a")
    assert message["properties"]["delivery_info"]["routing_key"] == "vessel.service.a"
    app.close()
    admission.close()
