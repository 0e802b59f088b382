"""The hostile catalogue, continued: what a tool could do to the host itself.

A root worker's calls once ran as host uid 0 (bwrap's --unshare-user maps the
sandbox's 0 to the host's 0): a tool could write host sysctls and read
root-only /proc files. Each attack below goes through the real runner and real
bubblewrap; run as root (as here) they prove the drop to the sandbox uid, run
as another user they still hold. Then: the mount table a tool reads, an OOM in
the call's memory cgroup, symlinks at workspace removal, and what a worker
leaves behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from workers.sandbox import probe
from workers.sandbox.identity import SandboxIdentity
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.workspace import WorkspaceStore

from .conftest import Sandbox

pytestmark = pytest.mark.hostile

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0
#: The sizes of the direct path (memory_limit_mb below the launcher's minimum)
#: and of the launcher path.
_AS_NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")
PATHS = pytest.mark.parametrize("memory_mb", [24, 256], ids=["direct", "launcher"])


def _write_back(sysctl: str) -> str:
    """A tool that writes a sysctl's current value back (a no-op if it works)."""
    return (
        f"p = '/proc/sys/{sysctl}'\n"
        "v = open(p).read()\n"
        "try:\n"
        "    with open(p, 'w') as f:\n"
        "        f.write(v)\n"
        "    print('WROTE')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )


# --- /proc/sys and root-only /proc files --------------------------------------------


_SHELL_WRITE_BACK = (
    "v=$(cat /proc/sys/kernel/printk_ratelimit); "
    "echo $v > /proc/sys/kernel/printk_ratelimit && echo WROTE || echo refused"
)


@PATHS
def test_sysctl_printk_ratelimit_write_back_is_refused(sandbox: Sandbox, memory_mb: int) -> None:
    before = Path("/proc/sys/kernel/printk_ratelimit").read_text()
    result = sandbox.call(shell=_SHELL_WRITE_BACK, memory_mb=memory_mb)
    assert "refused" in result.output and "WROTE" not in result.output, result.output
    assert Path("/proc/sys/kernel/printk_ratelimit").read_text() == before


def test_sysctl_core_pattern_write_back_is_refused(sandbox: Sandbox) -> None:
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    result = sandbox.call(_write_back("kernel/core_pattern"))
    assert "refused" in result.output and "WROTE" not in result.output, result.output
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


def test_proc_sys_is_a_read_only_mount(sandbox: Sandbox) -> None:
    result = sandbox.call(shell="grep ' /proc/sys ' /proc/self/mountinfo")
    assert result.outcome == "ok", result.output
    assert " ro," in result.output


def test_proc_kcore_gives_nothing(sandbox: Sandbox) -> None:
    script = (
        "try:\n"
        "    print('READ', len(open('/proc/kcore', 'rb').read(4096)))\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    result = sandbox.call(script)
    assert "refused" in result.output and "READ" not in result.output, result.output


def test_proc_timer_list_is_unreadable(sandbox: Sandbox) -> None:
    script = (
        "try:\n"
        "    print('READ', open('/proc/timer_list').read()[:200])\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    result = sandbox.call(script)
    assert "refused" in result.output and "READ" not in result.output, result.output


def test_proc_keys_shows_no_key_of_the_host(sandbox: Sandbox) -> None:
    # Root's keys (owner uid 0, the 6th column) as this process sees them.
    lines = [line.split() for line in Path("/proc/keys").read_text().splitlines()]
    host_keys = {fields[0] for fields in lines if len(fields) > 5 and fields[5] == "0"}
    result = sandbox.call(shell="cat /proc/keys; echo done", output_chars=100_000)
    assert "done" in result.output
    seen = {line.split()[0] for line in result.output.splitlines()[:-1] if line.strip()}
    assert not seen & host_keys, result.output


@PATHS
def test_the_call_is_never_host_uid_0(sandbox: Sandbox, memory_mb: int) -> None:
    marker = f"uid-probe-{os.getpid()}-{memory_mb}"
    agent, tool = sandbox.agent_and_tool(
        shell=f"echo {marker} >/dev/null; sleep 30", memory_mb=memory_mb, timeout=40
    )
    cancel = threading.Event()
    done: list[object] = []
    thread = threading.Thread(
        target=lambda: done.append(
            sandbox.runner.run(call_id="uid", agent=agent, tool=tool, arguments={}, cancel=cancel)
        )
    )
    thread.start()
    try:

        def scan() -> dict[int, list[bytes]]:
            found = {}
            for entry in Path("/proc").iterdir():
                with contextlib.suppress(OSError):
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if entry.name.isdigit() and any(marker.encode() in a for a in argv):
                        found[int(entry.name)] = argv
            return found

        def tool_runs(found: dict[int, list[bytes]]) -> bool:
            return any(
                a[:2] == [b"/bin/sh", b"-c"] and a[2].startswith(b"echo") for a in found.values()
            )

        deadline = time.monotonic() + 25
        while not tool_runs(scan()):
            assert time.monotonic() < deadline, f"the call's process never showed up: {done}"
            time.sleep(0.02)
        # Now past the wrapper and setpriv: every process naming the marker is
        # bwrap (outer and inner) or the tool's shell.
        pids = list(scan())
        checked = 0
        for pid in pids:
            # Its uids as the host sees them (real, effective, saved, filesystem),
            # and those of its bwrap parents, up to the launcher (or the worker).
            while True:
                status = Path(f"/proc/{pid}/status").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                uids = re.search(r"^Uid:\s+(.*)$", status, re.MULTILINE)
                assert uids is not None
                assert "0" not in uids.group(1).split(), (pid, cmdline, uids.group(1))
                checked += 1
                if b"launcher.py" in cmdline:
                    break
                parent = re.search(r"^PPid:\s+(\d+)", status, re.MULTILINE)
                assert parent is not None
                pid = int(parent.group(1))
                if pid in (0, 1, os.getpid()):
                    break
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                if not argv0.endswith(b"bwrap") and b"launcher.py" not in argv0 + b"".join(
                    Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:4]
                ):
                    break
        assert checked >= 3  # the call, its bwrap parents
    finally:
        cancel.set()
        thread.join()


def test_the_probe_refuses_a_sandbox_that_is_host_root(monkeypatch: pytest.MonkeyPatch) -> None:
    if not ROOT:
        pytest.skip("only a root worker's calls could be host uid 0")
    # What the runner did before: calls of a root worker as root, no drop.
    as_root = SandboxIdentity(uid=0, gid=0, drop=False)
    monkeypatch.setattr(SandboxIdentity, "for_worker", classmethod(lambda cls, env=None: as_root))
    with pytest.raises(Exception, match="ran as host uid 0"):
        probe._check()


def test_a_sandbox_uid_of_0_is_refused_with_the_variable_named() -> None:
    if not ROOT:
        pytest.skip("the setting is read by a root worker only")
    with pytest.raises(ValueError, match="VESSEL_SANDBOX_UID=0"):
        SandboxIdentity.for_worker({"VESSEL_SANDBOX_UID": "0"})
    with pytest.raises(ValueError, match="VESSEL_SANDBOX_GID='x'"):
        SandboxIdentity.for_worker({"VESSEL_SANDBOX_GID": "x"})
    assert SandboxIdentity.for_worker({"VESSEL_SANDBOX_UID": "4242"}).uid == 4242


def test_a_package_the_sandbox_uid_cannot_read_is_a_clear_error(sandbox: Sandbox) -> None:
    if not ROOT:
        pytest.skip("a worker that is not root reads its packages as itself")
    sandbox.package.chmod(0o700)
    result = sandbox.call(shell="ls /agent")
    assert result.outcome == "error"
    assert result.output.startswith("[sandbox error: the agent folder /agent is not readable")
    assert str(sandbox.root) not in result.output and "bwrap" not in result.output
    sandbox.package.chmod(0o755)
    assert sandbox.call(shell="echo readable").output == "readable\n"


# --- the mount table ---------------------------------------------------------------


def test_mountinfo_shows_no_worker_pid_and_no_hash_of_the_turn(sandbox: Sandbox) -> None:
    turn = "turn-a-tool-could-guess-42"
    result = sandbox.call(shell="cat /proc/self/mountinfo", turn=turn, output_chars=100_000)
    assert result.outcome == "ok", result.output
    digest = hashlib.sha256(turn.encode()).hexdigest()
    assert digest[:16] not in result.output
    paths = [f for line in result.output.splitlines() for f in line.split()[3:5]]
    pid = str(os.getpid())
    assert not [p for p in paths if re.search(rf"(?<![0-9]){pid}(?![0-9])", p)], result.output
    assert "/.system/etc-" in result.output  # the stage is there, by a name without a pid


# --- OOM in the call's memory cgroup -------------------------------------------------------


def test_a_memory_cgroup_oom_kills_the_call_not_the_launcher(sandbox: Sandbox) -> None:
    if "memory" not in sandbox.runner.cgroup_controllers:
        pytest.skip("no writable memory cgroup here")
    # memfd pages count in the memory cgroup but in no process's RSS and not in
    # RLIMIT_DATA: the OOM killer once picked the launcher, the largest process.
    script = (
        "import os\n"
        "chunk = b'x' * (1 << 20)\n"
        "fds = [os.memfd_create('m') for _ in range(40)]\n"
        "for fd in fds:\n"
        "    for _ in range(15):\n"
        "        os.write(fd, chunk)\n"
        "print('survived')\n"
    )
    result = sandbox.call(script, memory_mb=64, disk_mb=16, timeout=20)
    assert result.outcome == "error"
    assert not result.output.startswith("[sandbox error"), result.output
    assert result.output.endswith("[killed by signal SIGKILL; memory_limit_mb (64) reached]")
    assert sandbox.call(shell="echo next", memory_mb=64).output == "next\n"


# --- symlinks at removal -----------------------------------------------------------


def test_workspace_removal_never_chmods_a_symlinks_target(sandbox: Sandbox, tmp_path: Path) -> None:
    target = tmp_path / "host-file"
    target.write_text("the host's\n")
    target.chmod(0o644)
    shell = f"mkdir d && ln -s {target} d/link && ln -s {tmp_path} d/dirlink && chmod 500 d"
    result = sandbox.call(shell=shell, turn="links", workdir="/tmp/vessel")
    assert result.outcome == "ok", result.output
    workspace = sandbox.workspace("links")
    sandbox.runner.workspaces.end_turn("test-agent", "links")
    assert not workspace.exists()
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text() == "the host's\n"


_REMOVE_AS_OWNER = """
import sys
from pathlib import Path
from workers.sandbox.workspace import remove_tree
remove_tree(Path(sys.argv[1]))
"""


def test_removal_by_a_worker_that_is_not_root_never_follows_a_link(tmp_path: Path) -> None:
    """The non-root worker's case, where removal must chmod what a tool made read-only."""
    if not ROOT:
        pytest.skip("needs root to act as another user")
    home = tmp_path / "owner"
    home.mkdir(mode=0o700)
    target = home / "host-file"
    target.write_text("x")
    workspace = home / "ws"
    (workspace / "d").mkdir(parents=True)
    (workspace / "d" / "link").symlink_to(target)
    (workspace / "sealed").mkdir()
    for path in (home, target, workspace, workspace / "d", workspace / "sealed"):
        os.chown(path, 65534, 65534, follow_symlinks=False)
    os.chown(workspace / "d" / "link", 65534, 65534, follow_symlinks=False)
    target.chmod(0o644)
    (workspace / "d").chmod(0o500)  # unlink(link) fails: the old fix chmod-ed the link
    (workspace / "sealed").chmod(0o000)
    subprocess.run(
        [*_AS_NOBODY, sys.executable, "-c", _REMOVE_AS_OWNER, str(workspace)],
        cwd=REPO,
        check=True,
        timeout=30,
    )
    assert not workspace.exists()
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


# --- nothing left behind -------------------------------------------------------------


def _files(root: Path) -> list[str]:
    """Every folder and file under `root`. os.walk, not rglob: the runner removes
    a finished call's folder in the background, and one gone meanwhile is
    skipped, not an error."""
    found = []
    for folder, dirs, files in os.walk(root):
        found += [str((Path(folder) / name).relative_to(root)) for name in dirs + files]
    return sorted(found)


def test_calls_without_a_turn_leave_nothing_once_closed(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    for name in ("package", "data"):
        (tmp_path / name).mkdir()
    runner = SandboxRunner(WorkspaceStore(root))
    made = Sandbox(
        root=tmp_path, package=tmp_path / "package", data=tmp_path / "data", runner=runner
    )
    for n in range(4):
        result = made.call(shell=f"echo {n} > $VESSEL_OUTBOX/f; echo x > $TMPDIR/scratch")
        assert result.outcome == "ok", result.output
    assert _files(root)  # the stage, spares
    runner.close()
    assert _files(root) == []


_MARK_THE_FOLDERS = """
import fcntl, os, struct
def chattr_sync(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    flags = struct.unpack("=q", fcntl.ioctl(fd, 0x80086601, bytes(8)))[0]
    fcntl.ioctl(fd, 0x40086602, struct.pack("=q", flags | 0x8))
    os.close(fd)
box = os.environ["VESSEL_OUTBOX"]
for path in ("/tmp/vessel", box):
    os.chmod(path, 0o777)
    os.setxattr(path, "user.mark", b"left by an earlier call")
    chattr_sync(path)
print("marked")
"""

_LOOK_AT_THE_FOLDERS = """
import fcntl, json, os, struct
def look(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    flags = struct.unpack("=q", fcntl.ioctl(fd, 0x80086601, bytes(8)))[0]
    os.close(fd)
    return [oct(os.stat(path).st_mode & 0o7777), os.listxattr(path), bool(flags & 0x8)]
print(json.dumps([look("/tmp/vessel"), look(os.environ["VESSEL_OUTBOX"])]))
"""


def test_a_call_never_gets_a_folder_an_earlier_call_marked(sandbox: Sandbox) -> None:
    # One-call workspaces and outboxes are kept for later calls when left as new:
    # one a tool chmod-ed, gave an xattr or chattr +S to must never be one of them.
    store = sandbox.runner.workspaces
    for _ in range(3):
        marked = sandbox.call(_MARK_THE_FOLDERS)
        assert marked.output == "marked\n", marked.output
        store.flush()
        for _ in range(3):
            looked = sandbox.call(_LOOK_AT_THE_FOLDERS)
            assert json.loads(looked.output) == [["0o700", [], False]] * 2, looked.output
            store.flush()
    # The same with a turn (its calls' outboxes come from the shared ones).
    marked = sandbox.call(_MARK_THE_FOLDERS, turn="t")
    assert marked.output == "marked\n", marked.output
    store.flush()
    looked = sandbox.call(_LOOK_AT_THE_FOLDERS, turn="u")
    assert json.loads(looked.output)[1] == ["0o700", [], False], looked.output


_HOLD_A_STAGE = """
import sys, time
from pathlib import Path
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.workspace import WorkspaceStore
runner = SandboxRunner(WorkspaceStore(Path(sys.argv[1])), launchers=False)
print(runner._system_dir(), flush=True)
time.sleep(60)
"""


def test_stages_of_dead_workers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", _HOLD_A_STAGE, str(root)], cwd=REPO, stdout=subprocess.PIPE
        )
        for _ in range(2)
    ]
    try:
        stages = [Path(h.stdout.readline().decode().strip()) for h in holders]  # type: ignore[union-attr]
        assert all(s.is_dir() for s in stages)
        assert not any(str(h.pid) in s.name for h, s in zip(holders, stages, strict=True))
        holders[0].kill()  # SIGKILL: no close(); its lock goes with it
        holders[0].wait()
        runner = SandboxRunner(WorkspaceStore(root), launchers=False)
        try:
            mine = runner._system_dir()
            assert not stages[0].exists()
            assert not Path(f"{stages[0]}.lock").exists()
            assert stages[1].is_dir()  # its worker lives: its lock is held
            assert mine.is_dir()
        finally:
            runner.close()
        assert not mine.exists()
        assert stages[1].is_dir()
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
            if holder.stdout is not None:
                holder.stdout.close()


def test_a_runner_stages_when_it_starts_not_at_its_first_call(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    runner = SandboxRunner(WorkspaceStore(root), launchers=False)
    try:
        stages = [p for p in (root / ".system").iterdir() if p.suffix != ".lock"]
        assert len(stages) == 1 and (stages[0] / "etc" / "passwd").is_file(), stages
        assert runner._system_dir() == stages[0]  # what the first call binds: not made anew
    finally:
        runner.close()
    assert not (root / ".system").exists()


# --- through `vessel-workers call` (the embedded default) --------------------------------


def _deployment(folder: Path, shell: str) -> Path:
    package = folder / "agent"
    (package / "tools").mkdir(parents=True)
    (package / "vessel.toml").write_text(
        'workdir = "/tmp/vessel"\n[tools]\ndeclared = ["tools/t.toml"]\n'
    )
    (package / "tools" / "t.toml").write_text(
        'name = "t"\ndescription = "a hostile tool"\n'
        f"command = {json.dumps(['/bin/sh', '-c', shell])}\n"
    )
    deployment = folder / "deployment.toml"
    deployment.write_text('[[agents]]\nid = "hostile"\npackage = "agent"\n')
    return deployment


def _cli_call(deployment: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VESSEL_")}
    env["VESSEL_WORKSPACE_ROOT"] = str(root)
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "call", "-d", str(deployment), "hostile", "t", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_call_of_a_tool_writing_a_sysctl_is_refused(tmp_path: Path) -> None:
    shell = (
        "v=$(cat /proc/sys/kernel/printk_ratelimit); "
        "echo $v > /proc/sys/kernel/printk_ratelimit && echo WROTE || echo refused"
    )
    before = Path("/proc/sys/kernel/printk_ratelimit").read_text()
    done = _cli_call(_deployment(tmp_path, shell), tmp_path / "workspaces")
    assert done.returncode == 0, done.stderr
    assert "refused" in done.stdout and "WROTE" not in done.stdout
    assert Path("/proc/sys/kernel/printk_ratelimit").read_text() == before


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_cli_calls_four_at_a_time_leave_nothing_under_the_workspace_root(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    deployment = _deployment(tmp_path, "echo hi > $VESSEL_OUTBOX/out.txt; echo done")
    before = _files(root)
    # Four processes at a time (each one a whole embedded worker, a few seconds), twice:
    # calls that start and end beside each other, and ones that start after others ended.
    with ThreadPoolExecutor(4) as pool:
        for done in pool.map(lambda _: _cli_call(deployment, root), range(8)):
            assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert _files(root) == before


# --- a worker that is not root ---------------------------------------------------------


_AS_ANOTHER_USER = """
import json, sys
from pathlib import Path
sys.path.insert(0, "tests")
from sandbox.conftest import Sandbox
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.workspace import WorkspaceStore
home = Path(sys.argv[1])
(home / "package").mkdir()
runner = SandboxRunner(WorkspaceStore(home / "workspaces"))
made = Sandbox(root=home, package=home / "package", data=home, runner=runner)
out = {"mode": runner.cgroup_mode}
out["write"] = made.call(shell=sys.argv[2], workdir="/tmp/vessel").output
made.call(shell=": > /tmp/vessel/owner", turn="t", workdir="/tmp/vessel")
out["owner"] = (made.workspace("t") / "owner").stat().st_uid
target = home / "host-file"
target.write_text("x")
target.chmod(0o644)
made.call(shell=f"mkdir d && ln -s {target} d/link && chmod 500 d", turn="t", workdir="/tmp/vessel")
runner.workspaces.end_turn("test-agent", "t")
out["target_mode"] = target.stat().st_mode & 0o777
out["workspace_left"] = made.workspace("t").exists() and any(made.workspace("t").iterdir())
runner.close()
print(json.dumps(out))
"""


def test_a_worker_that_is_not_root_runs_calls_as_itself(tmp_path: Path) -> None:
    if not ROOT:
        pytest.skip("needs root to start a worker as another user")
    home = tmp_path / "nobody"
    home.mkdir(mode=0o700)
    os.chown(home, 65534, 65534)
    done = subprocess.run(
        [*_AS_NOBODY, sys.executable, "-c", _AS_ANOTHER_USER, str(home), _SHELL_WRITE_BACK],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert "calls run as uid 65534, gid 65534 (the worker's own)" in out["mode"]
    assert "refused" in out["write"] and "WROTE" not in out["write"]
    assert out["owner"] == 65534
    assert out["target_mode"] == 0o644
    assert out["workspace_left"] is False
