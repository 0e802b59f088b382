"""The client API against a real Redis with no worker running: what submit refuses,
waiting, and cancel of calls that are still queued. Settings from the environment."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import redis
from conftest import EXAMPLES

from broker.admission.publish import publish
from broker.client import VesselClient
from broker.config import Settings
from broker.errors import CallTimeout, ConfigError, MissingBrokerURL, UnknownAgent, UnknownTool
from broker.loading import load_deployment

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")


@pytest.fixture
def client(redis_url: str) -> Iterator[VesselClient]:
    deployment = load_deployment(EXAMPLES / "deployment.toml")
    found = VesselClient(deployment, Settings(broker_url=redis_url))
    yield found
    found.close()


def test_submit_refuses_what_the_platform_got_wrong(client: VesselClient, redis_url: str) -> None:
    with pytest.raises(UnknownAgent):
        client.submit("nobody", "species", {}, owner="web/alice")
    with pytest.raises(UnknownTool):
        client.submit("field-guide", "nothing", {}, owner="web/alice")
    with pytest.raises(ValueError, match="neither"):
        client.submit("field-guide", "species", {}, owner="alice")
    assert redis.Redis.from_url(redis_url).keys("vessel:call:*") == []


def test_bad_arguments_are_not_refused_at_submit(client: VesselClient) -> None:
    handle = client.submit("field-guide", "species", "[not json", owner="web/alice")
    assert len(handle.call_id) == 32


def test_waiting_longer_than_the_timeout_raises_call_timeout(client: VesselClient) -> None:
    handle = client.submit("field-guide", "species", {}, owner="web/alice")
    with pytest.raises(CallTimeout, match=handle.call_id):
        handle.result(timeout=0.2)


def test_a_queued_call_cancelled_gets_its_result_at_once(client: VesselClient) -> None:
    handle = client.submit("field-guide", "species", {}, owner="web/alice", turn="t-1")
    assert handle.cancel() is True
    result = handle.result(timeout=1)
    assert (result.output, result.outcome, result.is_error) == ("[cancelled]", "cancelled", True)
    assert (result.agent, result.tool, result.call_id) == ("field-guide", "species", handle.call_id)
    assert handle.cancel() is False  # it has its result
    assert client.cancel("no-such-call") is False


def test_cancel_turn_cancels_every_unfinished_call_of_the_turn(client: VesselClient) -> None:
    handles = [
        client.submit("field-guide", "species", {}, owner="web/alice", turn="t-2") for _ in range(3)
    ]
    other = client.submit("field-guide", "species", {}, owner="web/alice", turn="t-3")
    assert client.cancel_turn("t-2") == 3
    assert all(h.result(timeout=1).outcome == "cancelled" for h in handles)
    with pytest.raises(CallTimeout):
        other.result(timeout=0.1)
    assert client.cancel_turn("t-2") == 0


def test_settings_come_from_the_environment_and_hide_passwords() -> None:
    settings = Settings.from_environ({"VESSEL_BROKER_URL": "redis://:hunter22@redis:6379/0"})
    assert settings.backend_url == "redis://:hunter22@redis:6379/0"
    assert "hunter22" not in repr(settings) and "hunter22" not in str(settings)
    assert Settings.from_environ({}).embedded
    with pytest.raises(ConfigError, match="VESSEL_BROKER_URL"):
        Settings.from_environ({"VESSEL_BROKER_URL": "amqp://rabbit"})
    with pytest.raises(ConfigError, match="VESSEL_LEASE_GRACE_SECONDS"):
        Settings.from_environ({"VESSEL_LEASE_GRACE_SECONDS": "soon"})
    both = Settings.from_environ(
        {"VESSEL_BROKER_URL": "redis://a/0", "VESSEL_RESULT_BACKEND": "redis://b/1"}
    )
    assert both.backend_url == "redis://b/1"


@pytest.mark.parametrize(
    ("variable", "url", "said"),
    [
        # kombu has no transport for it: a worker would end in a traceback.
        ("VESSEL_BROKER_URL", "unix:///run/redis.sock", "Redis over a Unix socket"),
        # kombu would check no certificate; Celery's result backend refuses it.
        ("VESSEL_BROKER_URL", "rediss://:pw@r:6380/0", "?ssl_cert_reqs=required"),
        ("VESSEL_RESULT_BACKEND", "rediss://r:6380/1?ssl_ca_certs=/ca.pem", "ssl_cert_reqs"),
    ],
)
def test_a_redis_url_kombu_or_celery_would_mishandle_is_refused_saying_why(
    variable: str, url: str, said: str
) -> None:
    env = {"VESSEL_BROKER_URL": "redis://a/0", variable: url}
    with pytest.raises(ConfigError, match=rf"^{variable}=.*{re.escape(said)}") as caught:
        Settings.from_environ(env)
    assert ":pw@" not in str(caught.value)
    tls = "rediss://r:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem"
    assert Settings.from_environ({"VESSEL_BROKER_URL": tls}).backend_url == tls


def test_a_client_needs_a_broker() -> None:
    deployment = load_deployment(EXAMPLES / "deployment.toml")
    with pytest.raises(MissingBrokerURL, match="VESSEL_BROKER_URL is not set") as caught:
        VesselClient(deployment, Settings())
    assert isinstance(caught.value, ConfigError)


def _lane_ids(redis_url: str, lane: str) -> list[str]:
    """Task ids of the messages waiting in a lane, oldest first (kombu LPUSHes, BRPOPs)."""
    with redis.Redis.from_url(redis_url) as r:
        return [json.loads(m)["headers"]["id"] for m in reversed(r.lrange(lane, 0, -1))]


def _finished(client: VesselClient, call_id: str, output: str, *, in_one_script: bool):
    from broker.admission.finish import finish_call
    from broker.result import ToolResult

    result = ToolResult(
        call_id=call_id, agent="field-guide", tool="species", is_error=False, output=output
    )
    return finish_call(
        client.app,
        client.admission,
        result,
        hostname="w1",
        ttl_seconds=600,
        in_one_script=in_one_script,
    )


@pytest.mark.parametrize("in_one_script", [True, False])
def test_a_result_is_stored_once_readable_through_celery_and_frees_the_slot(
    client: VesselClient, redis_url: str, in_one_script: bool
) -> None:
    from celery.result import AsyncResult

    from broker.admission.finish import results_in_admission
    from broker.queues import shared_lane

    # The default: results go to the broker's Redis, so one script can write them.
    assert results_in_admission(client.app, client.admission) is True
    limit = client.deployment.agent("field-guide").max_concurrent_calls
    # A live worker of capacity 1: its lane takes 1 + a slack of 2 calls.
    client.admission.heartbeat("sandbox", "w1", {shared_lane("sandbox"): 1}, 10_000)
    handles = [
        client.submit("field-guide", "species", {}, owner="web/alice") for _ in range(limit + 4)
    ]
    first = handles[0].call_id
    lane = shared_lane("sandbox")
    assert _lane_ids(redis_url, lane) == [h.call_id for h in handles[:3]]
    assert client.admission.claim(first, "w1", 60_000) == "run"
    stored, dispatched = _finished(client, first, "first", in_one_script=in_one_script)
    assert stored is True
    # The freed place goes to the next call: pushed into the lane by admission
    # (the fast path), or returned for the worker to publish with send_task.
    if client.fast_path.enabled:
        assert dispatched == []
    else:
        assert [d.call_id for d in dispatched] == [handles[3].call_id]
        publish(client.app, dispatched)
    assert _lane_ids(redis_url, lane)[-1] == handles[3].call_id
    # A second result for the same call (a duplicate delivery) changes nothing.
    again, _ = _finished(client, first, "second", in_one_script=in_one_script)
    assert again is False
    assert handles[0].result(timeout=1).output == "first"
    # Celery reads it as its own: state, result, expiry.
    assert AsyncResult(first, app=client.app).state == "SUCCESS"
    assert AsyncResult(first, app=client.app).result["output"] == "first"
    key = client.app.backend.get_key_for_task(first)
    ttl = redis.Redis.from_url(redis_url).ttl(key)
    assert 0 < ttl <= int(client.settings.result_expires_seconds)


def test_results_in_another_redis_are_stored_through_celery(
    redis_url: str, redis_server: str
) -> None:
    from broker.admission.finish import results_in_admission

    deployment = load_deployment(EXAMPLES / "deployment.toml")
    other = f"{redis_server}/62"
    found = VesselClient(deployment, Settings(broker_url=redis_url, result_backend=other))
    try:
        assert results_in_admission(found.app, found.admission) is False
    finally:
        found.close()


# --- the model's arguments refused at submit: a stored result, never an exception ---


def _refused_at_submit(client: VesselClient, redis_url: str, arguments: object) -> str:
    handle = client.submit("field-guide", "species", arguments, owner="web/alice", turn="t-9")
    result = handle.result(timeout=1)
    assert (result.outcome, result.is_error, result.call_id) == ("refused", True, handle.call_id)
    assert (result.agent, result.tool) == ("field-guide", "species")
    # Nothing was queued for a worker.
    assert redis.Redis.from_url(redis_url).keys("vessel:call:*") == []
    return result.output


def test_arguments_over_the_cap_are_refused_at_submit(client: VesselClient, redis_url: str) -> None:
    big = {"habitat": "x" * 1_000_000}  # 1,000,014 bytes as compact JSON
    assert _refused_at_submit(client, redis_url, big) == (
        "species: the arguments are 1000014 bytes; at most 1000000 bytes may be given; "
        "call species again with smaller arguments."
    )


def test_text_arguments_are_measured_in_utf8_bytes(client: VesselClient, redis_url: str) -> None:
    text = '{"habitat": "' + "é" * 500_000 + '"}'  # 500,015 characters, 1,000,015 bytes
    assert "are 1000015 bytes" in _refused_at_submit(client, redis_url, text)


def test_arguments_at_the_cap_are_queued(client: VesselClient) -> None:
    exact = {"habitat": "x" * (1_000_000 - 14)}
    handle = client.submit("field-guide", "species", exact, owner="web/alice")
    with pytest.raises(CallTimeout):  # queued: no worker runs here
        handle.result(timeout=0.1)


def test_deeply_nested_arguments_are_refused_at_submit(
    client: VesselClient, redis_url: str
) -> None:
    # json.dumps of the call's message raised RecursionError here before.
    deep: dict[str, object] = {}
    for _ in range(5000):
        deep = {"a": deep}
    text = _refused_at_submit(client, redis_url, deep)
    assert text == (
        "species: the arguments are nested more than 64 levels deep; "
        "call species again with flatter arguments."
    )


@pytest.mark.parametrize(
    ("value", "name"),
    [(float("nan"), "NaN"), (float("inf"), "Infinity"), (float("-inf"), "-Infinity")],
)
def test_non_finite_floats_are_refused_at_submit(
    client: VesselClient, redis_url: str, value: float, name: str
) -> None:
    text = _refused_at_submit(client, redis_url, {"habitat": [1.5, value]})
    assert text == f"species: the arguments hold {name}, which is not JSON; " + (
        "call species again with valid JSON."
    )


def test_an_integer_python_cannot_print_is_refused_at_submit(
    client: VesselClient, redis_url: str
) -> None:
    # json.dumps raised ValueError (Python's int-digits limit) here before.
    text = _refused_at_submit(client, redis_url, {"habitat": 10**100000})
    assert "an integer of more than 4300 digits" in text


def test_arguments_json_cannot_encode_are_refused_at_submit(
    client: VesselClient, redis_url: str
) -> None:
    text = _refused_at_submit(client, redis_url, {"habitat": {1, 2}})
    assert (
        text == "species: the arguments must be a JSON object; call species again with valid JSON."
    )
