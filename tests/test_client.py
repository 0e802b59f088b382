"""The client API against a real Redis with no worker running: what submit refuses,
waiting, and cancel of calls that are still queued. Settings from the environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from conftest import EXAMPLES

from broker.client import VesselClient
from broker.config import Settings
from broker.errors import CallTimeout, ConfigError, UnknownAgent, UnknownTool
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


def test_a_client_needs_a_broker() -> None:
    deployment = load_deployment(EXAMPLES / "deployment.toml")
    with pytest.raises(ValueError, match="VESSEL_BROKER_URL"):
        VesselClient(deployment, Settings())
