"""Slot launchers, through the real runner, real bwrap and real cgroups: reuse,
per-call caps held by the slot cgroup, kills on the launcher path, a launcher
lost mid-call, one slot per concurrent call, close(), prefork children, and the
direct (sh wrapper) path kept as the fallback."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.sandbox import cgroup
from workers.sandbox.launcher_client import Launcher
from workers.sandbox.runner import SandboxRunner

from .conftest import FORK_BOMB, Marked, Sandbox

pytestmark = pytest.mark.hostile


@pytest.fixture(params=["launcher", "direct"])
def either(request: pytest.FixtureRequest, sandbox: Sandbox) -> Iterator[Sandbox]:
    """The sandbox fixture on each path: slot launchers (default) and the sh wrapper."""
    if request.param == "direct":
        sandbox.runner = SandboxRunner(sandbox.runner.workspaces, launchers=False)
    assert sandbox.runner.uses_launchers == (request.param == "launcher")
    yield sandbox


def _launchers(sandbox: Sandbox) -> set[Launcher]:
    pool = sandbox.runner._launchers
    assert pool is not None
    return set(pool._all)


def _busy_processes(launcher: Launcher) -> int:
    """Processes in the launcher's slot besides the launcher (pids.current - 1)."""
    assert launcher.slot is not None
    return int(launcher.slot.read("pids", "pids.current")) - 1


def _slots_of_this_process(sandbox: Sandbox) -> list[Path]:
    prefix = f"vessel-call-{os.getpid()}-slot"
    return [
        d
        for parent in sandbox.runner._cgroups.parents.values()
        for d in parent.iterdir()
        if d.name.startswith(prefix)
    ]


def _needs_pids(sandbox: Sandbox) -> None:
    if "pids" not in sandbox.runner.cgroup_controllers:
        pytest.skip("no writable pids cgroup hierarchy on this host")


# --- reuse ----------------------------------------------------------------------------------


def test_one_launcher_serves_consecutive_calls(sandbox: Sandbox) -> None:
    assert sandbox.runner.uses_launchers
    assert " via slot launchers; calls run as uid " in sandbox.runner.cgroup_mode
    assert sandbox.call(shell="echo one").output == "one\n"
    (first,) = _launchers(sandbox)
    for n in range(3):
        assert sandbox.call(shell=f"echo {n}").output == f"{n}\n"
    assert _launchers(sandbox) == {first}
    assert first.process.poll() is None
    if first.slot is not None and "pids" in first.slot.paths:
        assert first.settled()  # nothing of the calls is left in the slot (bounded wait)


def test_the_call_gets_its_rlimits_and_default_signals(either: Sandbox) -> None:
    shell = (
        "ulimit -n; ulimit -c; ulimit -f; "
        "grep SigIgn /proc/$$/status | cut -f2; "
        "tr '\\0' ' ' < /proc/1/cmdline"
    )
    # A worker started from a backgrounded shell ignores SIGINT, SIGQUIT (and
    # nohup's SIGHUP): ignored dispositions survive execve, the tool gets none.
    inherited = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM)
    before = [signal.signal(number, signal.SIG_IGN) for number in inherited]
    try:
        lines = either.call(shell=shell, disk_mb=3).output.splitlines()
    finally:
        for number, handler in zip(inherited, before, strict=True):
            signal.signal(number, handler)
    assert lines[:3] == ["4096", "0", str(3 * 2**20 // 512)]
    # 32 and 33 are glibc's own (a glibc posix_spawn child has them ignored):
    # the static prefix resets them, glibc refuses the Perl prefix that.
    standard = (1 << 31) - 1
    assert int(lines[3], 16) & standard == 0, f"ignored in the tool: SigIgn {lines[3]}"
    # bwrap's options are in the memfd: nothing of the host on its command line.
    assert lines[4].split()[1:4] == ["--args", lines[4].split()[2], "--"]
    if either.runner.uses_launchers:
        assert lines[4].split()[2] == "3"


def test_the_call_gets_rlimit_cpu_but_the_launcher_does_not(either: Sandbox) -> None:
    # ceil(timeout x cpu_limit) soft (SIGXCPU), one second more hard (SIGKILL); the
    # launcher itself keeps no RLIMIT_CPU, else its own CPU time would count.
    result = either.call(shell="ulimit -S -t; ulimit -H -t", timeout=3, cpu_limit=0.5)
    assert result.output.split() == ["2", "3"], result.output
    for each in _launchers(either) if either.runner.uses_launchers else ():
        assert resource.prlimit(each.process.pid, resource.RLIMIT_CPU) == (
            resource.RLIM_INFINITY,
            resource.RLIM_INFINITY,
        )


def test_the_args_gate_pipe_carries_every_byte_and_sets_rlimit_cpu_first(
    tmp_path: Path,
) -> None:
    # With cpu_seconds, ARGS_FD is a pipe the launcher fills after the prlimit: here
    # the child reads it (like bwrap's --args), 300 KB (past a pipe's 64 KiB buffer),
    # and reports its RLIMIT_CPU, set before it could read a byte.
    launcher = Launcher.start(None, ())
    memfd = os.memfd_create("args", os.MFD_CLOEXEC)
    seccomp_fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        os.write(memfd, b"a" * 300_000)
        os.lseek(memfd, 0, os.SEEK_SET)
        shell = "wc -c <&3; ulimit -S -t; ulimit -H -t"  # read first, as bwrap does
        launcher.send_spawn(
            ["/bin/sh", "-c", shell],
            env={"PATH": "/usr/bin:/bin"},
            stdin_fd=None,
            out_fd=out_w,
            args_fd=memfd,
            seccomp_fd=seccomp_fd,
            cpu_seconds=(7, 8),
        )
        child = launcher.spawned()
        os.close(out_w)
        out_w = -1
        assert child.wait(10) == 0
        output = b""
        while chunk := os.read(out_r, 65536):
            output += chunk
        assert output.split() == [b"300000", b"7", b"8"]
        assert child.cpu_seconds is not None and child.cpu_seconds >= 0
    finally:
        for fd in (memfd, seccomp_fd, out_r, out_w):
            if fd >= 0:
                os.close(fd)
        launcher.close()


def test_the_call_holds_no_descriptor_but_its_own(either: Sandbox) -> None:
    # Neither the launcher's received fds nor the memfds (host paths) reach the sandbox.
    # The fds of a child of the call's shell (what every process of the call
    # starts with), not of the shell itself, which holds a pipe's two ends while it
    # starts a pipeline and saves fds at redirections.
    result = either.call(
        shell="sleep 5 & sleep 0.5; ls /proc/$!/fd | tr '\\n' ' '; kill $!; echo; "
        "ls -l /proc/*/fd/ 2>&1"
    )
    first, rest = result.output.split("\n", 1)
    assert first.split() == ["0", "1", "2"]
    assert "memfd" not in rest and "socket" not in rest, rest


def test_large_argument_lists_reach_the_tool(sandbox: Sandbox) -> None:
    # Far more than one datagram: the request travels in a memfd.
    arguments = {f"a{n}": "x" * 100_000 for n in range(3)}
    script = "import sys; print([len(a) for a in sys.argv[1:]])"
    result = sandbox.call(script, arguments, input="args")
    assert result.outcome == "ok", result.output
    assert result.output.strip() == str([len("--a0=") + 100_000] * 3)


# --- the caps still hold, per call ------------------------------------------------------------


def test_memory_cap_kills_with_the_memory_limit_message(either: Sandbox) -> None:
    if "memory" not in either.runner.cgroup_controllers:
        pytest.skip("no writable memory cgroup hierarchy on this host")
    # Each process stays under RLIMIT_DATA (64 MiB); together they pass the cgroup's
    # cap. The tool itself holds the most when the cap is hit: the OOM killer's pick.
    script = (
        "import os, time\n"
        "go_r, go_w = os.pipe()\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        os.read(go_r, 1)\n"
        "        held = b'x' * (20 * 2**20)\n"
        "        time.sleep(30)\n"
        "held = b'x' * (40 * 2**20)\n"
        "os.write(go_w, b'gg')\n"
        "time.sleep(5)\n"
        "print('SURVIVED')\n"
    )
    result = either.call(script, memory_mb=64, timeout=20)
    assert "SURVIVED" not in result.output
    assert "memory_limit_mb (64) reached" in result.output, result.output
    # Per call: the next call's own death is not blamed on memory.
    again = either.call(shell="kill -9 $$", memory_mb=64)
    assert "killed by signal SIGKILL" in again.output
    assert "memory_limit_mb" not in again.output


@pytest.mark.slow
def test_fork_bomb_is_capped_per_call_and_the_slot_recovers(either: Sandbox) -> None:
    _needs_pids(either)
    script = FORK_BOMB
    result = either.call(script, timeout=8)
    assert "fork refused after" in result.output, result.output
    # The call had its PIDS_MAX (bwrap x2, the tool and its children), no more.
    assert cgroup.PIDS_MAX - 10 < int(result.output.split()[3]) < cgroup.PIDS_MAX
    assert either.call(shell="echo after").output == "after\n"
    if either.runner.uses_launchers:
        assert all(each.settled() for each in _launchers(either))


def test_timeout_kills_the_whole_tree(either: Sandbox, marked: Marked) -> None:
    loop = marked.loop
    result = either.call(shell=f"sh -c '{loop}' & sh -c '{loop}' & wait", timeout=1, turn="t")
    assert result.output == "[timed out after 1 s]" and result.outcome == "timeout"
    assert (either.workspace("t") / "marker").exists()
    assert marked.gone()
    if either.runner.uses_launchers and "pids" in either.runner.cgroup_controllers:
        (launcher,) = _launchers(either)
        assert launcher.settled()
    assert either.call(shell="echo next").output == "next\n"


# --- a launcher lost mid-call -----------------------------------------------------------------


def test_launcher_killed_mid_call_is_an_error_and_replaced(
    sandbox: Sandbox, marked: Marked
) -> None:
    sandbox.call(shell="true", turn="lost")  # the launcher of this agent's limits exists
    (launcher,) = _launchers(sandbox)
    marker = sandbox.workspace("lost") / "marker"
    loop = marked.loop
    running: list[int] = []

    def kill_when_running() -> None:
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        running.extend(marked.pids())
        os.kill(launcher.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    result = sandbox.call(shell=f"sh -c '{loop}' & sleep 30", timeout=20, turn="lost")
    killer.join()
    assert result.is_error and result.outcome == "error"
    assert result.output.startswith("[sandbox error: launcher lost"), result.output
    assert running  # the tagged loop ran (the proof below is not vacuous)
    assert marked.gone()
    assert launcher not in _launchers(sandbox)
    assert sandbox.call(shell="echo works").output == "works\n"
    assert len(_launchers(sandbox)) == 1


# --- many at once, close, prefork ---------------------------------------------------------------


def test_concurrent_calls_each_get_their_own_slot(sandbox: Sandbox) -> None:
    _needs_pids(sandbox)
    agent, tool = sandbox.agent_and_tool(
        shell="touch /tmp/vessel/started; sleep 2; echo done", timeout=20
    )
    results: dict[int, str] = {}

    def one(n: int) -> None:
        results[n] = sandbox.runner.run(
            call_id=f"c{n}", agent=agent, tool=tool, arguments={}, turn=f"t{n}"
        ).output

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    markers = [sandbox.workspace(f"t{n}") / "started" for n in range(4)]
    deadline = time.monotonic() + 15
    while not all(m.exists() for m in markers) and time.monotonic() < deadline:
        time.sleep(0.01)
    busy = [each for each in _launchers(sandbox) if _busy_processes(each) > 0]
    for t in threads:
        t.join()
    assert results == {n: "done\n" for n in range(4)}
    assert len(busy) == 4
    assert len({each.slot.dirs for each in busy if each.slot is not None}) == 4


def test_close_stops_launchers_and_removes_their_cgroups(sandbox: Sandbox) -> None:
    agent, tool = sandbox.agent_and_tool(shell="sleep 0.3")
    threads = [
        threading.Thread(
            target=sandbox.runner.run,
            kwargs={"call_id": f"c{n}", "agent": agent, "tool": tool, "arguments": {}},
        )
        for n in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    launchers = _launchers(sandbox)
    assert len(launchers) >= 2
    if sandbox.runner.cgroup_controllers:
        assert _slots_of_this_process(sandbox)
    sandbox.runner.close()
    sandbox.runner.close()  # idempotent
    assert all(each.process.poll() is not None for each in launchers)
    assert not _slots_of_this_process(sandbox)
    # Closed: calls still work, on the direct path.
    assert sandbox.call(shell="echo still").output == "still\n"
    assert not _slots_of_this_process(sandbox)


def test_launchers_of_a_dead_worker_exit_and_remove_their_slot(sandbox: Sandbox) -> None:
    sandbox.call(shell="true")
    (launcher,) = _launchers(sandbox)
    launcher.sock.close()  # what the kernel does when the worker dies
    launcher.process.wait(timeout=10)
    if launcher.slot is not None:
        assert not any(d.exists() for d in launcher.slot.dirs)


_WORKER_SCRIPT = """
import sys
from pathlib import Path
from broker.constants import DEFAULT_DISK_LIMIT_MB, DEFAULT_MEMORY_LIMIT_MB
from broker.model import Agent, AgentSettings, DeclaredTool
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.workspace import WorkspaceStore

root = Path(sys.argv[1])
tool = DeclaredTool(
    name="t", description="t", parameters={"type": "object", "properties": {}},
    scope="tools:read", timeout_seconds=60, source=root / "t.toml",
    command=("/bin/sh", "-c", "echo started; sleep 60"), input="args",
)
settings = AgentSettings(
    workdir="/tmp/vessel", tool_timeout_seconds=60, tool_output_chars=100,
    disk_limit_mb=DEFAULT_DISK_LIMIT_MB, memory_limit_mb=DEFAULT_MEMORY_LIMIT_MB,
)  # the default limits: the runner's first launcher serves the call
package = root / "package"
package.mkdir(mode=0o755)  # readable by a root worker's sandbox uid
agent = Agent(
    id="a", package_dir=package, settings=settings, tools={"t": tool}, mounts={},
    grants={}, max_concurrent_calls=1,
)
runner = SandboxRunner(WorkspaceStore(root / "workspaces"))
(launcher,) = runner._launchers._all
# The launcher proper, then the process the worker started: for a root worker its
# keeper, which removes the slot cgroups once the launcher proper is gone.
print(launcher.pid, launcher.process.pid, *launcher.slot.dirs if launcher.slot else (), flush=True)
runner.run(call_id="c", agent=agent, tool=tool, arguments={})
"""


def test_launchers_of_a_killed_worker_exit_and_remove_their_slots(tmp_path: Path) -> None:
    import subprocess

    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER_SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert worker.stdout is not None
        pid, keeper, *slots = worker.stdout.readline().split()
        children = Path(f"/proc/{int(pid)}/task/{int(pid)}/children")
        deadline = time.monotonic() + 10  # until the call runs under the launcher
        while not children.read_text().strip():
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.02)
    finally:
        worker.kill()  # SIGKILL: no close(), no atexit
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
    deadline = time.monotonic() + 10
    for each in (pid, keeper):  # the keeper's last act is removing the slots
        while Path(f"/proc/{int(each)}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    assert not Path(f"/proc/{int(pid)}").exists(), "the launcher outlived its worker"
    assert not Path(f"/proc/{int(keeper)}").exists(), "the launcher's keeper outlived it"
    assert not [s for s in slots if Path(s.decode()).exists()]


def test_a_forked_child_uses_launchers_of_its_own(sandbox: Sandbox) -> None:
    sandbox.call(shell="true")
    (parents,) = _launchers(sandbox)
    agent, tool = sandbox.agent_and_tool(shell="echo from-child")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # a prefork child
        try:
            os.close(read_end)
            result = sandbox.runner.run(call_id="child", agent=agent, tool=tool, arguments={})
            pool = sandbox.runner._launchers
            report = {
                "output": result.output,
                "own": pool is not None and pool.owner == os.getpid(),
                "launchers": [each.process.pid for each in (pool._all if pool else ())],
            }
            os.write(write_end, json.dumps(report).encode())
            sandbox.runner.close()
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = json.loads(pipe.read() or b"{}")
    os.waitpid(pid, 0)
    assert report["output"] == "from-child\n"
    assert report["own"] is True
    assert parents.process.pid not in report["launchers"]
    # The parent's launcher was left alone and still serves the parent.
    assert sandbox.call(shell="echo parent").output == "parent\n"
    assert _launchers(sandbox) == {parents}


# --- the fallback ---------------------------------------------------------------------------------


def test_direct_path_when_no_launcher_can_start(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", str(sandbox.root / "no-python-here"))
    runner = SandboxRunner(sandbox.runner.workspaces)
    try:
        assert not runner.uses_launchers
        assert "via the sh wrapper (cannot start a launcher" in runner.cgroup_mode
        assert "slot launchers unavailable" in caplog.text
        sandbox.runner = runner
        result = sandbox.call("import os; print(sorted(os.environ))")
        assert result.output.strip() == str(
            sorted(["PATH", "LANG", "HOME", "TMPDIR", "VESSEL_OUTBOX"])
        )
    finally:
        runner.close()


def test_direct_path_still_sets_the_limits(either: Sandbox) -> None:
    script = (
        "import resource\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE))\n"
        "print(resource.getrlimit(resource.RLIMIT_MSGQUEUE))\n"
    )
    assert either.call(script).output == "(4096, 4096)\n(0, 0)\n"


def test_a_memory_limit_too_small_for_a_launcher_goes_direct(sandbox: Sandbox) -> None:
    from workers.sandbox.launcher_pool import MIN_DATA_BYTES

    small = MIN_DATA_BYTES // 2**20 // 2
    before = _launchers(sandbox)
    result = sandbox.call(shell="echo small; ulimit -d", memory_mb=small)
    assert result.output == f"small\n{small * 1024}\n"
    assert _launchers(sandbox) == before  # no launcher was made for it
