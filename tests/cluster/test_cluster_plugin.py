"""A real plugin worker process against a real Redis: plugin calls end to end (the
initiator, host.fetch to a real server), the agent's max_concurrent_calls across the
worker's threads, cancel of a running call, and the workspace shared with a sandbox worker.

One cluster for the module: one plugin worker (4 threads) and one sandbox worker.
host.workspace runs on the turn's home host (the sandbox worker); across two hosts see
test_cluster_plugin_workspace.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.redis_server import free_port
from broker.request import Initiator

from .conftest import (
    REPO,
    Cluster,
    Recorder,
    check_deployment,
    cluster_env,
    serve,
    start_redis,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

SOURCE = """\
globalThis.manifest = { egress: ["127.0.0.1"] };

globalThis.tools.echo = {
  description: "Return the input and what started the turn.",
  handler: (input, context) => ({ input, initiator: context.initiator }),
};

globalThis.tools.work = {
  description: "Ask the test server to do some work.",
  handler: async (input) => {
    const answer = await host.fetch({
      url: input.url,
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Vessel-Agent": input.agent },
      body: JSON.stringify({ n: input.n, sleep: input.sleep || 0 }),
    });
    return JSON.parse(answer.body);
  },
};

globalThis.tools.wait = {
  description: "Wait a long time.",
  handler: () => new Promise((resolve) => setTimeout(resolve, 60000)),
};

globalThis.tools.note = {
  description: "Save a note in the turn's workspace.",
  handler: async (input) => host.workspace.write({ path: "notes/n.md", content: input.text }),
};
"""

READ_NOTE_PY = 'import os; print(open(os.path.join(os.environ["HOME"], "notes/n.md")).read())\n'


def _write(folder: Path, port: int) -> Path:
    plugin = folder / "plugins" / "probe"
    (plugin / "src").mkdir(parents=True)
    (plugin / "plugin.toml").write_text('slug = "probe"\nsources = ["src/probe.js"]\n')
    (plugin / "src" / "probe.js").write_text(SOURCE)
    box = folder / "boxpkg"
    (box / "tools").mkdir(parents=True)
    (box / "vessel.toml").write_text('[tools]\ndeclared = ["tools/read_note.toml"]\n')
    (box / "tools" / "read_note.py").write_text(READ_NOTE_PY)
    (box / "tools" / "read_note.toml").write_text(
        'name = "read_note"\ndescription = "Read notes/n.md."\n'
        'command = ["python3", "{package}/tools/read_note.py"]\n'
    )
    (folder / "data").mkdir()
    path = folder / "deployment.toml"
    path.write_text(
        f'[[plugins]]\npackage = "plugins/probe"\nprivate_egress = ["127.0.0.1:{port}"]\n\n'
        '[[agents]]\nid = "plug-a"\npackage = "boxpkg"\n[agents.mounts]\n"/data" = "data"\n\n'
        '[[agents]]\nid = "plug-one"\npackage = "boxpkg"\nmax_concurrent_calls = 1\n'
        '[agents.mounts]\n"/data" = "data"\n'
    )
    check_deployment(path)
    return path


@pytest.fixture(scope="module")
def work_url(cluster: Cluster) -> str:
    return str(cluster.env["PROBE_WORK_URL"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:

    folder = tmp_path_factory.mktemp("plugin-cluster")
    redis_proc, url = start_redis(folder)
    recorder = Recorder()
    server = serve(recorder)
    deployment = _write(folder, server.server_address[1])
    workspaces = folder / "workspaces"
    env = cluster_env(url, workspaces)
    # Where the `work` tool posts (passed in its arguments).
    env["PROBE_WORK_URL"] = f"http://127.0.0.1:{server.server_address[1]}/work"
    found = Cluster(
        url=url, deployment_path=deployment, env=env, recorder=recorder, workspaces=workspaces
    )
    try:
        metrics = free_port()
        env["PROBE_METRICS_PORT"] = str(metrics)
        plugin = found.start_worker(
            "plugin", "--concurrency", "4", "--metrics-port", str(metrics), name="plug1", wait=False
        )
        box = found.start_worker("sandbox", "--concurrency", "2", name="box1", wait=False)
        found.wait_registered("plug1", plugin)
        found.wait_registered("box1", box)
        yield found
    finally:
        found.stop_all()
        server.shutdown()
        server.server_close()
        redis_proc.terminate()
        redis_proc.wait(10)


def test_a_plugin_call_runs_end_to_end_with_its_initiator(cluster: Cluster) -> None:
    client = cluster.client()
    handle = client.submit(
        "plug-a",
        "probe__echo",
        {"q": 1},
        owner="web/alice",
        initiator=Initiator(kind="schedule", is_verified_person=True),
    )
    result = handle.result(timeout=30)
    assert result.outcome == "ok", result.output
    assert json.loads(result.output) == {
        "input": {"q": 1},
        "initiator": {"kind": "schedule", "isVerifiedPerson": True},
    }
    client.close()


def test_host_fetch_reaches_the_server_through_the_worker(cluster: Cluster, work_url: str) -> None:
    client = cluster.client()
    url = work_url
    result = client.call(
        "plug-a",
        "probe__work",
        {"url": url, "agent": "plug-a", "n": "fetched"},
        owner="web/alice",
        timeout=30,
    )
    assert result.outcome == "ok", result.output
    assert json.loads(result.output)["n"] == "fetched"
    assert cluster.recorder.count("fetched") == 1
    client.close()


def test_max_concurrent_calls_holds_for_plugin_calls(cluster: Cluster, work_url: str) -> None:
    client = cluster.client()
    url = work_url
    handles = [
        client.submit(
            "plug-one",
            "probe__work",
            {"url": url, "agent": "plug-one", "n": f"one-{i}", "sleep": 0.3},
            owner="web/alice",
        )
        for i in range(4)
    ]
    results = [h.result(timeout=60) for h in handles]
    assert all(r.outcome == "ok" for r in results), [r.output for r in results]
    # The worker has 4 threads; the agent's limit of 1 keeps its calls one at a time.
    assert cluster.recorder.peak["plug-one"] == 1
    assert cluster.recorder.count("one-3") == 1
    client.close()


def test_cancel_of_a_running_plugin_call(cluster: Cluster) -> None:
    client = cluster.client()
    handle = client.submit("plug-a", "probe__wait", {}, owner="web/alice")
    deadline = time.monotonic() + 20
    while not cluster.redis.exists(f"vessel:claim:{handle.call_id}"):
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.05)
    time.sleep(0.3)  # inside the handler by now
    assert client.cancel(handle.call_id) is True
    # The handler waits 60 s: a result within 10 s means the cancel stopped it.
    result = handle.result(timeout=10)
    assert result.outcome == "cancelled" and result.output == "[cancelled]"
    # The worker serves the next call.
    after = client.call("plug-a", "probe__echo", {}, owner="web/alice", timeout=30)
    assert after.outcome == "ok", after.output
    client.close()


def test_a_declared_tool_of_the_turn_reads_what_the_plugin_wrote(cluster: Cluster) -> None:
    client = cluster.client()
    wrote = client.call(
        "plug-a", "probe__note", {"text": "seen at the weir"}, owner="web/alice", turn="t-n"
    )
    assert wrote.outcome == "ok", wrote.output
    read = client.call("plug-a", "read_note", {}, owner="web/alice", turn="t-n", timeout=30)
    assert read.outcome == "ok", read.output
    assert read.output.strip() == "seen at the weir"
    client.close()


def test_plugin_calls_are_counted_with_kind_plugin(cluster: Cluster) -> None:
    client = cluster.client()
    assert client.call("plug-a", "probe__echo", {}, owner="web/alice", timeout=30).outcome == "ok"
    client.close()
    port = cluster.env["PROBE_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert (
        'vessel_calls_total{agent="plug-a",kind="plugin",outcome="ok",tool="probe__echo"}' in text
    )


def test_a_plugin_worker_refuses_to_start_without_a_settings_variable(
    cluster: Cluster, tmp_path: Path
) -> None:
    text = cluster.deployment_path.read_text().replace(
        "\n\n[[agents]]", '\n[plugins.settings]\napi_key = "env:PROBE_API_KEY"\n\n[[agents]]', 1
    )
    edited = cluster.deployment_path.with_name("deployment-secret.toml")
    edited.write_text(text)
    env = {k: v for k, v in cluster.env.items() if k != "PROBE_API_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "plugin", "-d", str(edited)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "PROBE_API_KEY is not set" in done.stderr
    assert "'api_key'" in done.stderr
