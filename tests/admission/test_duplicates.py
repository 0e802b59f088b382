"""A call id admission already knows is one error, DuplicateCall, in both admissions."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES

from broker.admission import Admission
from broker.client import VesselClient
from broker.config import Settings
from broker.errors import DuplicateCall, TransientError, VesselError
from broker.loading import load_deployment

from .conftest import submit


def _submit(a: Admission, call_id: str) -> None:
    submit(a, call_id, limit=1)


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
