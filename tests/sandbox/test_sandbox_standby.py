"""Standby sandboxes (`workers/sandbox/standby.py`): after three like calls close
together (an agent's, or a turn's), the next call's bwrap is started ahead on a slot
launcher and waits in the static prefix for its command.

What must hold: such a call sees exactly what a call started at its own time sees
(a fresh workspace, no extra descriptor, its own arguments and stdin, a deadline
from its own start); a standby that does not fit the call is not used; none is
left running when the runner closes. These tests run as root and as an
unprivileged user (scripts/test-unprivileged).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.sandbox.conftest import Sandbox, make_sandbox
from workers.metrics import watch_standbys
from workers.sandbox import command_prefix
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.standby import STANDBY_FLAG, StandbyCounts, StandbyLost
from workers.sandbox.workspace import WorkspaceStore

#: What a call sees of its workspace and descriptors, then leaves a file behind.
_LOOK_AND_LEAVE = (
    "echo ws=$(ls -A /tmp/vessel | tr '\\n' ,); "
    "echo fds=$(ls /proc/self/fd | tr '\\n' ,); "
    "echo stdin=$(cat); "
    "echo secret > /tmp/vessel/left-by-$$"
)


def _parent(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def _standby_processes(runner: SandboxRunner) -> list[int]:
    """This runner's standbys still waiting: host processes under its launchers whose
    command line names the flag (other tests' runners run beside this one)."""
    pool = runner._launchers
    launchers = {each.pid for each in (pool._all | set(pool._free))} if pool is not None else set()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if STANDBY_FLAG.encode() not in Path(f"/proc/{entry}/cmdline").read_bytes():
                continue
        except OSError:
            continue
        pid = int(entry)
        while pid > 1 and pid not in launchers:
            pid = _parent(pid)
        if pid in launchers:
            found.append(int(entry))
    return found


def _started_standbys(runner: SandboxRunner, *, bound: bool = False) -> list[int]:
    """`_standby_processes` once there are some (the launcher starts one while the
    call's result goes back), within ten seconds; `bound`: once one is past bwrap's
    set-up (its binds made: the prefix waits for its command)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = _standby_processes(runner)
        if found and (not bound or any(_comm(pid) not in ("bwrap", "") for pid in found)):
            return found
        time.sleep(0.01)
    return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def _needs_standbys(runner: SandboxRunner) -> None:
    if not runner.standby_mode.startswith("on"):
        pytest.skip(f"no standby sandboxes here: {runner.standby_mode}")


def test_calls_in_a_row_get_a_started_sandbox_that_sees_a_call_of_its_own(
    sandbox: Sandbox,
) -> None:
    _needs_standbys(sandbox.runner)
    for n in range(6):
        result = sandbox.call(shell=_LOOK_AND_LEAVE, arguments={"n": n})
        assert not result.is_error, result.output
        lines = dict(line.split("=", 1) for line in result.output.splitlines())
        # Fresh: only its own outbox, never the file an earlier call left.
        assert lines["ws"] == "outbox,", (n, result.output)
        # No descriptor of the standby's (its command pipe at 5) reaches the tool:
        # 0-2, and the one `ls` opens to list them.
        assert lines["fds"] == "0,1,2,3,", (n, result.output)
        assert lines["stdin"] == f'{{"n": {n}}}', (n, result.output)
    # Calls 1-3 start their own; each after them finds one started by the one before.
    assert sandbox.runner.standby_calls == 3


def test_arguments_as_flags_reach_a_standby_call(sandbox: Sandbox) -> None:
    _needs_standbys(sandbox.runner)
    outputs = [
        sandbox.call(command=("/bin/echo", "said"), input="args", arguments={"word": f"w{n}"})
        for n in range(5)
    ]
    assert [r.output for r in outputs] == [f"said --word=w{n}\n" for n in range(5)]
    assert sandbox.runner.standby_calls == 2


def test_a_standby_calls_deadline_starts_with_the_call(sandbox: Sandbox) -> None:
    """A standby waiting longer than the tool's timeout does not eat into the call's."""
    _needs_standbys(sandbox.runner)
    for _ in range(3):
        assert not sandbox.call(shell="true", timeout=0.5).is_error
    time.sleep(1.0)  # the standby waits twice the timeout
    result = sandbox.call(shell="sleep 0.2; echo done", timeout=0.5)
    assert (result.is_error, result.output) == (False, "done\n")
    assert sandbox.runner.standby_calls == 1
    timed_out = sandbox.call(shell="sleep 5", timeout=0.5)
    assert timed_out.outcome == "timeout", timed_out.output
    assert 0.45 < timed_out.duration_ms / 1000 < 2.5, timed_out.duration_ms


def test_a_standby_of_another_layout_is_not_used_and_none_outlives_the_runner(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    _needs_standbys(sandbox.runner)
    for _ in range(3):
        assert not sandbox.call(shell="true").is_error  # a standby for /data -> sandbox.data
    first = _started_standbys(sandbox.runner)
    assert first
    other = tmp_path / "other-data"
    other.mkdir()
    (other / "mark").write_text("other")
    result = sandbox.call(shell="cat /data/mark", mounts={"/data": other})
    assert (result.is_error, result.output) == (False, "other"), result.output
    assert sandbox.runner.standby_calls == 0
    assert _alive(first)  # kept for its own calls: that call had a launcher started
    for _ in range(2):  # the third call of the new layout leaves a standby for it
        sandbox.call(shell="true", mounts={"/data": other})
    deadline = time.monotonic() + 10
    while len(both := _standby_processes(sandbox.runner)) < 2 * len(first):
        assert time.monotonic() < deadline, both
        time.sleep(0.01)
    (sandbox.data / "mark").write_text("first")
    back = sandbox.call(shell="cat /data/mark")  # the first layout's standby serves it
    assert (back.is_error, back.output) == (False, "first"), back.output
    assert sandbox.runner.standby_calls == 1
    sandbox.runner.close()
    assert not _alive(both)
    # The standbys' one-call workspaces went with them.
    sandbox.runner.workspaces.flush()
    agent_dir = next((sandbox.root / "workspaces").glob("*/"), None)
    left = [p.name for p in agent_dir.iterdir()] if agent_dir is not None else []
    assert not [name for name in left if not name.startswith(".")], left


def test_a_standby_older_than_half_the_workspace_ttl_is_not_used(tmp_path: Path) -> None:
    made = make_sandbox(tmp_path)
    made.runner.close()
    made.runner = SandboxRunner(WorkspaceStore(tmp_path / "ws-short", ttl_seconds=1.0))
    try:
        _needs_standbys(made.runner)
        for _ in range(3):
            assert not made.call(shell="true").is_error
        time.sleep(0.7)  # past half the TTL: the sweep may take its workspace
        result = made.call(shell="ls -A /tmp/vessel")
        assert (result.is_error, result.output) == (False, "outbox\n"), result.output
        assert made.runner.standby_calls == 0
    finally:
        made.runner.close()


def test_a_standby_no_call_took_is_killed_once_idle_and_every_one_is_counted(
    sandbox: Sandbox,
) -> None:
    runner = sandbox.runner
    _needs_standbys(runner)
    registry = CollectorRegistry()
    watch_standbys(runner, registry)

    def metric(outcome: str | None) -> float | None:
        if outcome is None:
            return registry.get_sample_value("vessel_sandbox_standbys_waiting")
        return registry.get_sample_value("vessel_sandbox_standbys_total", {"outcome": outcome})

    for _ in range(4):  # the fourth takes the one the third started, and leaves one
        assert not sandbox.call(shell="true").is_error
    waiting = _started_standbys(runner)
    assert waiting
    assert runner.standby_counts() == StandbyCounts(started=2, used=1, unused=0, waiting=1)
    assert (metric("started"), metric("used"), metric("unused"), metric(None)) == (2, 1, 0, 1)
    assert runner.drop_idle_standbys(idle_seconds=60) == 0  # young: kept
    assert _alive(waiting)
    assert runner.drop_idle_standbys(idle_seconds=0) == 1
    assert not _alive(waiting)
    assert runner.standby_counts() == StandbyCounts(started=2, used=1, unused=1, waiting=0)
    assert (metric("unused"), metric(None)) == (1, 0)
    # The next call runs as any: its launcher was given back, not lost.
    result = sandbox.call(shell="ls -A /tmp/vessel")
    assert (result.is_error, result.output) == (False, "outbox\n"), result.output
    assert runner.standby_counts().used == 1


def test_a_command_larger_than_a_standby_takes_starts_the_usual_way(sandbox: Sandbox) -> None:
    _needs_standbys(sandbox.runner)
    for _ in range(3):
        assert not sandbox.call(command=("/bin/true",), input="args").is_error
    big = {f"a{n}": "x" * 100_000 for n in range(3)}  # 300 kB of flags: over 256 KiB
    result = sandbox.call(command=("/bin/sh", "-c", 'echo "$#"', "sh"), input="args", arguments=big)
    assert (result.is_error, result.output) == (False, "3\n"), result.output[:200]
    assert sandbox.runner.standby_calls == 0


_TURN_CALL = (
    "echo x >> /tmp/vessel/count; echo count=$(wc -l < /tmp/vessel/count); "
    "echo outbox=$(ls -A $VESSEL_OUTBOX | tr '\\n' ,); "
    "cat > $VESSEL_OUTBOX/out-$(wc -l < /tmp/vessel/count).txt"
)


def test_a_turns_calls_in_a_row_share_its_workspace_and_each_has_its_own_outbox(
    sandbox: Sandbox,
) -> None:
    _needs_standbys(sandbox.runner)
    for n in range(1, 6):
        result = sandbox.call(shell=_TURN_CALL, arguments={"n": n}, turn="turn-a")
        assert not result.is_error, result.output
        assert result.output.splitlines() == [f"count={n}", "outbox="], (n, result.output)
        assert [f.name for f in result.files] == [f"out-{n}.txt"], (n, result.files)
    assert sandbox.runner.standby_calls == 2
    other = sandbox.call(shell=_TURN_CALL, turn="turn-b")  # its own workspace, always
    assert other.output.splitlines() == ["count=1", "outbox="], other.output
    # At the launcher's hole, the standby serves turn b's call as well (turn b's
    # workspace mounted there at the call); bound to turn a's workspace, it does not.
    assert sandbox.runner.standby_calls == (3 if sandbox.runner.standbys_at_hole else 2)


def _needs_holes(runner: SandboxRunner) -> None:
    _needs_standbys(runner)
    if not runner.standbys_at_hole:
        pytest.skip(f"a turn's standby binds its workspace here: {runner.standby_mode}")


def test_calls_spread_over_turns_take_standbys_and_each_sees_its_own_turn_only(
    sandbox: Sandbox,
) -> None:
    """At the launcher's hole a standby takes any turn's call: each call must see its
    own turn's workspace (the files its turn's earlier calls left, nothing of another
    turn's) and an outbox of its own, mounted `nosuid,nodev` as a bind would be."""
    _needs_holes(sandbox.runner)
    look = _TURN_CALL + "; grep ' /tmp/vessel' /proc/self/mountinfo >&2"
    for n in range(1, 4):
        for turn in ("turn-x", "turn-y", "turn-z"):
            result = sandbox.call(shell=look, arguments={"n": n}, turn=turn)
            assert not result.is_error, result.output
            lines = result.output.splitlines()
            assert lines[:2] == [f"count={n}", "outbox="], (turn, n, result.output)
            assert [f.name for f in result.files] == [f"out-{n}.txt"], (turn, n, result.files)
            mounted = [line for line in lines[2:] if " /tmp/vessel " in line]
            assert mounted and all("nosuid" in m and "nodev" in m for m in mounted), lines
    # Three turns interleaved: every call after the first three found a standby.
    assert sandbox.runner.standby_calls == 6


def test_a_workspace_the_launcher_cannot_mount_starts_the_call_the_usual_way(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    _needs_holes(sandbox.runner)
    for _ in range(3):
        assert not sandbox.call(shell=_TURN_CALL, turn="turn-m").is_error
    assert _started_standbys(sandbox.runner)
    pool = sandbox.runner._launchers
    assert pool is not None
    (standby,) = [each.standby for each in pool._free if each.standby is not None]
    launcher = standby.launcher
    standby.at_call(tmp_path / "no-such-workspace")
    with pytest.raises(StandbyLost, match="was not mounted"):
        standby.release(["/bin/true"])
    standby.discard()
    assert launcher.standby is None and launcher.alive()
    # The launcher's hole is clear again: the next calls run, and take standbys again.
    taken = sandbox.runner.standby_calls
    for n in range(4, 8):
        result = sandbox.call(shell=_TURN_CALL, turn="turn-m")
        assert result.output.splitlines() == [f"count={n}", "outbox="], result.output
    assert sandbox.runner.standby_calls > taken


def test_a_call_refused_after_its_mount_was_asked_for_leaves_the_launcher_usable(
    sandbox: Sandbox,
) -> None:
    """The mount is asked for as soon as the call has its workspace; a workspace over
    its limit then refuses the call before it runs: the launcher's answer is read and
    the standby killed, and the next calls of the turn run (and take standbys)."""
    _needs_holes(sandbox.runner)
    for _ in range(3):
        assert not sandbox.call(shell=_TURN_CALL, workspace_mb=8, turn="turn-r").is_error
    assert _started_standbys(sandbox.runner)
    workspace = sandbox.runner.workspaces.for_turn("test-agent", "turn-r")
    (workspace / "big").write_bytes(b"x" * (9 * 1024 * 1024))
    refused = sandbox.call(shell=_TURN_CALL, workspace_mb=8, turn="turn-r")
    assert refused.is_error and refused.outcome == "refused", refused.output
    (workspace / "big").unlink()
    taken = sandbox.runner.standby_calls
    for n in range(4, 8):
        result = sandbox.call(shell=_TURN_CALL, workspace_mb=8, turn="turn-r")
        assert result.output.splitlines() == [f"count={n}", "outbox="], result.output
    assert sandbox.runner.standby_calls > taken


#: In a launcher's namespaces, as a launcher makes them: the workspace's outbox/ made a
#: link by a tool (to a folder every later sandbox of the launcher binds) must not
#: carry the call's outbox there.
_LINKED_OUTBOX = """
import json, os, sys
from workers.sandbox.launcher_holes import Holes
from workers.sandbox.launcher_network import CallNetwork
base = sys.argv[1]
ws, outbox, victim, folder = (os.path.join(base, n) for n in ("ws", "ob", "victim", "hole"))
for path in (ws, outbox, victim, folder):
    os.mkdir(path)
os.symlink(victim, os.path.join(ws, "outbox"))
CallNetwork.enter()
holes = Holes.make(folder)
try:
    holes.mount_at_hole(ws, outbox)
    refused = ""
except OSError as exc:
    refused = str(exc)
mounts = open("/proc/self/mountinfo").read()
cleared = not holes.mounted
os.replace(os.path.join(ws, "outbox"), os.path.join(base, "link"))
os.mkdir(os.path.join(ws, "outbox"))
holes.mount_at_hole(ws, outbox)
print(json.dumps({
    "refused": refused, "victim_mounted": victim in mounts, "cleared": cleared,
    "then": [line.split()[4] for line in open("/proc/self/mountinfo") if folder in line],
}))
"""


def test_a_workspace_outbox_made_a_link_is_not_mounted_through(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    _needs_holes(sandbox.runner)
    base = tmp_path / "linked"
    base.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _LINKED_OUTBOX, str(base)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert "move_mount" not in seen["refused"] and seen["refused"], seen
    assert seen["victim_mounted"] is False and seen["cleared"] is True, seen
    hole = str(base / "hole" / "h")
    assert seen["then"] == [str(base / "hole"), hole, f"{hole}/outbox"], seen


def test_interleaved_calls_of_two_kinds_keep_each_others_standbys(sandbox: Sandbox) -> None:
    """A turn's calls between calls without one: each kind keeps a launcher standing by
    (the pool starts a second launcher instead of killing the other kind's standby)."""
    _needs_standbys(sandbox.runner)
    for n in range(5):
        plain = sandbox.call(shell="ls -A /tmp/vessel")
        assert (plain.is_error, plain.output) == (False, "outbox\n"), (n, plain.output)
        turned = sandbox.call(shell=_TURN_CALL, turn="turn-d")
        assert turned.output.splitlines() == [f"count={n + 1}", "outbox="], (n, turned.output)
    # Each kind's first three calls start their own; the last two of each find theirs.
    assert sandbox.runner.standby_calls == 4


def test_a_standby_of_a_turn_that_ended_is_not_used(sandbox: Sandbox) -> None:
    """The turn's workspace removed (the turn ended) and made again: another folder,
    which a standby bound to the old one must not stand in for (one at the hole has
    the new folder mounted at the call, and takes it)."""
    _needs_standbys(sandbox.runner)
    for _ in range(3):
        assert not sandbox.call(shell=_TURN_CALL, turn="turn-c").is_error
    # Its binds made first: a standby whose bwrap binds only after the turn's folder
    # was made again binds the new one, and may rightly take the call.
    assert _started_standbys(sandbox.runner, bound=True)
    sandbox.runner.workspaces.end_turn("test-agent", "turn-c")
    again = sandbox.call(shell=_TURN_CALL, turn="turn-c")
    assert again.output.splitlines() == ["count=1", "outbox="], again.output
    assert sandbox.runner.standby_calls == (1 if sandbox.runner.standbys_at_hole else 0)


def test_the_off_setting_starts_every_sandbox_at_its_call(tmp_path: Path) -> None:
    made = make_sandbox(tmp_path)
    made.runner.close()
    made.runner = SandboxRunner(WorkspaceStore(tmp_path / "ws-off"), standby="off")
    try:
        assert made.runner.standby_mode == "off"
        for _ in range(4):
            assert not made.call(shell="true").is_error
        assert made.runner.standby_calls == 0
        assert not _standby_processes(made.runner)
    finally:
        made.runner.close()


def _prefix_waiting(data: bytes | None) -> subprocess.CompletedProcess[bytes]:
    """The static prefix in standby mode, `data` written to its fd 5 and the pipe closed."""
    prefix = command_prefix.default_path()
    if not os.access(prefix, os.X_OK):
        pytest.skip(f"no static prefix at {prefix}")
    # The pipe reaches fd 5 through sh: this process's own fd 5 is not ours to take.
    return subprocess.run(
        ["/bin/sh", "-c", 'exec "$0" "$1" 5<&0 0</dev/null', str(prefix), STANDBY_FLAG],
        input=data or b"",  # communicate() takes an early exit's EPIPE as the end
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=10,
        check=False,
    )


def _framed(words: list[bytes]) -> bytes:
    body = b"".join(w + b"\0" for w in words)
    return struct.pack("=Q", len(body)) + body


def test_the_prefix_waits_for_its_command_then_runs_it_as_given() -> None:
    done = _prefix_waiting(_framed([b"/bin/sh", b"-c", b'echo "$0"; ls /proc/self/fd', b"a b"]))
    assert (done.returncode, done.stdout) == (0, b"a b\n0\n1\n2\n3\n")


@pytest.mark.parametrize(
    ("data", "code", "said"),
    [
        (None, 0, b""),  # the pipe closed: not wanted, nothing said
        (b"\x05\0\0", 0, b""),  # closed inside the length
        (struct.pack("=Q", 10) + b"/bin/tr", 0, b""),  # closed inside the command
        (struct.pack("=Q", 10**9), 126, b"cannot run '': Argument list too long\n"),
        (struct.pack("=Q", 4) + b"true", 126, b"cannot run '': Argument list too long\n"),
        (
            _framed([b"no-such-tool"]),
            127,
            b"cannot run 'no-such-tool': No such file or directory\n",
        ),
    ],
)
def test_the_prefix_refuses_a_broken_command_clearly(
    data: bytes | None, code: int, said: bytes
) -> None:
    done = _prefix_waiting(data)
    assert (done.returncode, done.stdout) == (code, said)
