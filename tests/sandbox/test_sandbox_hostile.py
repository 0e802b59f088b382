"""The hostile catalogue: one test per escape attempt, each through the real
runner and real bubblewrap, named for what it tries. Every attempt must fail
inside the sandbox, and the worker (this process) must stay healthy; the last
test checks that a normal call still works after all of them."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.errors import ConfinementUnavailable
from workers.sandbox import cgroup, command_prefix, landlock, probe
from workers.sandbox import runner as runner_module
from workers.sandbox.cgroup import CgroupSettings
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.workspace import WorkspaceStore

from .conftest import FORK_BOMB, Marked, Sandbox, make_sandbox


@pytest.fixture(scope="module", autouse=True)
def _runner_still_works_after_the_catalogue(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """After this module's tests, in whatever order (and on whichever worker) they ran:
    a fresh runner still runs a call, and none of them left a SIGCHLD handler in
    this process. A failure here is an error in the module's last test's teardown."""
    yield
    made = make_sandbox(tmp_path_factory.mktemp("after-the-catalogue"))
    try:
        result = made.call("import json, sys; print(json.load(sys.stdin)['x'] * 2)", {"x": 21})
    finally:
        made.runner.close()
    assert (result.outcome, result.output) == ("ok", "42\n")
    assert signal.getsignal(signal.SIGCHLD) in (signal.SIG_DFL, None)


pytestmark = pytest.mark.hostile

SECRET = "s3cr3t-token-do-not-leak-7f3a"


# --- network -------------------------------------------------------------------


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    yield server
    server.close()


def test_network_tcp_connect_to_host_listener(
    sandbox: Sandbox, tcp_listener: socket.socket
) -> None:
    port = tcp_listener.getsockname()[1]
    script = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
        "    print('CONNECTED')\n"
        "except OSError as exc:\n"
        "    print('refused', exc)\n"
    )
    result = sandbox.call(script)
    assert "refused" in result.output and "CONNECTED" not in result.output
    with pytest.raises(TimeoutError):
        tcp_listener.accept()


def test_network_udp_to_host_socket(sandbox: Sandbox) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(0.3)
    port = receiver.getsockname()[1]
    script = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n"
        f"    s.sendto(b'leak', ('127.0.0.1', {port})); print('sent')\n"
        "except OSError as exc:\n"
        "    print('refused', exc)\n"
        "try:\n"
        "    s.sendto(b'leak', ('8.8.8.8', 53)); print('sent out')\n"
        "except OSError as exc:\n"
        "    print('refused', exc)\n"
    )
    sandbox.call(script)
    try:
        with pytest.raises(TimeoutError):
            receiver.recvfrom(100)
    finally:
        receiver.close()


def test_network_dns_resolve(sandbox: Sandbox) -> None:
    script = (
        "import socket\n"
        "for host in ('example.com', 'pypi.org'):\n"
        "    try:\n"
        "        print('RESOLVED', socket.getaddrinfo(host, 443))\n"
        "    except OSError as exc:\n"
        "        print('failed', exc)\n"
    )
    result = sandbox.call(script)
    assert "RESOLVED" not in result.output
    assert result.output.count("failed") == 2


def test_network_only_loopback_interface(sandbox: Sandbox) -> None:
    result = sandbox.call("import socket; print(sorted(n for _, n in socket.if_nameindex()))")
    assert result.output.strip() == "['lo']"


# --- environment and /proc -------------------------------------------------------


def test_read_worker_environment(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VESSEL_TEST_SECRET", SECRET)
    script = (
        "import os, glob\n"
        "print(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        print(path, open(path, 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(path, exc)\n"
    )
    result = sandbox.call(script)
    assert "VESSEL_OUTBOX" in result.output
    assert SECRET not in result.output
    assert "VESSEL_TEST_SECRET" not in result.output


def test_read_proc_1_environ_and_cmdline(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VESSEL_TEST_SECRET", SECRET)
    script = (
        "for name in ('environ', 'cmdline'):\n"
        "    try:\n"
        "        print(name, open(f'/proc/1/{name}', 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(name, exc)\n"
        "import os; print(os.readlink('/proc/1/cwd') if os.path.exists('/proc/1/cwd') else '-')\n"
    )
    result = sandbox.call(script)
    assert "cmdline" in result.output
    assert SECRET not in result.output
    for host_path in (str(sandbox.root), str(sandbox.package), "/work/", "/root"):
        assert host_path not in result.output


def test_read_host_secret_files(sandbox: Sandbox) -> None:
    script = (
        "import os\n"
        "for path in ('/etc/shadow', '/root', '/home', '/var', '/run', '/etc/ssl/private',\n"
        "             '/proc/1/root/etc/shadow', '/sys/kernel'):\n"
        "    print(path, os.path.exists(path))\n"
        "print(open('/etc/passwd').read())\n"
    )
    result = sandbox.call(script)
    lines = dict(line.rsplit(" ", 1) for line in result.output.splitlines() if line.startswith("/"))
    assert set(lines.values()) == {"False"}, result.output
    assert "root:x:0:0:root:/tmp/vessel:/bin/sh" in result.output


@pytest.fixture
def host_process() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_see_and_signal_host_process(
    sandbox: Sandbox, host_process: subprocess.Popen[bytes]
) -> None:
    pid = host_process.pid
    script = (
        "import os, signal\n"
        "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        f"for target in ({pid}, 1, -1):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL if target != 1 else 0); print('sent', target)\n"
        "    except OSError as exc:\n"
        "        print('refused', target, exc)\n"
    )
    result = sandbox.call(script)
    pids = json.loads(result.output.splitlines()[0].split(" ", 1)[1])
    assert max(pids) < 10, result.output  # bwrap's init, the command and its children only
    time.sleep(0.1)
    assert host_process.poll() is None, "the host process was killed from inside"


# --- writing outside the workspace ----------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "/usr/lib/evil",
        "/etc/evil",
        "/agent/evil",
        "/data/evil",
        "/evil",
        "/tmp/evil",
        "/dev/shm/evil",
    ],
)
def test_write_outside_workspace(sandbox: Sandbox, target: str) -> None:
    script = (
        "try:\n"
        f"    open({target!r}, 'w').write('x'); print('WROTE')\n"
        "except OSError as exc:\n"
        "    print('refused', exc)\n"
    )
    result = sandbox.call(script)
    assert "refused" in result.output and "WROTE" not in result.output
    assert not (sandbox.package / "evil").exists()
    assert not (sandbox.data / "evil").exists()


# --- sessions, process groups and background processes ---------------------------------


@pytest.mark.parametrize("call", ["os.setsid()", "os.setpgid(0, 0)", "os.setpgrp()"])
def test_new_session_or_process_group(sandbox: Sandbox, call: str) -> None:
    script = (
        "import os\n"
        "try:\n"
        f"    {call}; print('ESCAPED')\n"
        "except PermissionError as exc:\n"
        "    print('EPERM', exc.errno)\n"
    )
    assert sandbox.call(script).output == "EPERM 1\n"


def test_setsid_command_line_tool(sandbox: Sandbox) -> None:
    result = sandbox.call(shell="setsid sleep 0 && echo ESCAPED || echo refused")
    assert "ESCAPED" not in result.output


def test_nohup_background_escape(sandbox: Sandbox, marked: Marked) -> None:
    result = sandbox.call(
        shell=f"nohup sh -c '{marked.loop}' >/dev/null 2>&1 & sleep 0.3; echo started", turn="bg"
    )
    assert result.output == "started\n" and result.outcome == "ok"
    marker = sandbox.workspace("bg") / "marker"
    assert marker.exists()
    assert marked.gone()


def test_double_fork_escape(sandbox: Sandbox, marked: Marked) -> None:
    # The grandchild ignores SIGHUP and becomes the tagged loop (exec keeps SIG_IGN).
    script = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    try:\n"
        "        os.setsid()\n"
        "    except OSError:\n"
        "        pass\n"
        "    if os.fork() == 0:\n"
        "        os.close(1); os.close(2)\n"
        "        __import__('signal').signal(1, __import__('signal').SIG_IGN)\n"
        f"        os.execv('/bin/sh', ['sh', '-c', {marked.loop!r}])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('parent done')\n"
    )
    result = sandbox.call(script, turn="df")
    assert result.output == "parent done\n"
    marker = sandbox.workspace("df") / "marker"
    assert marker.exists()
    assert marked.gone()


def test_grandchild_still_running_at_timeout(sandbox: Sandbox, marked: Marked) -> None:
    loop = marked.loop
    started = time.monotonic()
    result = sandbox.call(shell=f"sh -c '{loop}' & sh -c '{loop}' & wait", timeout=1, turn="gc")
    elapsed = time.monotonic() - started
    assert result.output == "[timed out after 1 s]"
    assert result.outcome == "timeout" and result.is_error and result.exit_code is None
    # The loops never end: returning at all means the runner did not wait for them;
    # the bound (far above 1 s + kill + teardown on a loaded host) says it did not hang.
    assert elapsed < 20, elapsed
    marker = sandbox.workspace("gc") / "marker"
    assert marker.exists()
    assert marked.gone()


def _host_process_count() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


@pytest.mark.slow
def test_fork_bomb(sandbox: Sandbox) -> None:
    before = _host_process_count()
    started = time.monotonic()
    # `sleep 600`: the tool never ends by itself, so its end is the runner's doing.
    result = sandbox.call(shell="bomb() { bomb | bomb & }; bomb; sleep 600", timeout=2)
    elapsed = time.monotonic() - started
    assert result.is_error
    assert elapsed < 60, elapsed  # at the 2-s limit (plus a loaded host's teardown)
    # The bomb's processes are reaped (waited for, not slept on).
    deadline = time.monotonic() + 10
    while _host_process_count() >= before + 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _host_process_count() < before + 20
    assert subprocess.run(["true"], check=False).returncode == 0  # the worker can still fork


@pytest.mark.slow
def test_fork_bomb_python(sandbox: Sandbox) -> None:
    script = FORK_BOMB
    # Ends as soon as the cap is hit; the long timeout only matters on a loaded host.
    result = sandbox.call(script, timeout=8)
    if "pids" in sandbox.runner.cgroup_controllers:
        assert "fork refused after" in result.output, result.output
        assert int(result.output.split()[3]) < cgroup.PIDS_MAX
    assert subprocess.run(["true"], check=False).returncode == 0


# --- memory, disk, files, output -----------------------------------------------------------


def test_memory_hog(sandbox: Sandbox) -> None:
    script = (
        "chunks = []\n"
        "try:\n"
        "    for _ in range(64):\n"
        "        chunks.append(bytearray(64 * 1024 * 1024))\n"
        "    print('ALLOCATED 4 GiB')\n"
        "except MemoryError:\n"
        "    print('MemoryError after', len(chunks) * 64, 'MiB')\n"
    )
    result = sandbox.call(script, memory_mb=256)
    assert "ALLOCATED" not in result.output
    assert "MemoryError" in result.output or "killed by signal" in result.output


@pytest.mark.slow
def test_memory_hog_in_many_processes(sandbox: Sandbox) -> None:
    # Each child stays under RLIMIT_DATA; together they pass memory_limit_mb.
    script = (
        "import os, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        try:\n"
        "            b = bytearray(150 * 1024 * 1024)\n"
        "            for i in range(0, len(b), 4096): b[i] = 1\n"
        "        except MemoryError:\n"
        "            pass\n"
        "        time.sleep(3); os._exit(0)\n"
        "time.sleep(1.5)\n"
        "print('survivors', len(os.listdir('/proc')))\n"
    )
    result = sandbox.call(script, memory_mb=256, timeout=3)
    assert subprocess.run(["true"], check=False).returncode == 0
    assert result.outcome in {"ok", "error", "timeout"}


def test_single_file_over_the_size_cap(sandbox: Sandbox) -> None:
    script = (
        "try:\n"
        "    with open('/tmp/vessel/big', 'wb') as f:\n"
        "        for _ in range(20):\n"
        "            f.write(b'x' * 1024 * 1024)\n"
        "    print('WROTE 20 MiB')\n"
        "except OSError as exc:\n"
        "    print('refused', exc)\n"
    )
    result = sandbox.call(script, disk_mb=4, turn="big")
    assert "File too large" in result.output, result.output
    assert (sandbox.workspace("big") / "big").stat().st_size <= 4 * 1024 * 1024


def test_disk_hog_with_dd(sandbox: Sandbox) -> None:
    result = sandbox.call(
        shell="dd if=/dev/zero of=$HOME/hog bs=1M count=100", disk_mb=4, turn="dd"
    )
    assert result.is_error
    assert "SIGXFSZ" in result.output or "File too large" in result.output, result.output
    assert (sandbox.workspace("dd") / "hog").stat().st_size <= 4 * 1024 * 1024


#: Writes 1 MiB files (each under disk_limit_mb) as fast as it can, 100 MiB in all,
#: then waits: only a watchdog of the whole workspace stops it.
FILL_WORKSPACE = (
    "import os, time\n"
    "chunk = b'x' * 1024 * 1024\n"
    "for n in range(100):\n"
    "    with open(f'/tmp/vessel/fill-{n}', 'wb') as f:\n"
    "        f.write(chunk)\n"
    "print('WROTE 100 MiB', flush=True)\n"
    "time.sleep(3)\n"
)


@pytest.mark.parametrize("launchers", [True, False], ids=["launcher", "direct"])
def test_fill_the_workspace_past_workspace_limit_mb(sandbox: Sandbox, launchers: bool) -> None:
    if not launchers:
        sandbox.runner = SandboxRunner(sandbox.runner.workspaces, launchers=False)
    result = sandbox.call(FILL_WORKSPACE, disk_mb=16, workspace_mb=8, timeout=6, turn="fill")
    assert result.outcome == "killed", result.output
    assert result.output.endswith(
        "[the turn's workspace passed its limit of 8 MB: the tool was stopped]"
    ), result.output
    assert result.exit_code is None
    # The next call of the turn finds its workspace over the limit: it is not run.
    again = sandbox.call(shell="echo RAN", workspace_mb=8, turn="fill")
    assert (again.outcome, again.output) == (
        "refused",
        "[the turn's workspace passed its limit of 8 MB: the tool was not run]",
    )
    # Another turn is not affected.
    assert sandbox.call(shell="echo RAN", workspace_mb=8, turn="other").output == "RAN\n"


def test_fill_the_outbox_past_workspace_limit_mb(sandbox: Sandbox) -> None:
    script = FILL_WORKSPACE.replace("/tmp/vessel/fill", "/tmp/vessel/outbox/fill")
    result = sandbox.call(script, disk_mb=16, workspace_mb=8, timeout=6)
    assert result.outcome == "killed", result.output
    assert "passed its limit of 8 MB" in result.output


def test_make_more_files_than_workspace_files(sandbox: Sandbox) -> None:
    script = (
        "import os, time\n"
        "for n in range(50):\n"
        "    os.mkdir(f'/tmp/vessel/d{n}')\n"
        "    for m in range(100):\n"
        "        open(f'/tmp/vessel/d{n}/{m}', 'w').close()\n"
        "print('MADE 5050 FILES', flush=True)\n"
        "time.sleep(3)\n"
    )
    result = sandbox.call(script, workspace_files=500, timeout=6, turn="files")
    assert result.outcome == "killed", result.output
    assert result.output.endswith(
        "[the turn's workspace passed its limit of 500 files: the tool was stopped]"
    ), result.output
    again = sandbox.call(shell="echo RAN", workspace_files=500, turn="files")
    assert again.outcome == "refused" and "500 files: the tool was not run" in again.output


def test_hide_files_behind_links_and_unreadable_folders(sandbox: Sandbox) -> None:
    # Links are counted, never followed (a link to /usr is one entry, not 100,000);
    # a folder made unreadable is still counted.
    script = (
        "import os, time\n"
        "os.symlink('/usr', '/tmp/vessel/usr')\n"
        "os.mkdir('/tmp/vessel/hidden')\n"
        "for m in range(600):\n"
        "    open(f'/tmp/vessel/hidden/{m}', 'w').close()\n"
        "os.chmod('/tmp/vessel/hidden', 0)\n"
        "print('HIDDEN', flush=True)\n"
        "time.sleep(3)\n"
    )
    ok = sandbox.call(
        "import os; os.symlink('/usr', '/tmp/vessel/usr'); print('LINKED')",
        workspace_files=10,
        workspace_mb=1,
    )
    assert (ok.outcome, ok.output) == ("ok", "LINKED\n")
    result = sandbox.call(script, workspace_files=500, timeout=6)
    assert result.outcome == "killed", result.output
    assert "passed its limit of 500 files" in result.output


# --- CPU -----------------------------------------------------------------------------------

#: N threads spin in hashlib (which releases the GIL, so they run in parallel) for
#: a fixed wall time; then the tool prints its own CPU time (user + system).
SPIN = (
    "import hashlib, os, sys, threading, time\n"
    "def spin():\n"
    "    data = b'x' * 1_000_000\n"
    "    while True:\n"
    "        hashlib.sha256(data).digest()\n"
    "for _ in range({threads}):\n"
    "    threading.Thread(target=spin, daemon=True).start()\n"
    "{before}"
    "time.sleep({seconds})\n"
    "t = os.times()\n"
    "print(round(t.user + t.system, 3), flush=True)\n"
)


@pytest.mark.parametrize("launchers", [True, False], ids=["launcher", "direct"])
def test_spin_four_threads_past_the_cpu_quota(sandbox: Sandbox, launchers: bool) -> None:
    if not launchers:
        sandbox.runner = SandboxRunner(sandbox.runner.workspaces, launchers=False)
    if "cpu" not in sandbox.runner.cgroup_controllers:
        pytest.skip("no writable cpu cgroup hierarchy on this host")
    # A quarter of a core for 1.5 s of wall clock: about 0.4 CPU-seconds, however
    # many threads spin (without the quota, 4 threads take every core there is).
    script = SPIN.format(threads=4, before="", seconds=1.5)
    result = sandbox.call(script, cpu_limit=0.25, timeout=4)
    assert result.outcome == "ok", result.output
    assert float(result.output) <= 1.5 * 0.25 * 1.6 + 0.05, result.output
    if not launchers:
        return  # the call's own cgroup is gone with it
    slots = [each.slot for each in sandbox.runner._launchers._free]  # type: ignore[union-attr]
    quotas = {s.read("cpu", "cpu.cfs_quota_us").strip() for s in slots if s is not None}
    assert quotas == {"25000"}  # 0.25 x the 100 ms period


@pytest.mark.parametrize("launchers", [True, False], ids=["launcher", "direct"])
def test_spin_two_threads_past_rlimit_cpu_without_cgroups(
    sandbox: Sandbox, launchers: bool
) -> None:
    sandbox.runner = SandboxRunner(
        sandbox.runner.workspaces, cgroups=CgroupSettings(mode="off"), launchers=launchers
    )
    assert sandbox.runner.cgroup_controllers == ()
    # RLIMIT_CPU = ceil(20 s x 0.05) = 1 CPU-second: 2 spinning threads reach it in
    # about half a second of wall clock, long before the 20-s timeout (generous: on a
    # loaded host the threads may get a tenth of a core).
    script = SPIN.format(threads=2, before="", seconds=30)
    result = sandbox.call(script, cpu_limit=0.05, timeout=20)
    assert (result.outcome, result.output) == (
        "killed",
        "[stopped after 1 s of CPU time: the tool's CPU limit]",
    )


def test_ignore_sigxcpu_and_spin_on(sandbox: Sandbox) -> None:
    # SIGXCPU ignored: the hard limit, one CPU-second later, is a SIGKILL; the
    # tree's CPU time (the launcher's rusage) still names the cause.
    sandbox.runner = SandboxRunner(sandbox.runner.workspaces, cgroups=CgroupSettings(mode="off"))
    before = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
    # RLIMIT_CPU = ceil(20 s x 0.05) = 1 CPU-second, as with a 5-s limit at 0.2; the
    # long wall-clock limit leaves room for a loaded host.
    script = SPIN.format(threads=2, before=before, seconds=30)
    result = sandbox.call(script, cpu_limit=0.05, timeout=20)
    assert (result.outcome, result.output) == (
        "killed",
        "[stopped after 2 s of CPU time: the tool's CPU limit]",
    )


def test_five_thousand_open_files(sandbox: Sandbox) -> None:
    script = (
        "import resource\n"
        "files = []\n"
        "try:\n"
        "    for i in range(5000):\n"
        "        files.append(open('/dev/null'))\n"
        "    print('OPENED 5000')\n"
        "except OSError as exc:\n"
        "    print('stopped at', len(files), exc.errno)\n"
        "del files\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    result = sandbox.call(script)
    assert "OPENED" not in result.output
    first = result.output.splitlines()[0].split()
    assert first[0] == "stopped" and int(first[2]) < 4096 and first[3] == "24"  # EMFILE
    assert "(4096, 4096)" in result.output


def test_raise_own_limits(sandbox: Sandbox) -> None:
    script = (
        "import resource\n"
        "try:\n"
        "    resource.setrlimit(resource.RLIMIT_NOFILE, (65536, 65536)); print('RAISED')\n"
        "except (ValueError, OSError) as exc:\n"
        "    print('refused', exc)\n"
    )
    assert "refused" in sandbox.call(script).output


def test_core_dump(sandbox: Sandbox) -> None:
    result = sandbox.call("import os; os.abort()", turn="core")
    assert "SIGABRT" in result.output
    assert not any("core" in p.name for p in sandbox.workspace("core").iterdir())


@pytest.mark.slow
def test_output_flood_100_mb(sandbox: Sandbox) -> None:
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    script = (
        "import sys\n"
        "line = b'a' * 1023 + b'\\n'\n"
        "for _ in range(100 * 1000):\n"
        "    sys.stdout.buffer.write(line)\n"
    )
    started = time.monotonic()
    result = sandbox.call(script, timeout=20, output_chars=1000)
    elapsed = time.monotonic() - started
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert elapsed < 10, elapsed
    assert result.output.startswith("a" * 1000)
    assert result.outcome == "killed"  # 100 MB passes the 64 MiB hard cap
    assert "[output passed 64 MiB: the tool was killed]" in result.output
    assert result.dropped_chars >= 64 * 1024 * 1024 - 1000
    assert f"[{result.dropped_chars} characters dropped]" in result.output
    assert peak_after - peak_before < 50 * 1024  # KiB: nothing near 100 MB was kept


def test_output_flood_of_invalid_utf8(sandbox: Sandbox) -> None:
    result = sandbox.call("import sys; sys.stdout.buffer.write(b'\\xff\\xfe' * 50000)")
    assert result.output.startswith("\ufffd" * 100)
    assert result.dropped_chars == 100000 - 2000


# --- the outbox ---------------------------------------------------------------------------


def test_outbox_symlink_to_host_file(sandbox: Sandbox) -> None:
    secret = sandbox.root / "host-secret.txt"
    secret.write_text(SECRET)
    script = (
        "import os, sys\n"
        "box = os.environ['VESSEL_OUTBOX']\n"
        f"os.symlink({str(secret)!r}, box + '/leak')\n"
        "os.symlink('/etc/passwd', box + '/passwd')\n"
        "os.mkdir(box + '/d'); os.symlink('/', box + '/d/root')\n"
        "os.mkfifo(box + '/fifo')\n"
        "open(box + '/ok.txt', 'w').write('fine')\n"
    )
    result = sandbox.call(script)
    assert [f.name for f in result.files] == ["ok.txt"]
    assert set(result.skipped_files) == {"leak", "passwd", "d/root", "fifo"}
    assert SECRET not in json.dumps(result.to_dict())


def test_outbox_names_not_utf8_or_with_control_characters(sandbox: Sandbox) -> None:
    # Before: --json printed invalid UTF-8, and the escape reached the platform.
    script = (
        "import os\n"
        "box = os.environ['VESSEL_OUTBOX'].encode()\n"
        "for name in [b'bad\\xff.txt', b'red\\x1b[31m.txt', b'two\\nlines', b'nul\\x7f',\n"
        "             '\\u202etxt.exe'.encode(), b'csi\\xc2\\x9b2J', b'caf\\xc3\\xa9.txt',\n"
        "             b'back\\\\slash.txt', b'ok.txt']:\n"
        "    with open(os.path.join(box, name), 'wb') as f:\n"
        "        f.write(b'data')\n"
        "os.mkdir(os.path.join(box, b'dir\\x07'))\n"
        "open(os.path.join(box, b'dir\\x07', b'inner.txt'), 'wb').write(b'x')\n"
    )
    result = sandbox.call(script)
    assert [f.name for f in result.files] == ["back\\slash.txt", "caf\u00e9.txt", "ok.txt"]
    assert sorted(result.skipped_files) == sorted(
        [
            "bad\\xff.txt",
            "red\\x1b[31m.txt",
            "two\\x0alines",
            "nul\\x7f",
            "\\u202etxt.exe",
            "csi\\x9b2J",
            "dir\\x07",
        ]
    )
    text = json.dumps(result.to_dict(), ensure_ascii=False)
    text.encode("utf-8")  # valid UTF-8: no lone surrogate left
    assert "\x1b" not in text and "\u202e" not in text and "\x9b" not in text


def test_outbox_replaced_by_symlink(sandbox: Sandbox) -> None:
    script = (
        "import os, shutil\n"
        "shutil.rmtree(os.environ['VESSEL_OUTBOX'])\n"
        "os.symlink('/agent', os.environ['VESSEL_OUTBOX'])\n"
    )
    (sandbox.package / "private.txt").write_text(SECRET)
    result = sandbox.call(script)
    assert result.files == ()
    assert SECRET not in json.dumps(result.to_dict())


# --- terminal, IPC, sockets, tracing, namespaces -------------------------------------------


def test_tiocsti_terminal_injection(sandbox: Sandbox) -> None:
    script = (
        "import ctypes, os, termios\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p]\n"
        "master, slave = os.openpty()\n"
        "for request in (termios.TIOCSTI, termios.TIOCSTI | (1 << 32), 0x541C):\n"
        "    for fd in (slave, 0, 1):\n"
        "        rc = libc.ioctl(fd, request, b'x')\n"
        "        print(hex(request), fd, rc, ctypes.get_errno())\n"
    )
    result = sandbox.call(script)
    lines = result.output.splitlines()
    assert len(lines) == 9, result.output
    for line in lines:
        _, _, rc, err = line.split()
        assert rc == "-1" and err == "1", result.output  # EPERM from the filter


def test_shared_memory_and_message_queues(sandbox: Sandbox) -> None:
    script = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def check(name, rc):\n"
        "    print(name, rc, ctypes.get_errno())\n"
        "check('shmget', libc.shmget(0, 4096, 0o1600))\n"
        "check('shmat', ctypes.c_long(libc.shmat(0, None, 0)).value)\n"
        "check('msgget', libc.msgget(0, 0o1600))\n"
        "check('semget', libc.semget(0, 1, 0o1600))\n"
        "check('mq_open', libc.syscall(240, b'q', 0o100 | 2, 0o600, None))\n"
        "try:\n"
        "    from multiprocessing import shared_memory\n"
        "    shared_memory.SharedMemory(create=True, size=4096); print('POSIX shm OK')\n"
        "except OSError as exc:\n"
        "    print('posix shm refused', exc.errno)\n"
    )
    result = sandbox.call(script)
    lines = result.output.splitlines()
    for line in lines[:5]:
        _, rc, err = line.split()
        assert rc == "-1" and err == "1", result.output
    assert "POSIX shm OK" not in result.output


def test_af_unix_socket_file(sandbox: Sandbox) -> None:
    script = (
        "import socket, os\n"
        "for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):\n"
        "    try:\n"
        "        s = socket.socket(socket.AF_UNIX, kind); s.bind('/tmp/vessel/sock')\n"
        "        print('BOUND')\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
        "try:\n"
        "    socket.socket(socket.AF_UNIX).bind('\\0abstract'); print('BOUND abstract')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
        "a, b = socket.socketpair(); a.send(b'ok'); print('socketpair', b.recv(2))\n"
    )
    result = sandbox.call(script, turn="sock")
    assert result.output == "refused 1\nrefused 1\nrefused 1\nsocketpair b'ok'\n"
    assert not (sandbox.workspace("sock") / "sock").exists()


def test_ptrace(sandbox: Sandbox) -> None:
    script = (
        "import ctypes, os, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(2); os._exit(0)\n"
        "print('attach', libc.ptrace(16, child, None, None), ctypes.get_errno())\n"
        "print('traceme', libc.ptrace(0, 0, None, None), ctypes.get_errno())\n"
        "os.kill(child, 9)\n"
    )
    assert sandbox.call(script).output == "attach -1 1\ntraceme -1 1\n"


@pytest.mark.parametrize(
    "shell",
    [
        "unshare -U true",
        "unshare -r true",
        "unshare -n true",
        "unshare -m true",
    ],
)
def test_new_namespaces(sandbox: Sandbox, shell: str) -> None:
    result = sandbox.call(shell=f"{shell} && echo ESCAPED")
    assert "ESCAPED" not in result.output and result.is_error


def test_clone_with_namespace_flags(sandbox: Sandbox) -> None:
    script = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for flag in (0x10000000, 0x40000000, 0x20000000, 0x00020000):\n"
        "    rc = libc.syscall(56, ctypes.c_ulong(flag | 17), None, None, None, None)\n"
        "    if rc == 0:\n"
        "        os._exit(0)\n"
        "    print(hex(flag), rc, ctypes.get_errno())\n"
        "print('clone3', libc.syscall(435, None, 0), ctypes.get_errno())\n"
    )
    lines = sandbox.call(script).output.splitlines()
    assert [line.split()[1:] for line in lines] == [["-1", "1"]] * 4 + [["-1", "38"]]


def test_capabilities_are_gone(sandbox: Sandbox) -> None:
    result = sandbox.call(
        shell="grep -E '^(Cap(Eff|Prm|Bnd)|NoNewPrivs|Seccomp):' /proc/self/status"
    )
    assert result.output.split() == [
        "CapPrm:", "0000000000000000",
        "CapEff:", "0000000000000000",
        "CapBnd:", "0000000000000000",
        "NoNewPrivs:", "1",
        "Seccomp:", "2",
    ]  # fmt: skip


def test_mount_and_chroot(sandbox: Sandbox) -> None:
    script = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.mount(b'none', b'/tmp/vessel', b'tmpfs', 0, None), ctypes.get_errno())\n"
        "print(libc.umount2(b'/agent', 2), ctypes.get_errno())\n"
        "print(libc.chroot(b'/tmp'), ctypes.get_errno())\n"
    )
    assert sandbox.call(script).output == "-1 1\n-1 1\n-1 1\n"


def test_other_kernel_surfaces(sandbox: Sandbox) -> None:
    script = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, nr, args in [\n"
        "    ('bpf', 321, (0, 0, 0)), ('perf_event_open', 298, (0, 0, -1, -1, 0)),\n"
        "    ('userfaultfd', 323, (0,)), ('keyctl', 250, (0, 0)),\n"
        "    ('add_key', 248, (b'user', b'k', b'v', 1, 0)),\n"
        "    ('personality', 135, (0x0040000,)), ('io_uring_setup', 425, (1, 0)),\n"
        "]:\n"
        "    print(name, libc.syscall(nr, *args), ctypes.get_errno())\n"
        "print('personality query', libc.syscall(135, ctypes.c_ulong(0xffffffff)) >= 0)\n"
    )
    result = sandbox.call(script)
    lines = result.output.splitlines()
    for line in lines[:-1]:
        _, rc, err = line.split()
        assert (rc, err) == ("-1", "1"), result.output
    assert lines[-1] == "personality query True"


def test_signal_worker_via_pid_guess(sandbox: Sandbox) -> None:
    # The worker's own pid, as the test knows it, means nothing inside.
    script = (
        "import os, signal\n"
        f"try:\n    os.kill({os.getpid()}, signal.SIGTERM); print('SENT')\n"
        "except ProcessLookupError:\n    print('no such process')\n"
    )
    assert sandbox.call(script).output == "no such process\n"


# --- sockets: vsock, socket files, abstract names (Landlock) ---------------------------
#
# socket(AF_UNIX) is refused by the seccomp filter, but socketpair(AF_UNIX) is
# allowed, and bind() on one of its ends makes a socket file or binds an
# abstract name. The call's Landlock domain (landlock.py, applied by the prefix
# bwrap executes) refuses the first and scopes the second, where the kernel's
# Landlock ABI has them (this machine: 6.18, ABI 7).

#: Python, in the sandbox: an unconnected datagram socket made from a socketpair
#: end (connect(AF_UNSPEC) drops its peer, so anyone may then send to it).
_UNCONNECTED_DGRAM = (
    "import ctypes, socket\n"
    "def unconnected_dgram():\n"
    "    u, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    assert libc.connect(u.fileno(), ctypes.byref(ctypes.c_ushort(0)), 2) == 0\n"
    "    return u, peer\n"
)


def _needs_landlock(abi: int, what: str) -> None:
    if landlock.kernel_abi() < abi:
        pytest.skip(f"{what} needs Landlock ABI {abi}; this kernel has {landlock.kernel_abi()}")


def test_socket_af_vsock_refused(sandbox: Sandbox) -> None:
    # vsock is not stopped by the network namespace: on a VM it reaches the host.
    script = (
        "import socket\n"
        "for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):\n"
        "    try:\n"
        "        socket.socket(40, kind); print('CREATED')\n"
        "    except OSError as exc:\n"
        "        print(exc.errno)\n"
    )
    assert sandbox.call(script).output == "1\n1\n1\n"


def test_socketpair_bind_to_a_workspace_path_makes_no_socket_file(sandbox: Sandbox) -> None:
    _needs_landlock(landlock.ABI_REFER, "refusing socket files")
    script = (
        "import os, socket, stat\n"
        "for path in ('/tmp/vessel/s.sock', os.environ['VESSEL_OUTBOX'] + '/s.sock'):\n"
        "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):\n"
        "        a, b = socket.socketpair(socket.AF_UNIX, kind)\n"
        "        try:\n"
        "            a.bind(path); print('BOUND', path)\n"
        "        except OSError as exc:\n"
        "            print(exc.errno)\n"
        "try:\n"
        "    os.mknod('/tmp/vessel/n.sock', 0o600 | stat.S_IFSOCK); print('MKNOD')\n"
        "except OSError as exc:\n"
        "    print(exc.errno)\n"
        "print(sorted(os.listdir('/tmp/vessel')))\n"
    )
    result = sandbox.call(script, turn="sockets")
    assert result.output == "13\n13\n13\n13\n13\n['outbox']\n", result.output
    workspace = sandbox.workspace("sockets")
    made = [p for p in workspace.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]
    assert made == []


def test_renames_into_another_folder_still_work(sandbox: Sandbox) -> None:
    # Every Landlock filesystem domain refuses moving a file into another folder
    # unless REFER is granted: the ruleset grants it beneath /, or tools break.
    script = (
        "import os\n"
        "os.makedirs('a'); os.makedirs('b'); open('a/f', 'w').write('x')\n"
        "os.rename('a/f', 'b/f'); os.link('b/f', 'a/g'); os.replace('a/g', 'b/g')\n"
        "print(sorted(os.listdir('b')))\n"
    )
    result = sandbox.call(script, workdir="/tmp/vessel")
    assert result.output == "['f', 'g']\n"


def test_abstract_socket_between_two_calls_at_once(sandbox: Sandbox) -> None:
    """Two calls of one agent (one turn, one workspace) running at once try to
    talk over an abstract unix socket: one binds an unconnected datagram socket
    to an abstract name and waits; the other sends to that name.

    It cannot, for two reasons, and this test alone does not tell them apart:
    each call has its own network namespace (abstract names live in one: the
    sender finds no such name, ECONNREFUSED), and each call is its own Landlock
    domain with abstract sockets scoped (EPERM if they shared a namespace).
    The scope itself is proved by the two tests below.
    """
    name = f"vessel-test-{os.getpid()}-{time.monotonic_ns()}"
    server = _UNCONNECTED_DGRAM + (
        "import os, time\n"
        "u, peer = unconnected_dgram()\n"
        f"u.bind(b'\\0{name}'); open('/tmp/vessel/bound', 'w').close()\n"
        "u.settimeout(2.5)\n"
        "try:\n"
        "    print('RECEIVED', u.recv(100))\n"
        "except TimeoutError:\n"
        "    print('nothing')\n"
    )
    client = _UNCONNECTED_DGRAM + (
        "import os, time\n"
        "deadline = time.monotonic() + 2\n"
        "while not os.path.exists('/tmp/vessel/bound') and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print('bound seen', os.path.exists('/tmp/vessel/bound'))\n"
        "c, peer = unconnected_dgram()\n"
        "try:\n"
        f"    c.sendto(b'hello', b'\\0{name}'); print('SENT')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    outputs: dict[str, str] = {}

    def run(role: str, script: str) -> None:
        outputs[role] = sandbox.call(script, name=role, turn="pair", timeout=5).output

    threads = [
        threading.Thread(target=run, args=("server", server)),
        threading.Thread(target=run, args=("client", client)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert outputs["server"] == "nothing\n", outputs
    assert outputs["client"] == "bound seen True\nrefused 111\n", outputs


def test_abstract_socket_bound_outside_the_call_is_unreachable(sandbox: Sandbox) -> None:
    """The Landlock scope itself: a process OUTSIDE the call's domain (this test,
    via nsenter) binds an abstract name in the call's own network namespace;
    the tool, inside the domain, sends to it. Without the scope it arrives (as
    on a kernel before 6.12); with it the kernel refuses (EPERM)."""
    _needs_landlock(landlock.ABI_SCOPE, "scoping abstract unix sockets")
    if shutil.which("nsenter") is None:
        pytest.skip("nsenter (util-linux) is not installed")
    token = f"{os.getpid()}_{time.monotonic_ns()}"
    name = f"vessel-host-{token}"
    tool = f"scope_{token}"
    script = _UNCONNECTED_DGRAM + (
        "import os, time\n"
        "open('/tmp/vessel/ready', 'w').close()\n"
        "deadline = time.monotonic() + 20\n"
        "while not os.path.exists('/tmp/vessel/go') and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "c, peer = unconnected_dgram()\n"
        "try:\n"
        f"    c.sendto(b'hello', b'\\0{name}'); print('SENT')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    workspace = sandbox.workspace("scope")
    outputs: list[str] = []
    call = threading.Thread(
        target=lambda: outputs.append(
            sandbox.call(script, name=tool, turn="scope", timeout=30).output
        )
    )
    call.start()
    try:
        # Generous waits: a loaded host may take seconds to start the call.
        deadline = time.monotonic() + 20
        while not (workspace / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        pid = _pid_running(f"/agent/tools/{tool}.py")
        ns = f"/proc/{pid}"
        enter = ["nsenter", f"--net={ns}/ns/net"]
        owner = -1
        if os.geteuid() != 0:
            # Not root: first the user namespace that owns the call's network
            # namespace (bwrap's outer one, which we own), as the kernel names it.
            with open(f"{ns}/ns/net", "rb") as net:
                owner = fcntl.ioctl(net.fileno(), _NS_GET_USERNS)
            enter = ["nsenter", f"--user=/proc/self/fd/{owner}", "--preserve-credentials", enter[1]]
        listener = subprocess.Popen(
            [
                *enter,
                sys.executable,
                "-c",
                "import socket, sys\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
                f"s.bind(b'\\0{name}'); s.settimeout(2)\n"
                "print('bound', flush=True)\n"
                "try:\n"
                "    print('RECEIVED', s.recv(100))\n"
                "except TimeoutError:\n"
                "    print('nothing')\n",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            pass_fds=(owner,) if owner >= 0 else (),
        )
        if owner >= 0:
            os.close(owner)
        assert listener.stdout is not None
        first = listener.stdout.readline()
        (workspace / "go").touch()
        rest, _ = listener.communicate(timeout=5)
    finally:
        (workspace / "go").touch()
        call.join(30)
    assert first == "bound\n", first + rest
    assert outputs == ["refused 1\n"]
    assert rest == "nothing\n"


#: ioctl on a namespace fd: a new fd of the user namespace that owns it (linux/nsfs.h).
_NS_GET_USERNS = 0xB701


def _pid_running(script: str) -> int:
    """The host pid of the `python3 SCRIPT` process (not bwrap, whose argv ends so too)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"python3", script.encode()]:
                return int(entry.name)
    raise AssertionError(f"no process runs {script}")


def test_prefix_reports_the_landlock_domain_in_force(sandbox: Sandbox) -> None:
    """What the prefix applied, as it says in report mode (the probe's view):
    the kernel accepted the ruleset and the domain, a socket file was refused,
    and a datagram to an abstract name bound before the domain was refused."""
    _needs_landlock(landlock.ABI_SCOPE, "the full report")
    result = sandbox.call(command=(landlock.REPORT_FLAG, "/bin/sh", "-c", "echo tool ran"))
    report = landlock.parse_report(result.output)
    assert report is not None, result.output
    assert report.abi == landlock.kernel_abi()
    assert (report.make_sock, report.scope_abstract) == (True, True)
    assert (report.socket_file_refused, report.abstract_send_refused) == (True, True)
    assert report.problems() == []
    assert result.output.endswith("\ntool ran\n")


def test_environment_holds_exactly_five_variables(sandbox: Sandbox) -> None:
    # Read from the kernel: the prefix (Perl) deleted PWD and added nothing.
    script = "print(sorted(open('/proc/self/environ', 'rb').read().split(b'\\0')[:-1]))"
    result = sandbox.call(script)
    assert result.output == (
        "[b'HOME=/tmp/vessel', b'LANG=C.UTF-8', b'PATH=/usr/local/bin:/usr/bin:/bin', "
        "b'TMPDIR=/tmp/vessel', b'VESSEL_OUTBOX=/tmp/vessel/outbox']\n"
    )


def test_prefix_execs_the_tool_exit_codes_and_signals_as_before(sandbox: Sandbox) -> None:
    # The tool IS the process bwrap started (pid 2, child of bwrap's pid 1):
    # the prefix exec'd it, so no extra parent sits between and swallows a signal.
    pids = sandbox.call("import os; print(os.getpid(), os.getppid())")
    assert pids.output == "2 1\n"
    code = sandbox.call(shell="exit 7")
    assert (code.output, code.exit_code, code.outcome) == ("[exit code 7]", 7, "error")
    killed = sandbox.call("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert (killed.output, killed.exit_code) == ("[exit code 143]\n[killed by signal SIGTERM]", 143)
    missing = sandbox.call(command=("no-such-tool",))
    assert (missing.output, missing.exit_code) == (
        "cannot run 'no-such-tool': No such file or directory\n",
        127,
    )


def _runner_on(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, setting: str) -> Path | None:
    """Replace the sandbox's runner by one on a chosen prefix: `perl`, or `static` (built
    now into the test's folder, named by VESSEL_LANDLOCK_EXEC); the static file's path."""
    built = None
    if setting == "static":
        built = command_prefix.build(sandbox.root / "bin" / "landlock-exec")
        setting = str(built)
    monkeypatch.setenv(command_prefix.ENV_LANDLOCK_EXEC, setting)
    sandbox.runner.close()
    sandbox.runner = runner_module.SandboxRunner(WorkspaceStore(sandbox.root / "ws2"))
    return built


def test_perl_prefix_missing_is_a_sandbox_error_and_the_probe_refuses(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = ("/usr/bin/perl-vessel-missing", *landlock.COMMAND_PREFIX[1:])
    monkeypatch.setattr(landlock, "COMMAND_PREFIX", gone)
    _runner_on(sandbox, monkeypatch, "perl")
    result = sandbox.call(shell="echo ran")
    assert result.outcome == "error" and result.output.startswith(
        "[sandbox error: /usr/bin/perl-vessel-missing not found"
    )
    assert "install perl-base" in result.output
    monkeypatch.setattr(probe, "_confirmed", set())
    with pytest.raises(ConfinementUnavailable, match="perl-vessel-missing not found"):
        probe.check_confinement()


def test_static_prefix_removed_after_start_is_a_sandbox_error(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _runner_on(sandbox, monkeypatch, "static")
    assert built is not None and sandbox.runner.prefix.binary == built.resolve()
    assert sandbox.call(shell="echo ran").output == "ran\n"
    built.unlink()
    result = sandbox.call(shell="echo ran")
    assert result.outcome == "error", result.output
    assert result.output == (
        f"[sandbox error: {command_prefix.STATIC_MOUNT} not found: every call starts with it "
        "(it applies the Landlock ruleset, then runs the tool); rebuild it: "
        "python -m workers.sandbox.command_prefix]"
    )
    assert str(sandbox.root) not in result.output


def test_a_static_prefix_behind_a_closed_folder_runs_calls_from_the_stage(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A root worker's calls run as the sandbox uid, which cannot enter bin/: the
    # worker copies the prefix into its stage, the one bind a call gets at /.vessel.
    built = _runner_on(sandbox, monkeypatch, "static")
    assert built is not None
    built.parent.chmod(0o700)
    result = sandbox.call(shell="ls -A /.vessel; readlink /etc; echo ran")
    assert result.output == "etc\nlandlock-exec\n/.vessel/etc\nran\n", result.output
    assert sandbox.runner.prefix.binary == built.resolve()


def test_a_landlock_exec_setting_naming_no_executable_stops_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(command_prefix.ENV_LANDLOCK_EXEC, str(tmp_path / "nothing-here"))
    monkeypatch.setattr(probe, "_confirmed", set())
    with pytest.raises(
        ConfinementUnavailable, match=r"VESSEL_LANDLOCK_EXEC=.*nothing-here: not an executable file"
    ):
        probe.check_confinement()


def test_calls_start_with_the_static_prefix_where_it_is_built(sandbox: Sandbox) -> None:
    # scripts/setup.sh builds it into the virtualenv: this suite runs on it (and
    # scripts/test-range runs the hostile suite once more on the Perl prefix).
    if os.environ.get(command_prefix.ENV_LANDLOCK_EXEC):
        pytest.skip(f"{command_prefix.ENV_LANDLOCK_EXEC} is set: this run chose its prefix")
    if not command_prefix.default_path().is_file():
        pytest.fail(
            f"{command_prefix.default_path()} is not built: run bash scripts/setup.sh "
            "(the suite is meant to run on the static prefix)"
        )
    assert sandbox.runner.prefix.argv == (command_prefix.STATIC_MOUNT,)
    assert sandbox.runner.prefix.binary == command_prefix.default_path().resolve()


@pytest.mark.parametrize("which", ["static", "perl"])
def test_both_prefixes_leave_the_same_call(
    which: str, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a tool sees does not depend on the prefix: the environment (five
    # variables), the Landlock report, a missing command, exit codes.
    _runner_on(sandbox, monkeypatch, which)
    assert (sandbox.runner.prefix.binary is not None) == (which == "static")
    env = sandbox.call(command=("/usr/bin/env",))
    assert sorted(line.split("=", 1)[0] for line in env.output.splitlines()) == [
        "HOME", "LANG", "PATH", "TMPDIR", "VESSEL_OUTBOX"
    ]  # fmt: skip
    report = sandbox.call(command=(landlock.REPORT_FLAG, "/bin/true"))
    parsed = landlock.parse_report(report.output)
    assert parsed is not None and parsed.problems() == [], report.output
    missing = sandbox.call(command=("no-such-tool",))
    assert (missing.output, missing.exit_code) == (
        "cannot run 'no-such-tool': No such file or directory\n",
        127,
    )
    dashed = sandbox.call(command=("-x",))
    assert (dashed.output, dashed.exit_code) == (
        "cannot run '-x': No such file or directory\n",
        127,
    )
    code = sandbox.call(shell="exit 7")
    assert code.exit_code == 7
    cmdline = sandbox.call(shell="tr '\\0' ' ' < /proc/1/cmdline")
    assert str(sandbox.root) not in cmdline.output


@pytest.mark.parametrize(
    ("line", "problems", "says"),
    [
        ("abi=-1 make_sock=0 scope_abstract=0 socket_file_refused=0 abstract_send_refused=0",
         0, "no Landlock in this kernel"),
        ("abi=1 make_sock=0 scope_abstract=0 socket_file_refused=0 abstract_send_refused=0",
         0, "socket files NOT refused (needs Landlock ABI 2"),
        ("abi=3 make_sock=1 scope_abstract=0 socket_file_refused=1 abstract_send_refused=0",
         0, "abstract unix sockets NOT scoped (needs Landlock ABI 6"),
        ("abi=3 make_sock=0 scope_abstract=0 socket_file_refused=0 abstract_send_refused=0",
         1, "socket files NOT refused"),
        ("abi=7 make_sock=1 scope_abstract=1 socket_file_refused=1 abstract_send_refused=0",
         1, "abstract unix sockets NOT scoped"),
        ("abi=7 make_sock=1 scope_abstract=1 socket_file_refused=1 abstract_send_refused=1",
         0, "socket files refused (LANDLOCK_ACCESS_FS_MAKE_SOCK); abstract unix sockets scoped"),
    ],
)  # fmt: skip
def test_landlock_report_on_each_kernel(line: str, problems: int, says: str) -> None:
    # What the probe concludes from the prefix's line on older kernels (this one
    # has ABI 7): what the ABI lacks is said, never refused; what it has but
    # does not hold is refused.
    report = landlock.parse_report(f"vessel-landlock: {line}\n")
    assert report is not None
    assert len(report.problems()) == problems
    assert says in report.describe()
