"""`host.workspace` across hosts: a plugin worker and two sandbox hosts (each its own
VESSEL_HOST_ID and workspace root, as separate machines would be), on a real Redis.

A plugin call's workspace operations run on the turn's home host, so a plugin
call and a declared call of one turn see one folder wherever each runs; the
plugin worker's own workspace root (set, and different from both hosts') stays
empty. The operations take no slot of the agent's `max_concurrent_calls`: a
plugin call holding its agent's only slot works in its workspace without
waiting on itself. The hostile paths are refused on the routed path too, with
the sentences the handler sees.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.admission.keys import home_key

from .conftest import (
    WS_PY,
    Cluster,
    Recorder,
    check_deployment,
    cluster_env,
    files_named,
    start_redis,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

# Each method named literally: a host call's permission is derived from its chain.
SOURCE = """\
async function run(input) {
  // `repeat`: the content made here, larger than a call's arguments may be.
  if (input.repeat) input.args[1] = input.args[1].repeat(input.repeat);
  switch (input.method) {
    case "write": return host.workspace.write(...input.args);
    case "read": return host.workspace.read(...input.args);
    case "list": return host.workspace.list(...input.args);
    case "delete": return host.workspace.delete(...input.args);
  }
  throw new Error("no such method");
}

globalThis.tools.op = {
  description: "One host.workspace operation; its answer or its rejection.",
  handler: async (input) => {
    try {
      return { ok: true, value: await run(input) };
    } catch (error) {
      return { ok: false, error: error.message };
    }
  },
};

globalThis.tools.busy = {
  description: "Many workspace operations in one call.",
  handler: async (input) => {
    for (let i = 0; i < input.rounds; i++) {
      await host.workspace.write({ path: `busy/${i}.txt`, content: `round ${i}` });
      const back = await host.workspace.read(`busy/${i}.txt`);
      if (back.content !== `round ${i}`) throw new Error(`read back ${back.content}`);
      await host.workspace.list("busy");
      await host.workspace.delete(`busy/${i}.txt`);
    }
    await host.workspace.delete("busy");
    return (await host.workspace.list()).entries.map((e) => e.name);
  },
};
"""

HOSTS = ("h1", "h2")


def _write(folder: Path) -> Path:
    plugin = folder / "plugins" / "desk"
    (plugin / "src").mkdir(parents=True)
    (plugin / "plugin.toml").write_text('slug = "desk"\nsources = ["src/desk.js"]\n')
    (plugin / "src" / "desk.js").write_text(SOURCE)
    box = folder / "boxpkg"
    (box / "tools").mkdir(parents=True)
    # disk_limit_mb = 1: no single file of the workspace larger, host.workspace's too.
    (box / "vessel.toml").write_text('disk_limit_mb = 1\n[tools]\ndeclared = ["tools/ws.toml"]\n')
    (box / "tools" / "ws.py").write_text(WS_PY)
    (box / "tools" / "ws.toml").write_text(
        'name = "ws"\ndescription = "Work in the workspace."\n'
        'command = ["python3", "{package}/tools/ws.py"]\n[parameters]\ntype = "object"\n'
    )
    (folder / "data").mkdir()
    path = folder / "deployment.toml"
    path.write_text(
        '[[plugins]]\npackage = "plugins/desk"\n\n'
        '[[agents]]\nid = "desk-a"\npackage = "boxpkg"\n[agents.mounts]\n"/data" = "data"\n\n'
        '[[agents]]\nid = "desk-one"\npackage = "boxpkg"\nmax_concurrent_calls = 1\n'
        '[agents.mounts]\n"/data" = "data"\n'
    )
    check_deployment(path)
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("plugin-ws")
    redis_proc, url = start_redis(folder)
    deployment = _write(folder)
    workspaces = folder / "workspaces"
    # 1 s beats: a loaded machine must not take a live host for dead.
    env = cluster_env(url, workspaces, VESSEL_HEARTBEAT_SECONDS="1")
    found = Cluster(
        url=url, deployment_path=deployment, env=env, recorder=Recorder(), workspaces=workspaces
    )
    try:
        # The plugin worker's own root: host.workspace must never land in it.
        plugin_root = found.root_of("plugin")
        plugin_root.mkdir()
        plugin = found.start_worker(
            "plugin",
            "--concurrency",
            "3",
            name="plug",
            wait=False,
            env={"VESSEL_WORKSPACE_ROOT": str(plugin_root), "VESSEL_HOST_ID": "plugin-host"},
        )
        procs = {host: found.start_host(host, "-c", "2", wait=False) for host in HOSTS}
        found.wait_registered("plug", plugin)
        for host, proc in procs.items():
            found.wait_registered(host, proc)
        yield found
    finally:
        found.stop_all()
        redis_proc.terminate()
        redis_proc.wait(10)


def _turn() -> str:
    return f"turn-{uuid.uuid4().hex[:10]}"


def _op(
    cluster: Cluster, agent: str, turn: str | None, method: str, *args: Any, repeat: int = 0
) -> dict[str, Any]:
    client = cluster.client()
    try:
        result = client.call(
            agent,
            "desk__op",
            {"method": method, "args": list(args), "repeat": repeat},
            owner="web/alice",
            turn=turn,
            timeout=60,
        )
    finally:
        client.close()
    assert result.outcome == "ok", result.output
    return dict(json.loads(result.output))


def _declared(cluster: Cluster, agent: str, turn: str, **arguments: Any) -> dict[str, Any]:
    client = cluster.client()
    try:
        result = client.call(agent, "ws", arguments, owner="web/alice", turn=turn, timeout=60)
    finally:
        client.close()
    assert result.outcome == "ok", result.output
    return dict(json.loads(result.output)["read"])


def _home(cluster: Cluster, agent: str, turn: str) -> str:
    lane = cluster.redis.hget(home_key(agent, turn), "lane")
    assert lane is not None, "the turn has no home"
    return lane.split("@", 1)[1]


def _files_under(root: Path, name: str) -> list[Path]:
    return files_named(root, name)


def test_a_plugin_note_is_read_by_a_declared_call_on_the_home_host(cluster: Cluster) -> None:
    homes: set[str] = set()
    for _ in range(12):  # until each host was the home of one turn
        turn = _turn()
        note, path = f"seen at the weir ({turn})", f"notes/{turn}.md"
        wrote = _op(cluster, "desk-a", turn, "write", {"path": path, "content": note})
        assert wrote == {"ok": True, "value": {"path": path, "size": len(note)}}
        # The plugin's first operation gave the turn its home, as a first call would.
        home = _home(cluster, "desk-a", turn)
        assert _declared(cluster, "desk-a", turn, read=[path]) == {path: note}
        assert _home(cluster, "desk-a", turn) == home
        # The note is on the home host, and only there.
        other = next(h for h in HOSTS if h != home)
        assert len(_files_under(cluster.root_of(home), f"{turn}.md")) == 1
        assert _files_under(cluster.root_of(other), f"{turn}.md") == []
        homes.add(home)
        if homes == set(HOSTS):
            break
    assert homes == set(HOSTS), f"every turn was homed on {homes}"
    assert not files_named(cluster.root_of("plugin"), "*")


def test_a_declared_note_is_read_by_a_plugin_call(cluster: Cluster) -> None:
    homes: set[str] = set()
    for _ in range(12):
        turn = _turn()
        note = f"written by a tool ({turn})"
        assert _declared(cluster, "desk-a", turn, write={"drafts/d.md": note}) == {}
        homes.add(_home(cluster, "desk-a", turn))
        read = _op(cluster, "desk-a", turn, "read", "drafts/d.md")
        value = {"path": "drafts/d.md", "content": note, "size": len(note)}
        assert read == {"ok": True, "value": value}
        listed = _op(cluster, "desk-a", turn, "list", {"path": "drafts"})
        assert listed["value"]["entries"] == [{"name": "d.md", "type": "file", "size": len(note)}]
        # A delete of the plugin reaches the folder the declared tools see.
        assert _op(cluster, "desk-a", turn, "delete", "drafts/d.md")["ok"]
        assert _declared(cluster, "desk-a", turn, read=["drafts/d.md"]) == {"drafts/d.md": None}
        if homes == set(HOSTS):
            break
    assert homes == set(HOSTS), f"every turn was homed on {homes}"


def test_a_call_holding_its_agents_only_slot_does_not_wait_on_itself(cluster: Cluster) -> None:
    client = cluster.client()
    turn = _turn()
    try:
        busy = client.submit("desk-one", "desk__busy", {"rounds": 8}, owner="web/a", turn=turn)
        # The agent's second plugin call waits for the one slot the first holds.
        queued = client.submit(
            "desk-one",
            "desk__op",
            {"method": "write", "args": ["after.txt", "second"]},
            owner="web/a",
            turn=turn,
        )
        result = busy.result(timeout=60)
        assert result.outcome == "ok", result.output
        # 32 operations done while holding the slot; the workspace left as it was.
        assert json.loads(result.output) == []
        second = queued.result(timeout=60)
        assert second.outcome == "ok" and json.loads(second.output)["ok"], second.output
    finally:
        client.close()
    limit = cluster.redis.hget("vessel:plugin:limit", "desk-one")
    assert limit == "1"


@pytest.mark.hostile
def test_hostile_paths_are_refused_on_the_routed_path(cluster: Cluster) -> None:
    turn = _turn()
    outside = "/etc"
    kept = f"d/{turn}.txt"
    assert _declared(cluster, "desk-a", turn, write={kept: "kept"}, link={"etc": outside}) == {}
    home = _home(cluster, "desk-a", turn)

    def refused(method: str, *args: Any, repeat: int = 0) -> str:
        answer = _op(cluster, "desk-a", turn, method, *args, repeat=repeat)
        assert answer["ok"] is False, answer
        return str(answer["error"])

    assert "outside the workspace" in refused("read", "../../etc/passwd")
    assert "is absolute" in refused("write", "/etc/evil", "x")
    # The link a declared tool of the turn left, at the home host: never followed.
    for method, args in (
        ("read", ["etc/passwd"]),
        ("write", ["etc/evil", "x"]),
        ("list", ["etc"]),
        ("delete", ["etc/passwd"]),
    ):
        error = refused(method, *args)
        assert error == f"host.workspace.{method} refused: etc is a symbolic link: not followed"
    assert Path("/etc/passwd").exists() and not Path("/etc/evil").exists()
    # A folder that holds something is not deleted; its file stays.
    assert refused("delete", "d") == "host.workspace.delete failed: the folder d is not empty"
    assert _declared(cluster, "desk-a", turn, read=[kept]) == {kept: "kept"}
    assert refused("read", "nope.txt") == "host.workspace.read failed: nope.txt: no such file"
    # The workspace limit (disk_limit_mb = 1): no file larger, either way.
    big = "x" * (1024 * 1024 + 1)
    assert refused("write", "big.txt", "x", repeat=len(big)) == (
        "host.workspace.write refused: the content is larger than 1,048,576 bytes"
    )
    [file] = _files_under(cluster.root_of(home), f"{turn}.txt")
    (file.parent.parent / "big.txt").write_bytes(big.encode())
    assert refused("read", "big.txt") == (
        "host.workspace.read failed: big.txt is 1,048,577 bytes, over the cap: no file larger "
        "than 1,048,576 bytes"
    )
    # The link itself may go (never its target).
    assert _op(cluster, "desk-a", turn, "delete", "etc")["ok"]
    assert Path("/etc/passwd").exists()


def test_a_call_with_no_turn_has_no_workspace(cluster: Cluster) -> None:
    answer = _op(cluster, "desk-a", None, "write", "a.txt", "x")
    assert answer == {
        "ok": False,
        "error": "host.workspace.write refused: this call has no turn, so it has no workspace "
        "(call it within a turn)",
    }
