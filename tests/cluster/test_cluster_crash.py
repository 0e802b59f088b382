"""SIGKILL of a whole worker (its process group) with calls in flight.

Every call must get its result from the surviving worker, and no delivery may
run a tool a second time. How runs are counted, honestly, on the host side:

* service tools: the test's HTTP server records every request it receives;
* declared tools: a tool cannot write outside its sandbox except into the turn's
  workspace, which is a host folder (VESSEL_WORKSPACE_ROOT); the tool appends
  its call number to `runs.log` there before doing its work.

A call that was running on the killed worker has started once there (its
request was received, its line written) and runs again, once, on the
survivor: that is the redelivery the design promises. So for N calls with K of
them on the killed worker we expect N + K starts, each call at most twice, and
then no more starts at all: the recovery sweep dispatches each of the killed
worker's calls again once its lease runs out (4 s + 1 s here), and the claim
and done guards turn any later delivery away. Admission's messages leave
nothing in kombu's `unacked` hash (broker/transport.py), which the test checks
too: no message of the killed worker may wait there for a visibility timeout.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import celery
import kombu
import pytest

from broker import fast_path

from .conftest import Cluster, files_named, processes_with

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

CALLS = 6
PER_WORKER = 3


#: Whether calls travel as envelopes here (broker/fast_path.py): not on a kombu or
#: Celery the fast path does not know, nor with VESSEL_FAST_PATH=off (scripts/test-range).
ENVELOPES = (
    os.environ.get("VESSEL_FAST_PATH", "on") != "off"
    and fast_path.release(kombu.__version__) in fast_path.KNOWN_KOMBU
    and fast_path.release(celery.__version__) in fast_path.KNOWN_CELERY
)


@pytest.fixture(scope="module")
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    # Lease = tool limit 4 s + grace 1 s; with envelopes, a visibility timeout of
    # 3 s would bring back any message left in kombu's unacked hash while its
    # call still runs. Calls published with send_task do keep kombu's copy: for
    # them a visibility timeout below the lease is the misconfiguration the
    # README warns of, so they get the derived one (limit + 2 x grace).
    extra = {"VESSEL_VISIBILITY_TIMEOUT": "3"} if ENVELOPES else {}
    return make_cluster({"svc-crash": {}, "box-crash": {}}, timeout=4, **extra)


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


#: kombu 5.7 added the unacked_restore_interval/throttle options broker/celery_app.py
#: sets; older kombu looks for expired unacked copies every 10 x 10 s, longer than this
#: test waits. Admission's lease sweep brings the calls back either way; the copies
#: (only those of the killed worker) are restored later and turned away by the claim.
RESTORES_SOON = fast_path.release(kombu.__version__) >= (5, 7)


def _unacked_settled(cluster: Cluster, lane: str = "vessel.service") -> bool:
    # kombu keeps delivered-but-unacked messages in the `unacked` hash until
    # they are acked or restored to their queue.
    left = cluster.redis.hlen("unacked")
    return cluster.redis.llen(lane) == 0 and (left == 0 if RESTORES_SOON else left <= PER_WORKER)


def test_service_calls_of_a_killed_worker_finish_elsewhere_once(cluster: Cluster) -> None:
    victim = cluster.start_worker("service", "-c", str(PER_WORKER), name="victim", wait=False)
    survivor = cluster.start_worker("service", "-c", str(PER_WORKER), name="survivor", wait=False)
    cluster.wait_registered("victim", victim)
    cluster.wait_registered("survivor", survivor)
    client = cluster.client()
    handles = [
        client.submit("svc-crash", "work", {"n": i, "sleep": 2}, owner="web/alice")
        for i in range(CALLS)
    ]
    _wait(lambda: len(cluster.recorder.records) == CALLS, 60, "not every call started")
    cluster.kill(victim)  # SIGKILL to the worker's whole process group
    results = [h.result(timeout=40) for h in handles]
    assert [r.outcome for r in results] == ["ok"] * CALLS
    assert sorted(int(r.output.split('"n": ')[1].split(",")[0]) for r in results) == list(
        range(CALLS)
    )
    # Every late delivery of the killed worker's calls has arrived and been
    # turned away once its lane is empty and kombu's unacked hash holds none of
    # them: calls are acked late, so a run it had started would be over by then.
    _wait(lambda: _unacked_settled(cluster), 30, "unacked messages were never restored")
    starts = collections.Counter(r.n for r in cluster.recorder.records)
    assert max(starts.values()) <= 2
    assert sum(starts.values()) == CALLS + PER_WORKER, starts
    client.close()
    cluster.kill(survivor)


def _runs(workspaces: Path) -> collections.Counter[str]:
    logs = files_named(workspaces, "runs.log")
    return collections.Counter(line for log in logs for line in log.read_text().split())


def test_declared_calls_of_a_killed_worker_finish_elsewhere_once(cluster: Cluster) -> None:
    victim = cluster.start_worker("sandbox", "-c", str(PER_WORKER), name="bvictim", wait=False)
    survivor = cluster.start_worker("sandbox", "-c", str(PER_WORKER), name="bsurvivor", wait=False)
    cluster.wait_registered("bvictim", victim)
    cluster.wait_registered("bsurvivor", survivor)
    client = cluster.client()
    marker = "3210.5"
    handles = [
        client.submit(
            "box-crash",
            "count",
            {"n": str(i), "sleep": 2, "marker": marker},
            owner="web/alice",
            turn="crash",
        )
        for i in range(CALLS)
    ]
    _wait(lambda: sum(_runs(cluster.workspaces).values()) == CALLS, 60, "not every call started")
    cluster.kill(victim)
    # bubblewrap's --die-with-parent: the killed worker's tools die with it;
    # only the survivor's three remain.
    _wait(lambda: len(processes_with(marker)) <= PER_WORKER, 5, "killed worker's tools live on")
    results = [h.result(timeout=40) for h in handles]
    assert [r.outcome for r in results] == ["ok"] * CALLS, [r.output for r in results]
    _wait(  # as above: every late delivery arrived and was turned away
        lambda: _unacked_settled(cluster, "vessel.sandbox"),
        30,
        "unacked messages were never restored",
    )
    runs = _runs(cluster.workspaces)
    assert max(runs.values()) <= 2
    assert sum(runs.values()) == CALLS + PER_WORKER, runs
    _wait(lambda: processes_with(marker) == [], 5, "tool processes left behind")
    client.close()
    cluster.kill(survivor)


def test_sigterm_lets_running_calls_finish(cluster: Cluster) -> None:
    proc = cluster.start_worker("service", "-c", "2", name="graceful")
    client = cluster.client()
    handle = client.submit("svc-crash", "work", {"n": "graceful", "sleep": 1.5}, owner="web/a")
    _wait(lambda: cluster.recorder.count("graceful") == 1, 20, "the call never started")
    cluster.kill(proc, signal.SIGTERM)  # warm shutdown
    assert proc.returncode == 0
    result = handle.result(timeout=5)
    assert result.outcome == "ok" and cluster.recorder.count("graceful") == 1
    client.close()
