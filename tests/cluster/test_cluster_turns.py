"""A turn's workspace follows the turn across hosts: real Redis, real sandbox
workers, each a host of its own (its own VESSEL_HOST_ID and workspace root, as
separate machines would be).

Which host ran a call is read from what the call could see: a host's workspace
root is the only place its tools write, so a call that finds the files of the
turn's earlier calls ran where they did. The turn's home is admission's record
`vessel:home:<agent>:<turn>` (broker/queues.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.admission.keys import home_key
from broker.errors import WorkspaceError
from broker.queues import home_lane
from workers.output import WORKSPACE_LOST_TEXT
from workers.preflight import host_id_from_environ

from .conftest import REPO, Cluster, files_named

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

AGENTS = {
    "box-t": {"max_concurrent_calls": 8},
    "box-fa": {"max_concurrent_calls": 8},
    "box-fb": {"max_concurrent_calls": 8},
    "box-cap": {"max_concurrent_calls": 2},
}
NAMES = ("h1", "h2", "h3")
#: Host ids of `three`: h3 sets none, so it is its hostname and a tag of its root.
HOSTS: list[str] = []


#: A home dies when its host misses three heartbeats: 1 s beats (3 s) rather than
#: the cluster tests' 0.5 s, so a loaded machine does not take a live host for dead.
BEATS = {"VESSEL_HEARTBEAT_SECONDS": "1"}


@pytest.fixture(scope="module")
def three(make_cluster: Callable[..., Cluster]) -> Cluster:
    found = make_cluster(AGENTS, **BEATS)
    procs = {
        name: found.start_host(name, "-c", "2", wait=False, set_id=name != "h3") for name in NAMES
    }
    for name, proc in procs.items():
        found.wait_registered(name, proc)
    HOSTS[:] = ["h1", "h2", host_id_from_environ({}, found.root_of("h3"))]
    return found


def turn_id() -> str:
    return f"turn-{uuid.uuid4().hex[:10]}"


def output(result) -> dict:
    assert result.outcome == "ok", result.output
    return json.loads(result.output.removeprefix(WORKSPACE_LOST_TEXT + "\n"))


def root_of_host(cluster: Cluster, host: str) -> Path:
    """The workspace root of a host of `three` or `two` (by host id)."""
    name = NAMES[HOSTS.index(host)] if host in HOSTS else host
    return cluster.root_of(name)


def home_host(cluster: Cluster, agent: str, turn: str) -> str:
    lane = cluster.redis.hget(home_key(agent, turn), "lane")
    assert lane is not None, "the turn has no home"
    return lane.split("@", 1)[1]


def test_fifty_calls_of_one_turn_all_see_its_files(three: Cluster) -> None:
    client = three.client()
    turn = turn_id()
    # A new turn's first calls, submitted at once: they reach different hosts
    # before any is claimed; all must run on the one that became home.
    first = [
        client.submit("box-t", "ws", {"write": {f"f{i}": str(i)}}, owner="web/a", turn=turn)
        for i in range(6)
    ]
    assert all(not h.result(timeout=60).is_error for h in first)
    names = [f"f{i}" for i in range(6)]
    handles = [
        client.submit("box-t", "ws", {"read": names}, owner="web/a", turn=turn) for _ in range(50)
    ]
    for handle in handles:
        result = handle.result(timeout=60)
        assert not result.workspace_lost
        assert output(result)["read"] == {f"f{i}": str(i) for i in range(6)}
    home = home_host(three, "box-t", turn)
    assert home in HOSTS
    client.close()


def test_twenty_turns_at_once_spread_over_the_hosts(three: Cluster) -> None:
    client = three.client()
    turns = [turn_id() for _ in range(20)]
    written = [
        client.submit("box-t", "ws", {"write": {"mine": t}, "sleep": 0.2}, owner="web/a", turn=t)
        for t in turns
    ]
    assert all(h.result(timeout=60).outcome == "ok" for h in written)
    read = [client.submit("box-t", "ws", {"read": ["mine"]}, owner="web/a", turn=t) for t in turns]
    for turn, handle in zip(turns, read, strict=True):
        assert output(handle.result(timeout=60))["read"] == {"mine": turn}
    homes = {home_host(three, "box-t", t) for t in turns}
    print(f"20 turns homed on {sorted(homes)}")
    assert len(homes) >= 2
    client.close()


def test_files_put_before_a_call_and_got_after_it(three: Cluster) -> None:
    client = three.client()
    turn = turn_id()
    files = client.files("box-t", turn)
    files.put("uploads/note.md", b"from the user\n")
    assert files.list("uploads") == [{"name": "note.md", "size": 14, "kind": "file"}]
    result = client.call(
        "box-t",
        "ws",
        {"read": ["uploads/note.md"], "write": {"report.md": "from the tool"}},
        owner="web/a",
        turn=turn,
        timeout=60,
    )
    assert output(result)["read"] == {"uploads/note.md": "from the user\n"}
    assert files.get("report.md") == b"from the tool"
    names = {entry["name"]: entry["kind"] for entry in files.list()}
    assert names["report.md"] == "file" and names["uploads"] == "dir"
    files.delete("uploads")
    with pytest.raises(WorkspaceError, match="no such folder"):
        files.get("uploads/note.md")
    with pytest.raises(ValueError, match="inside the workspace"):
        files.get("../etc/passwd")
    assert not files.workspace_lost
    # Every operation went to the call's host: a second client sees the same.
    other = three.client()
    assert other.files("box-t", turn).get("report.md") == b"from the tool"
    other.close()
    client.close()


def test_a_symlink_a_tool_left_is_never_followed_by_files(three: Cluster) -> None:
    client = three.client()
    turn = turn_id()
    files = client.files("box-t", turn)
    files.put("marker", b"here")
    host = home_host(three, "box-t", turn)
    # The link a tool would leave (a tool may make links in its workspace).
    [folder] = [p.parent for p in files_named(root_of_host(three, host), "marker")]
    (folder / "etc").symlink_to("/etc")
    with pytest.raises(WorkspaceError, match="symbolic link"):
        files.get("etc/passwd")
    with pytest.raises(WorkspaceError, match="symbolic link"):
        files.put("etc/evil", b"x")
    with pytest.raises(WorkspaceError, match="symbolic link"):
        files.list("etc")
    assert {"name": "etc", "size": 0, "kind": "link"} in files.list()
    files.delete("etc")  # removes the link, not /etc
    assert (folder / "marker").exists() and not (folder / "etc").exists()
    assert Path("/etc/passwd").exists()
    client.close()


def test_end_turn_removes_the_workspace_on_its_home_host(three: Cluster) -> None:
    client = three.client()
    turn = turn_id()
    assert output(
        client.call("box-t", "ws", {"write": {"keep": "1"}}, owner="web/a", turn=turn, timeout=60)
    )
    host = home_host(three, "box-t", turn)
    [folder] = [p.parent for p in files_named(root_of_host(three, host), "keep")]
    client.end_turn(turn)
    deadline = time.monotonic() + 5
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists()
    assert three.redis.exists(home_key("box-t", turn)) == 0
    # The turn starts afresh, without a lost-workspace note: it was ended.
    again = client.call("box-t", "ws", {"read": ["keep"]}, owner="web/a", turn=turn, timeout=60)
    assert output(again)["read"] == {"keep": None} and not again.workspace_lost
    client.close()


def _intervals(log: bytes) -> list[tuple[float, float]]:
    lines = [line.split() for line in log.decode().splitlines()]
    starts = sorted(float(t) for what, t in lines if what == "start")
    ends = sorted(float(t) for what, t in lines if what == "end")
    return list(zip(starts, ends, strict=True))


def _ends(log: bytes) -> list[float]:
    """End times (cancelled calls have a start and no end)."""
    return [float(line.split()[1]) for line in log.decode().splitlines() if line.startswith("end")]


def _peak(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_max_concurrent_calls_holds_with_turns_pinned_on_three_hosts(three: Cluster) -> None:
    client = three.client()
    turns = {host: turn_id() for host in HOSTS}
    for host, turn in turns.items():
        # Each turn homed on a host of its own (the record a first claim writes).
        three.redis.hset(home_key("box-cap", turn), "lane", home_lane("vessel.sandbox", host))
        three.redis.expire(home_key("box-cap", turn), 600)
    handles = [
        client.submit("box-cap", "ws", {"log": "runs.log", "sleep": 0.3}, owner="web/a", turn=t)
        for _ in range(5)
        for t in turns.values()
    ]
    assert all(h.result(timeout=60).outcome == "ok" for h in handles)
    intervals = []
    for host, turn in turns.items():
        assert home_host(three, "box-cap", turn) == host  # pinned, never moved
        intervals += _intervals(client.files("box-cap", turn).get("runs.log"))
    assert len(intervals) == 15
    # Six threads on three hosts could run them; the agent's limit of 2 holds.
    assert _peak(intervals) == 2
    client.close()


def test_a_late_agent_is_not_stuck_behind_a_busy_turn_on_their_home_host(
    three: Cluster,
) -> None:
    client = three.client()
    a_turn, b_turn = turn_id(), turn_id()
    first = client.call("box-fa", "ws", {}, owner="web/a", turn=a_turn, timeout=60)
    assert first.outcome == "ok"
    host = home_host(three, "box-fa", a_turn)
    # B's turn lives on the same host: both share its home lane's round robin.
    three.redis.hset(home_key("box-fb", b_turn), "lane", home_lane("vessel.sandbox", host))
    three.redis.expire(home_key("box-fb", b_turn), 600)
    args = {"log": "ends.log", "sleep": 0.05}
    a = [client.submit("box-fa", "ws", args, owner="web/a", turn=a_turn) for _ in range(200)]
    b = [client.submit("box-fb", "ws", args, owner="web/b", turn=b_turn) for _ in range(10)]
    for handle in b:
        assert handle.result(timeout=60).outcome == "ok"
    cancelled = client.cancel_turn(a_turn)
    for handle in a:
        handle.result(timeout=60)
    b_last = max(_ends(client.files("box-fb", b_turn).get("ends.log")))
    a_ends = _ends(client.files("box-fa", a_turn).get("ends.log"))
    a_before = sum(1 for end in a_ends if end < b_last) - 1  # A's first call came before
    print(f"turn fairness: {a_before} of A's calls finished before B's 10th")
    assert home_host(three, "box-fb", b_turn) == host
    assert a_before < 49, f"{a_before} of A's calls finished before B's last"
    assert cancelled > 100
    client.close()


@pytest.fixture(scope="module")
def two(make_cluster: Callable[..., Cluster]) -> Cluster:
    found = make_cluster({"box-k": {"max_concurrent_calls": 8}}, **BEATS)
    procs = {host: found.start_host(host, "-c", "2", wait=False) for host in ("k1", "k2")}
    for host, proc in procs.items():
        found.wait_registered(host, proc)
    return found


def test_a_killed_home_host_loses_the_workspace_and_says_so(two: Cluster) -> None:
    client = two.client()
    turn = turn_id()
    assert output(
        client.call("box-k", "ws", {"write": {"a.txt": "1"}}, owner="web/a", turn=turn, timeout=60)
    )
    home = home_host(two, "box-k", turn)
    [victim] = [p for p in two.procs if p.args[p.args.index("--hostname") + 1].startswith(home)]
    # Calls running, waiting in the home lane and queued for it when it dies.
    args = {"read": ["a.txt"], "sleep": 1.5}
    handles = [client.submit("box-k", "ws", args, owner="web/a", turn=turn) for _ in range(6)]
    time.sleep(0.5)
    two.kill(victim)  # SIGKILL to the worker's whole process group
    handles.append(client.submit("box-k", "ws", {"read": ["a.txt"]}, owner="web/a", turn=turn))
    results = [h.result(timeout=40) for h in handles]
    assert [r.outcome for r in results] == ["ok"] * 7, [r.output for r in results]
    # Every call ran on the survivor, none found the dead host's file, and the
    # first to take the turn there told the model; after it, the turn goes on.
    assert all(output(r)["read"] == {"a.txt": None} for r in results)
    lost = [r for r in results if r.workspace_lost]
    assert len(lost) == 1 and lost[0].output.startswith(WORKSPACE_LOST_TEXT + "\n")
    assert home_host(two, "box-k", turn) != home
    after = client.call(
        "box-k", "ws", {"write": {"b.txt": "2"}}, owner="web/a", turn=turn, timeout=30
    )
    assert not after.workspace_lost
    assert client.files("box-k", turn).get("b.txt") == b"2"
    client.close()


def test_a_warm_shutdown_finishes_its_calls_then_the_turn_moves_with_the_note(
    two: Cluster,
) -> None:
    # Runs after the kill above: one host is left; start another, home a turn
    # on it, stop it with SIGTERM.
    proc = two.start_host("k3", "-c", "2")
    client = two.client()
    turn = turn_id()
    two.redis.hset(home_key("box-k", turn), "lane", home_lane("vessel.sandbox", "k3"))
    two.redis.expire(home_key("box-k", turn), 600)
    running = client.submit(
        "box-k", "ws", {"write": {"a.txt": "1"}, "sleep": 1.5}, owner="web/a", turn=turn
    )
    deadline = time.monotonic() + 60
    while not files_named(two.root_of("k3"), "a.txt"):
        assert time.monotonic() < deadline, "the call never started on k3"
        time.sleep(0.05)
    two.kill(proc, signal.SIGTERM)
    assert proc.returncode == 0
    assert output(running.result(timeout=5))["read"] == {}  # it finished there
    moved = client.call("box-k", "ws", {"read": ["a.txt"]}, owner="web/a", turn=turn, timeout=30)
    assert moved.workspace_lost and output(moved)["read"] == {"a.txt": None}
    client.close()


def test_the_files_command_works_on_the_turns_home_host(three: Cluster) -> None:
    turn = turn_id()
    client = three.client()
    assert output(
        client.call(
            "box-t", "ws", {"write": {"tool.txt": "t"}}, owner="web/a", turn=turn, timeout=60
        )
    )

    def files(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "workers.cli", "files"),
                *("-d", str(three.deployment_path), "box-t", turn, *args),
            ],
            input=stdin,
            env=three.env,
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )

    listed = files("ls")
    assert listed.returncode == 0, listed.stderr
    assert b"file\t1\ttool.txt" in listed.stdout  # the call's file, from its host
    put = files("put", "up.txt", "-", stdin=b"from the cli")
    assert put.returncode == 0, put.stderr
    assert client.files("box-t", turn).get("up.txt") == b"from the cli"
    client.close()


def test_redis_losing_the_homes_is_said_unless_the_folder_is_on_the_host(two: Cluster) -> None:
    # One host of `two` is kept (the tests above may have killed the other: this
    # test stops any other itself, whatever ran before it); add one, and home a
    # turn on each: `gone` is on the host that dies with Redis's data, `kept` on
    # the host that takes both turns afterwards.
    alive = [
        (name, p)
        for p in two.procs
        if p.poll() is None
        and (name := p.args[p.args.index("--hostname") + 1].split("@")[0]) in ("k1", "k2")
    ]
    assert alive, "no host of `two` is left"
    survivor_host = alive[0][0]
    for _name, other in alive[1:]:
        two.kill(other)
    new = two.start_host("k4", "-c", "2")
    client = two.client()
    gone, kept = turn_id(), turn_id()
    for turn, host in ((gone, "k4"), (kept, survivor_host)):
        two.redis.hset(home_key("box-k", turn), "lane", home_lane("vessel.sandbox", host))
        result = client.call(
            "box-k", "ws", {"write": {"f": turn}}, owner="web/a", turn=turn, timeout=30
        )
        assert output(result) and home_host(two, "box-k", turn) == host
    two.redis.flushall()  # Redis lost every home (and everything else)
    two.kill(new)
    lost = client.call("box-k", "ws", {"read": ["f"]}, owner="web/a", turn=gone, timeout=30)
    assert lost.workspace_lost and output(lost)["read"] == {"f": None}
    intact = client.call("box-k", "ws", {"read": ["f"]}, owner="web/a", turn=kept, timeout=30)
    assert not intact.workspace_lost and output(intact)["read"] == {"f": kept}
    client.close()
