"""The operator's verbs against a real Redis and real worker processes:
`agents`, `status`, `result`, `cancel`, `end-turn`; Ctrl-C during `call` (real
SIGINT to a real subprocess, on the workers and on the embedded default); the
live status line on a terminal (a pty) and its absence elsewhere.

One cluster for the module: one sandbox worker (2 threads).
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import REPO, Cluster, files_named, processes_with

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    # Celery's Redis result backend calls redis-py's deprecated setex.
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

AGENTS = {"box-one": {"max_concurrent_calls": 1}, "box": {}, "svc-x": {}}


@pytest.fixture(scope="module")
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    found = make_cluster(AGENTS, timeout=60)
    found.start_worker("sandbox", "--concurrency", "2", name="verbs")
    return found


def cli(
    cluster: Cluster, *args: str, embedded: bool = False, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    env = dict(cluster.env)
    if embedded:
        env.pop("VESSEL_BROKER_URL", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            args[0],
            "-d",
            str(cluster.deployment_path),
            *args[1:],
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        **kwargs,
    )


def wait_until(probe: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_agents_lists_tool_counts_kinds_and_limits(cluster: Cluster) -> None:
    done = cli(cluster, "agents", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["id"]: r for r in json.loads(done.stdout)}
    assert rows["box-one"]["kinds"] == {"sandbox": 4} and rows["box-one"]["tools"] == 4
    assert rows["box-one"]["max_concurrent_calls"] == 1
    assert rows["svc-x"]["kinds"] == {"service": 1}
    assert rows["box"]["tool_timeout_seconds"] == 60
    table = cli(cluster, "agents")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["AGENT", "TOOLS", "KINDS"]
    assert any(
        line.split()[:3] == ["box-one", "4", "sandbox:4"] for line in table.stdout.splitlines()
    )


def test_status_result_and_cancel_of_an_agent_blocked_at_its_limit(cluster: Cluster) -> None:
    client = cluster.client()
    try:
        running = client.submit("box-one", "count", {"n": 1, "sleep": 50}, owner="web/a")
        wait_until(lambda: cluster.redis.exists(f"vessel:claim:{running.call_id}"), "a start")
        queued = [
            client.submit("box-one", "count", {"n": n}, owner="web/a").call_id for n in (2, 3)
        ]
        done = cli(cluster, "status", "--json")
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        workers = [w for w in status["workers"] if w["name"].startswith("verbs@")]
        lanes = {w["lane"] for w in workers}
        assert "vessel.sandbox" in lanes
        assert any(lane.startswith("vessel.sandbox@") for lane in lanes), lanes
        assert all(w["concurrency"] == 2 for w in workers)
        assert all(abs(time.time() - w["last_heartbeat"]) < 30 for w in workers), workers
        agents = {a["id"]: a for a in status["agents"]}
        assert agents["box-one"]["queued"] == 2 and agents["box-one"]["running"] == 1
        assert agents["box-one"]["blocked"] is True
        assert agents["box-one"]["oldest_queued_seconds"] is not None
        assert agents["box"] == {
            "id": "box",
            "queued": 0,
            "running": 0,
            "blocked": False,
            "oldest_queued_seconds": None,
        }
        table = cli(cluster, "status")
        assert table.returncode == 0 and "box-one" in table.stdout and "yes" in table.stdout

        # cancel: 0 for a queued call, 1 once it has finished, 2 for an unknown id.
        first = cli(cluster, "cancel", queued[0])
        assert first.returncode == 0, first.stderr
        assert "cancelled" in first.stdout
        again = cli(cluster, "cancel", queued[0])
        assert again.returncode == 1 and "already finished" in again.stderr, again.stderr
        unknown = cli(cluster, "cancel", uuid.uuid4().hex)
        assert unknown.returncode == 2 and "no call" in unknown.stderr, unknown.stderr

        # result: the cancelled one (exit 1), unknown (2).
        cancelled = cli(cluster, "result", queued[0])
        assert cancelled.returncode == 1 and cancelled.stdout == "[cancelled]\n", cancelled
        assert cli(cluster, "result", uuid.uuid4().hex).returncode == 2

        # The running call: cancelled where it runs (exit 0), its result [cancelled];
        # then the last queued one runs, and `result` waits for it (exit 0).
        stop = cli(cluster, "cancel", running.call_id)
        assert stop.returncode == 0 and "stopped where it runs" in stop.stdout, stop
        stopped = cli(cluster, "result", running.call_id, "--json")
        assert stopped.returncode == 1, stopped.stderr
        assert json.loads(stopped.stdout)["outcome"] == "cancelled"
        last = cli(cluster, "result", queued[1])
        assert last.returncode == 0 and last.stdout == "counted 3\n", last
    finally:
        client.close()


def test_end_turn_removes_the_turn_workspace_on_the_sandbox_host(cluster: Cluster) -> None:
    client = cluster.client()
    turn = f"turn-{uuid.uuid4().hex[:8]}"
    marker = f"mark-{uuid.uuid4().hex}.txt"
    try:
        result = client.call(
            "box", "ws", {"write": {marker: "x"}}, owner="web/a", turn=turn, timeout=30
        )
        assert result.outcome == "ok", result.output
    finally:
        client.close()

    def found() -> list[str]:
        return [str(p) for p in files_named(cluster.workspaces, marker)]

    assert found(), "the tool's file is in the turn's workspace"
    done = cli(cluster, "end-turn", turn)
    assert done.returncode == 0 and turn in done.stdout, done.stderr
    wait_until(lambda: not found(), "the workspace to be removed")


def _spawn_call(cluster: Cluster, *args: str, embedded: bool, **kwargs: Any) -> Any:
    env = dict(cluster.env)
    if embedded:
        env.pop("VESSEL_BROKER_URL", None)
        env["VESSEL_WORKSPACE_ROOT"] = str(cluster.workspaces.parent / "embedded-root")
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "workers.cli", "call", "-d", str(cluster.deployment_path)),
            *args,
        ],
        env=env,
        cwd=REPO,
        **kwargs,
    )


@pytest.mark.parametrize("embedded", [False, True], ids=["workers", "embedded"])
def test_ctrl_c_during_call_cancels_it_and_exits_130(cluster: Cluster, embedded: bool) -> None:
    marker = f"{900 + int(uuid.uuid4().int % 99)}.{uuid.uuid4().int % 10**6}"
    proc = _spawn_call(
        cluster,
        "box",
        "spin",
        json.dumps({"marker": marker}),
        embedded=embedded,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: processes_with(marker), "the tool's grandchild", timeout=60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("vessel-workers call: interrupted: call "), err
    assert lines[-1].endswith(" cancelled"), err
    assert out == ""
    wait_until(lambda: not processes_with(marker), "the cancelled call's processes to be gone")


def _on_a_terminal(cluster: Cluster, *args: str) -> tuple[subprocess.Popen[str], str, str]:
    """Run `call ARGS` with stderr on a pty; (process, stdout, what the terminal got)."""
    main, secondary = pty.openpty()
    proc = _spawn_call(
        cluster,
        *args,
        embedded=False,
        stdout=subprocess.PIPE,
        stderr=secondary,
        text=True,
    )
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # the child closed its end
                    break
                if not chunk:
                    break
                seen += chunk
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
    return proc, out, seen.decode(errors="replace")


def test_live_status_on_a_terminal_says_running_on_which_worker(cluster: Cluster) -> None:
    proc, out, text = _on_a_terminal(cluster, "box", "count", json.dumps({"n": 7, "sleep": 2}))
    assert proc.returncode == 0, text
    assert out == "counted 7\n"
    assert "running on verbs@" in text, text
    assert " s" in text and "call " in text
    assert text.endswith("\r\x1b[K"), repr(text[-80:])  # the line is erased before the result


def test_no_status_line_with_json_even_on_a_terminal(cluster: Cluster) -> None:
    args = ("box", "count", json.dumps({"n": 9, "sleep": 1}), "--json")
    proc, out, text = _on_a_terminal(cluster, *args)
    assert proc.returncode == 0, text
    assert json.loads(out)["output"] == "counted 9\n"
    assert text == "", repr(text)


def test_no_status_line_when_stderr_is_not_a_terminal(cluster: Cluster) -> None:
    done = cli(cluster, "call", "box", "count", json.dumps({"n": 8, "sleep": 1}))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "counted 8\n" and done.stderr == ""


def test_the_worker_banner_says_what_applies_not_celery_advice(cluster: Cluster) -> None:
    log = (cluster.workspaces.parent / "verbs.log").read_text(errors="replace")
    assert "[vessel]" in log, log[-3000:]
    assert ".> kind:        sandbox" in log
    assert ".> cgroups:     " in log and "VESSEL_SANDBOX_CGROUPS" in log
    assert "confinement: checked at start" in log
    assert "task events: on request" in log
    # Celery's advice for `celery worker`, which `vessel-workers worker` does not take.
    assert "enable -E" not in log, log[-3000:]
    assert "--uid" not in log and "superuser privileges" not in log, log[-3000:]
    if os.geteuid() == 0:
        assert "running as root, which the sandbox allows" in log
