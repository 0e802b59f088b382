"""A call id admission already knows is one error, DuplicateCall, in both admissions."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import EXAMPLES

from broker.admission import Admission, RedisAdmission
from broker.client import VesselClient
from broker.config import Settings
from broker.embedded import LocalAdmission
from broker.errors import DuplicateCall, TransientError, VesselError
from broker.loading import load_deployment


@pytest.fixture(params=["redis", "local"])
def admission(request: pytest.FixtureRequest) -> Iterator[Admission]:
    if request.param == "local":
        yield LocalAdmission()
        return
    found = RedisAdmission.from_url(request.getfixturevalue("redis_url"))
    yield found
    found.close()


def _submit(a: Admission, call_id: str) -> None:
    message = json.dumps({"call_id": call_id, "agent": "a", "tool": "t", "owner": "a/b"})
    a.submit(
        call_id=call_id,
        kind="service",
        agent="a",
        message=message,
        limit=1,
        lease_ms=60_000,
        turn=None,
        ttl_seconds=600,
    )


def test_a_queued_call_id_is_a_duplicate(admission: Admission) -> None:
    _submit(admission, "x1")
    with pytest.raises(DuplicateCall, match="call id 'x1' is already known") as caught:
        _submit(admission, "x1")
    assert caught.value.call_id == "x1"
    # A "never works" error: not to be retried as broker trouble.
    assert isinstance(caught.value, VesselError)
    assert not isinstance(caught.value, (TransientError, ValueError))


def test_a_finished_call_id_is_a_duplicate(admission: Admission) -> None:
    _submit(admission, "x2")
    admission.heartbeat("service", "w1", {"vessel.service": 1}, 10_000)
    assert admission.claim("x2", "w1", 60_000) == "run"
    assert admission.finish("x2", "w1", 600)
    admission.release("x2")
    with pytest.raises(DuplicateCall):
        _submit(admission, "x2")


def test_the_client_raises_it_for_a_reused_id(redis_url: str) -> None:
    client = VesselClient(
        load_deployment(EXAMPLES / "deployment.toml"), Settings(broker_url=redis_url)
    )
    try:
        client.submit("field-guide", "species", {}, owner="web/alice", call_id="c" * 32)
        with pytest.raises(DuplicateCall):
            client.submit("field-guide", "species", {}, owner="web/alice", call_id="c" * 32)
    finally:
        client.close()
