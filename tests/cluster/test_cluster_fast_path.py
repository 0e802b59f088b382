"""The fast path's start-up self-test in real workers (broker/fast_path.py).

A worker that does not pass it (here: one started with VESSEL_FAST_PATH=off, which
cannot vouch for envelopes) turns the fast path off on the broker while it runs:
a client that was already sending envelopes keeps getting its calls through (admission
hands them back to be published with send_task), new clients send none, and the one
log line in the worker says why. When the worker stops, the report expires.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import celery
import kombu
import pytest

from broker import fast_path
from broker.admission.keys import FAST_PATH_OFF_KEY
from broker.client import VesselClient
from broker.config import Settings
from broker.loading import load_deployment

from .conftest import Cluster

#: Whether this venv's kombu and Celery are ones the envelope is known to work on.
KNOWN = (
    fast_path.release(kombu.__version__) in fast_path.KNOWN_KOMBU
    and fast_path.release(celery.__version__) in fast_path.KNOWN_CELERY
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]


def _client(cluster: Cluster, switch: str) -> VesselClient:
    env = {**cluster.env, "VESSEL_FAST_PATH": switch}
    return VesselClient(load_deployment(cluster.deployment_path), Settings.from_environ(env))


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_worker_reports_whether_it_consumes_envelopes_and_calls_run(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster({"svc-fp-on": {}}, VESSEL_FAST_PATH="on")
    cluster.start_worker("service", "-c", "2", name="fpon")
    log = (cluster.workspaces.parent / "fpon.log").read_text()
    client = _client(cluster, "on")
    try:
        assert client.fast_path.enabled is KNOWN
        if KNOWN:  # the self-test passed: nothing reported, no log line
            assert cluster.redis.get(FAST_PATH_OFF_KEY) is None
            assert "fast path off" not in log
        else:  # kombu before 5.7: the worker cannot build a probe, so it fails the test
            reported = cluster.redis.get(FAST_PATH_OFF_KEY)
            assert reported is not None and kombu.__version__ in reported
            assert f"fast path off: {reported}" in log
        result = client.call("svc-fp-on", "work", {"n": 1}, owner="web/alice", timeout=30)
        assert result.outcome == "ok", result.output
    finally:
        client.close()


def test_a_worker_that_cannot_vouch_for_envelopes_turns_the_fast_path_off(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster({"svc-fp": {}}, VESSEL_FAST_PATH="off")
    early = _client(cluster, "on")  # decided before any worker reported
    try:
        proc = cluster.start_worker("service", "-c", "2", name="fpoff")
        assert cluster.redis.get(FAST_PATH_OFF_KEY) == "VESSEL_FAST_PATH=off"
        log = (cluster.workspaces.parent / "fpoff.log").read_text()
        lines = [line for line in log.splitlines() if "fast path off" in line]
        assert len(lines) == 1 and "VESSEL_FAST_PATH=off" in lines[0], log
        # The early client's envelope is not pushed; the call is published with send_task.
        result = early.call("svc-fp", "work", {"n": 2}, owner="web/alice", timeout=30)
        assert result.outcome == "ok", result.output
        late = _client(cluster, "on")
        try:
            # Its own version check comes first where the envelope is unknown.
            reported = "a worker reported: VESSEL_FAST_PATH=off"
            if KNOWN:
                assert late.fast_path.reason == reported
            else:
                assert kombu.__version__ in late.fast_path.reason
            result = late.call("svc-fp", "work", {"n": 3}, owner="web/alice", timeout=30)
            assert result.outcome == "ok", result.output
        finally:
            late.close()
        cluster.kill(proc, signal.SIGTERM)
        # Three heartbeats (0.5 s each here) after the worker stopped, the report is gone.
        _wait(lambda: cluster.redis.get(FAST_PATH_OFF_KEY) is None, 10, "the report stayed")
    finally:
        early.close()
