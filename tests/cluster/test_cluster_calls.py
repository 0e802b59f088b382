"""Real workers, real Redis: calls of both kinds end to end, a duplicated message,
max_concurrent_calls across two worker processes, fairness, and cancel.

One cluster for the module: two service workers (2 threads each) and one sandbox
worker (2 threads).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import pytest

from broker.admission.keys import call_key
from broker.queues import TASK_NAMES, shared_lane
from workers.sandbox.workspace import WorkspaceStore

from .conftest import REPO, Cluster, processes_with

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    # Celery's Redis result backend calls redis-py's deprecated setex.
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

AGENTS = {
    "svc-a": {},
    "svc-fair-a": {},
    "svc-fair-b": {},
    "svc-two": {"max_concurrent_calls": 2},
    "svc-one": {"max_concurrent_calls": 1},
    "svc-ded": {},
    "box": {},
}


@pytest.fixture(scope="module")
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    found = make_cluster(AGENTS)
    started = {
        name: found.start_worker(kind, "--concurrency", "2", name=name, wait=False)
        for name, kind in (("svc1", "service"), ("svc2", "service"), ("box1", "sandbox"))
    }
    for name, proc in started.items():
        found.wait_registered(name, proc)
    return found


def test_a_service_call_runs_end_to_end(cluster: Cluster) -> None:
    client = cluster.client()
    result = client.call("svc-a", "work", {"n": "e2e"}, owner="web/alice", timeout=20)
    assert result.outcome == "ok" and not result.is_error
    assert json.loads(result.output) == {
        "n": "e2e",
        "owner": "web/alice",
        "agent": "svc-a",
        "tool": "work",
    }
    client.close()


def test_a_declared_call_runs_end_to_end_confined(cluster: Cluster) -> None:
    client = cluster.client()
    result = client.call("box", "echo", {"x": 1}, owner="issuer|subject", timeout=20)
    assert result.outcome == "ok", result.output
    assert json.loads(result.output) == {"got": {"x": 1}}
    assert result.exit_code == 0
    client.close()


def test_bad_arguments_come_back_as_a_refused_result(cluster: Cluster) -> None:
    client = cluster.client()
    result = client.call("box", "echo", "[1, 2]", owner="web/alice", timeout=20)
    assert result.outcome == "refused" and result.is_error
    assert "must be a JSON object" in result.output
    client.close()


def test_arguments_json_does_not_have_are_refused_by_the_worker(cluster: Cluster) -> None:
    # Text goes to the worker unparsed; it refuses NaN and deep nesting as arguments.
    client = cluster.client()
    nan = client.call("box", "echo", '{"x": NaN}', owner="web/alice", timeout=20)
    assert (nan.outcome, nan.is_error) == ("refused", True)
    assert (
        nan.output
        == "echo: the arguments hold NaN, which is not JSON; call echo again with valid JSON."
    )
    deep = client.call(
        "box", "echo", '{"x": ' + "[" * 5000 + "]" * 5000 + "}", owner="web/a", timeout=20
    )
    assert deep.outcome == "refused" and "nested more than 64 levels" in deep.output
    client.close()


def test_a_duplicated_message_runs_the_tool_once(cluster: Cluster) -> None:
    client = cluster.client()
    n = f"dup-{uuid.uuid4().hex[:6]}"
    handle = client.submit("svc-one", "work", {"n": n, "sleep": 0.5}, owner="web/alice")
    message = json.loads(cluster.redis.get(call_key(handle.call_id)) or "{}")
    assert message["call_id"] == handle.call_id
    # The same task id published twice more, by hand, while the first one runs.
    for _ in range(2):
        client.app.send_task(
            TASK_NAMES["service"],
            args=[message],
            task_id=handle.call_id,
            queue=shared_lane("service"),
        )
    first = handle.result(timeout=20)
    # And once more after the result is stored: it must not overwrite it.
    client.app.send_task(
        TASK_NAMES["service"], args=[message], task_id=handle.call_id, queue=shared_lane("service")
    )
    # Every copy taken and acked (the lane empty, kombu's `unacked` hash holding
    # none of them): each was turned away by then, or it would have run.
    deadline = time.monotonic() + 30
    while cluster.redis.llen(shared_lane("service")) or cluster.redis.hlen("unacked"):
        assert time.monotonic() < deadline, "the duplicate messages were never consumed"
        time.sleep(0.05)
    assert cluster.recorder.count(n) == 1
    assert client.result(handle.call_id, timeout=1) == first
    client.close()


def test_max_concurrent_calls_holds_across_two_worker_processes(cluster: Cluster) -> None:
    client = cluster.client()
    handles = [
        client.submit("svc-two", "work", {"n": f"two-{i}", "sleep": 0.4}, owner="web/alice")
        for i in range(10)
    ]
    holders: set[str] = set()
    redis = cluster.redis
    pending = set(h.call_id for h in handles)
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        for call_id in list(pending):
            holder = redis.get(f"vessel:claim:{call_id}")
            if holder:
                holders.add(holder.split("@")[0])
            if redis.exists(f"vessel:done:{call_id}"):
                pending.discard(call_id)
        time.sleep(0.02)
    results = [h.result(timeout=10) for h in handles]
    assert all(r.outcome == "ok" for r in results)
    # Four threads could run them (2 workers x 2); the agent's limit keeps it to 2,
    # and both worker processes took part.
    assert cluster.recorder.peak["svc-two"] == 2
    assert holders == {"svc1", "svc2"}
    client.close()


def test_a_late_agent_is_not_stuck_behind_a_busy_one(cluster: Cluster) -> None:
    client = cluster.client()
    a = [
        client.submit(
            "svc-fair-a", "work", {"n": f"fa-{i}", "sleep": 0.25}, owner="web/a", turn="fa"
        )
        for i in range(1000)
    ]
    # A's calls that finished while A's 1,000 were still being submitted do not
    # count against B (on a loaded machine that takes seconds): B had not come yet.
    finished_before_b = len(cluster.recorder.finished())
    b = [
        client.submit("svc-fair-b", "work", {"n": f"fb-{i}", "sleep": 0.25}, owner="web/b")
        for i in range(10)
    ]
    for handle in b:
        assert handle.result(timeout=60).outcome == "ok"
    order = [r.agent for r in cluster.recorder.finished()[finished_before_b:]]
    order = [agent for agent in order if agent.startswith("svc-fair")]
    last_b = max(i for i, agent in enumerate(order) if agent == "svc-fair-b")
    a_done_before = order[:last_b].count("svc-fair-a")
    cancelled = client.cancel_turn("fa")
    # A's remaining calls are cancelled so the module's workers are free again.
    outcomes = [h.result(timeout=60).outcome for h in a]
    print(f"fairness: {a_done_before} of A's calls finished before B's 10th")
    assert a_done_before < 49, f"{a_done_before} of A's calls finished before B's last"
    assert cancelled > 900
    assert outcomes.count("cancelled") == cancelled or outcomes.count("cancelled") > 900
    client.close()


def test_cancel_of_a_queued_call_never_starts_it(cluster: Cluster) -> None:
    client = cluster.client()
    first = client.submit("svc-one", "work", {"n": "q-first", "sleep": 3}, owner="web/alice")
    queued = client.submit("svc-one", "work", {"n": "q-second"}, owner="web/alice")
    assert client.cancel(queued.call_id) is True
    result = queued.result(timeout=5)
    # Answered at the cancel, not when the call ahead of it freed the agent's one slot.
    assert "q-first" not in [r.n for r in cluster.recorder.finished()]
    assert result.outcome == "cancelled" and result.output == "[cancelled]" and result.is_error
    assert first.result(timeout=20).outcome == "ok"
    time.sleep(0.5)
    assert cluster.recorder.count("q-second") == 0
    assert client.cancel(queued.call_id) is False  # finished: nothing to cancel
    client.close()


def test_cancel_of_a_running_declared_call_kills_its_process_tree(cluster: Cluster) -> None:
    client = cluster.client()
    marker = f"{4000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    handle = client.submit("box", "spin", {"marker": marker}, owner="web/alice")
    deadline = time.monotonic() + 20
    while not processes_with(marker):
        assert time.monotonic() < deadline, "the tool's grandchild never started"
        time.sleep(0.05)
    started = time.monotonic()
    assert client.cancel(handle.call_id) is True
    result = handle.result(timeout=10)
    assert time.monotonic() - started < 3
    assert result.outcome == "cancelled" and result.output == "[cancelled]"
    deadline = time.monotonic() + 3
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []
    client.close()


def test_the_call_command_uses_the_real_workers_when_a_broker_is_set(cluster: Cluster) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "workers.cli", "call", "-d", str(cluster.deployment_path)),
            *("svc-a", "work", '{"n": "cli"}', "--owner", "web/bob", "--timeout", "30"),
        ],
        env=cluster.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["owner"] == "web/bob"
    assert cluster.recorder.count("cli") == 1


def test_a_dedicated_worker_takes_its_agents_calls(cluster: Cluster) -> None:
    proc = cluster.start_worker("service", "--agents", "svc-ded", "-c", "2", name="ded")
    client = cluster.client()
    try:
        handles = [
            client.submit("svc-ded", "work", {"n": f"ded-{i}", "sleep": 0.3}, owner="web/a")
            for i in range(4)
        ]
        holders = set()
        while not all(cluster.redis.exists(f"vessel:done:{h.call_id}") for h in handles):
            for h in handles:
                holder = cluster.redis.get(f"vessel:claim:{h.call_id}")
                if holder:
                    holders.add(holder.split("@")[0])
            time.sleep(0.02)
        assert all(h.result(timeout=10).outcome == "ok" for h in handles)
        assert holders == {"ded"}
        # Other agents stay on the shared lane, which the dedicated worker does not consume.
        other = client.submit("svc-a", "work", {"n": "not-ded", "sleep": 0.3}, owner="web/a")
        holder = None
        while not cluster.redis.exists(f"vessel:done:{other.call_id}"):
            holder = cluster.redis.get(f"vessel:claim:{other.call_id}") or holder
            time.sleep(0.02)
        assert holder is not None and not holder.startswith("ded@")
    finally:
        client.close()
        cluster.kill(proc, signal.SIGTERM)
    assert proc.returncode == 0  # warm shutdown


def test_end_turn_removes_the_turns_workspace_on_the_sandbox_host(cluster: Cluster) -> None:
    client = cluster.client()
    turn = f"turn-{uuid.uuid4().hex[:8]}"
    assert client.call("box", "echo", {}, owner="web/a", turn=turn, timeout=20).outcome == "ok"
    # Named by an HMAC under the root's secret, as every worker of that root names it.
    workspace = WorkspaceStore(cluster.workspaces).turn_dir("box", turn)
    assert workspace.is_dir()
    client.end_turn(turn)
    deadline = time.monotonic() + 5
    while workspace.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not workspace.exists()
    client.close()
