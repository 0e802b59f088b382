"""The runner's parts and rules one at a time: outbox caps, workspaces and their
TTL, output cutting, timeout and exit texts, cancel, the output hard cap,
concurrency, and the confinement probe."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import resource
import shutil
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from broker.protocol import format_seconds
from workers.sandbox import (
    bwrap,
    call_results,
    call_spawn,
    cgroup,
    command_prefix,
    folders,
    launcher_children,
    launcher_client,
    launcher_placement,
    launcher_pool,
    launcher_protocol,
    limits,
    outbox,
    probe,
    process,
    reachable,
    runner,
    seccomp,
    slot_launcher,
    system_stage,
)
from workers.sandbox import workspace as workspace_module
from workers.sandbox.folder_state import folder_state
from workers.sandbox.launcher_network import network_mode
from workers.sandbox.outbox import collect_outbox, ensure_mount_point, escaped_name, unsafe_name
from workers.sandbox.runner import SandboxRunner, timed_out_text
from workers.sandbox.standby import standby_mode
from workers.sandbox.workspace import WorkspaceStore, default_workspace_root

from .conftest import Marked, Sandbox

# --- outbox -------------------------------------------------------------------------------


def test_outbox_reads_regular_files_with_relative_names(tmp_path: Path) -> None:
    box = tmp_path / "outbox"
    (box / "a" / "b").mkdir(parents=True)
    (box / "top.txt").write_bytes(b"top")
    (box / "a" / "b" / "deep.bin").write_bytes(b"\x00\x01")
    got = collect_outbox(box)
    assert [f.name for f in got.files] == ["a/b/deep.bin", "top.txt"]
    deep = got.files[0]
    assert deep.size == 2
    assert deep.sha256 == hashlib.sha256(b"\x00\x01").hexdigest()
    assert base64.b64decode(deep.content_base64) == b"\x00\x01"
    assert got.skipped == ()


def test_outbox_total_cap_skips_and_names_files(tmp_path: Path) -> None:
    box = tmp_path / "outbox"
    box.mkdir()
    (box / "1.bin").write_bytes(b"x" * 600)
    (box / "2.bin").write_bytes(b"x" * 600)
    (box / "3.bin").write_bytes(b"x" * 300)
    got = collect_outbox(box, cap_bytes=1000)
    assert [f.name for f in got.files] == ["1.bin", "3.bin"]
    assert got.skipped == ("2.bin",)


def test_outbox_skips_links_fifos_and_sockets(tmp_path: Path) -> None:
    box = tmp_path / "outbox"
    box.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("secret")
    (box / "link").symlink_to(secret)
    (box / "dirlink").symlink_to(tmp_path)
    os.mkfifo(box / "fifo")
    os.link(secret, box / "hardlink")  # a hard link is a regular file the tool could make
    got = collect_outbox(box)
    assert set(got.skipped) == {"link", "dirlink", "fifo"}
    assert [f.name for f in got.files] == ["hardlink"]


def test_outbox_escaped_names_are_one_to_one() -> None:
    # Distinct byte strings stay distinct once escaped, and every escape is printable.
    names = ["a\\xff", "a\udcff", "a\\x1b", "a\x1b", "a\u2028", "a\\u2028", "plain é"]
    escaped = [escaped_name(n) for n in names]
    assert len(set(escaped)) == len(names)
    assert all(e.isprintable() for e in escaped)
    assert escaped_name("plain é") == "plain é"
    assert [unsafe_name(n) for n in names] == [False, True, False, True, True, False, False]


def test_outbox_missing_or_a_link_returns_nothing(tmp_path: Path) -> None:
    assert collect_outbox(tmp_path / "absent").files == ()
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("f")
    (tmp_path / "outbox").symlink_to(tmp_path / "real")
    assert collect_outbox(tmp_path / "outbox").files == ()


def test_outbox_mount_point_replaces_links_and_keeps_folders(tmp_path: Path) -> None:
    point = tmp_path / "outbox"
    point.symlink_to("/etc")
    ensure_mount_point(point)
    assert point.is_dir() and not point.is_symlink()
    (point / "keep").write_text("x")
    ensure_mount_point(point)  # a folder is never removed: it may be a live mount point
    assert (point / "keep").exists()


def test_outbox_mount_point_made_by_many_at_once_never_fails(tmp_path: Path) -> None:
    # The first calls of a turn, in threads and in other workers sharing the
    # workspace root, all make sure of the same folder at the same moment; a
    # lost mkdir race ended a call as "[sandbox error: ... File exists]" without
    # running it (seen in tests/cluster/test_cluster_crash.py).
    for trial in range(40):
        point = tmp_path / f"t{trial}" / "outbox"
        point.parent.mkdir()
        start = threading.Barrier(8)
        failures: list[BaseException] = []

        def make(
            point: Path = point,
            start: threading.Barrier = start,
            failures: list[BaseException] = failures,
        ) -> None:
            start.wait()
            try:
                ensure_mount_point(point)
            except OSError as exc:
                failures.append(exc)

        threads = [threading.Thread(target=make) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == [] and point.is_dir() and not point.is_symlink()


def test_parallel_calls_of_one_turn_keep_their_own_outbox(sandbox: Sandbox) -> None:
    script = (
        "import json, os, sys, time\n"
        "n = json.load(sys.stdin)['n']\n"
        "box = os.environ['VESSEL_OUTBOX']\n"
        "open(f'{box}/{n}.txt', 'w').write(str(n))\n"
        "time.sleep(0.5)\n"
        "print(sorted(os.listdir(box)))\n"
    )
    agent, tool = sandbox.agent_and_tool(script)
    results: dict[int, tuple[str, list[str]]] = {}

    def one(n: int) -> None:
        r = sandbox.runner.run(
            call_id=f"c{n}", agent=agent, tool=tool, arguments={"n": n}, turn="t"
        )
        results[n] = (r.output, [f.name for f in r.files])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {n: (f"['{n}.txt']\n", [f"{n}.txt"]) for n in range(3)}
    store = sandbox.runner.workspaces
    store.flush()  # outboxes are removed off the calls' path
    outboxes = store.root / ".outbox"
    pool = sandbox.runner._launchers
    # Fresh ones only: spares, and the outbox of a standby started for the turn's next call.
    waiting = {each.standby.outbox for each in (pool._free if pool else []) if each.standby}
    assert set(outboxes.iterdir()) == set(store._spares.get(outboxes, [])) | waiting
    assert all(list(spare.iterdir()) == [] for spare in outboxes.iterdir())


def test_outbox_files_do_not_carry_over_between_calls(sandbox: Sandbox) -> None:
    write = "import os; open(os.environ['VESSEL_OUTBOX'] + '/f.txt', 'w').write('1')"
    assert [f.name for f in sandbox.call(write, turn="t").files] == ["f.txt"]
    assert sandbox.call("print('no files')", turn="t").files == ()


def test_outbox_cap_through_the_runner(sandbox: Sandbox) -> None:
    sandbox.runner = SandboxRunner(sandbox.runner.workspaces, outbox_cap_bytes=1024)
    script = (
        "import os\n"
        "box = os.environ['VESSEL_OUTBOX']\n"
        "open(box + '/big', 'wb').write(b'x' * 2048)\n"
        "open(box + '/small', 'wb').write(b'x' * 10)\n"
    )
    result = sandbox.call(script)
    assert [f.name for f in result.files] == ["small"]
    assert result.skipped_files == ("big",)


# --- workspaces ---------------------------------------------------------------------------


def test_workspace_per_turn_mode_0700(tmp_path: Path) -> None:
    store = WorkspaceStore(tmp_path / "root")
    first = store.for_turn("agent-a", "turn-1")
    assert store.for_turn("agent-a", "turn-1") == first
    assert store.for_turn("agent-a", "turn-2") != first
    assert store.for_turn("agent-b", "turn-1") != first
    if os.geteuid() != 0:
        for path in (tmp_path / "root", tmp_path / "root" / "agent-a", first):
            assert (path.stat().st_mode & 0o777) == 0o700
        return
    # A root worker: the parents are root's, searchable by the sandbox gid only;
    # the workspace is the sandbox uid's, 0700.
    identity = store.identity
    for path in (tmp_path / "root", tmp_path / "root" / "agent-a"):
        st = path.stat()
        assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o710, 0, identity.gid)
    st = first.stat()
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o700, identity.uid, identity.gid)


def test_workspace_turn_ids_never_become_paths(tmp_path: Path) -> None:
    store = WorkspaceStore(tmp_path / "root")
    path = store.for_turn("agent-a", "../../etc")
    assert path.parent == tmp_path / "root" / "agent-a"
    with pytest.raises(ValueError):
        store.for_turn("../x", "t")


def test_one_call_workspace_is_fresh_and_removed_after_the_call(sandbox: Sandbox) -> None:
    result = sandbox.call("import os; print(os.listdir('/tmp/vessel'))")
    assert result.output == "['outbox']\n"
    store = sandbox.runner.workspaces
    store.flush()  # removed off the call's path; fresh ones made ahead are all that is left
    agent_dir = store.root / "test-agent"
    assert set(agent_dir.iterdir()) == set(store._spares.get(agent_dir, []))
    for spare in agent_dir.iterdir():
        assert [p.name for p in spare.iterdir()] == ["outbox"]
        assert list((spare / "outbox").iterdir()) == []


def test_one_call_workspaces_made_ahead_are_fresh_each_call(sandbox: Sandbox) -> None:
    write = (
        "import os\n"
        "print(sorted(os.listdir('/tmp/vessel')), os.listdir(os.environ['VESSEL_OUTBOX']))\n"
        "open('/tmp/vessel/left', 'w').write('x')\n"
        "open(os.environ['VESSEL_OUTBOX'] + '/f', 'w').write('x')\n"
    )
    for _ in range(4):
        result = sandbox.call(write)
        assert result.output == "['outbox'] []\n"
        assert [f.name for f in result.files] == ["f"]
        sandbox.runner.workspaces.flush()  # the janitor made the next ones ahead


def _used(store: WorkspaceStore, kind: str) -> Path:
    """A folder of `kind` (a one-call workspace, or an outbox) as a call gets it."""
    return store.for_turn("agent-a", None) if kind == "workspace" else store.new_outbox()


def _again(store: WorkspaceStore, kind: str, count: int = 3) -> set[Path]:
    return {_used(store, kind) for _ in range(count)}


@pytest.mark.parametrize("kind", ["workspace", "outbox"])
def test_a_folder_a_call_left_as_new_is_handed_out_again(tmp_path: Path, kind: str) -> None:
    store = WorkspaceStore(tmp_path / "root")
    used = _used(store, kind)
    store.discard_later(used)
    store.flush()
    assert _used(store, kind) == used  # kept as it was: no rmdir, no mkdir
    assert folder_state(used) == store._fresh[(used.parent, "")]


def _chattr_sync(path: Path) -> None:
    """chattr +S, as a tool owning the folder may: every later write synchronous."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = struct.unpack("=q", fcntl.ioctl(fd, 0x80086601, bytes(8)))[0]
        fcntl.ioctl(fd, 0x40086602, struct.pack("=q", flags | 0x8))  # FS_IOC_SETFLAGS, S
    finally:
        os.close(fd)


def _grow(path: Path) -> None:
    for n in range(300):
        (path / f"{n:0100d}").touch()
    for n in range(300):
        (path / f"{n:0100d}").unlink()


#: What a tool can do to a folder it owns and leave it empty.
_CHANGES = {
    "a file left": lambda p: (p / "left").write_text("x"),
    "a folder left": lambda p: (p / "d").mkdir(),
    "chmod 0755": lambda p: p.chmod(0o755),
    "chmod g+s": lambda p: p.chmod(0o2700),
    "a user xattr": lambda p: os.setxattr(p, "user.mark", b"1"),
    "chattr +S": _chattr_sync,
    "grown": _grow,
}


@pytest.mark.parametrize("change", sorted(_CHANGES))
@pytest.mark.parametrize(
    ("kind", "inner"),
    [("workspace", ""), ("outbox", ""), ("workspace", "outbox")],
    ids=["workspace", "outbox", "workspace's outbox"],
)
def test_a_folder_a_call_changed_is_never_handed_out_again(
    tmp_path: Path, kind: str, inner: str, change: str
) -> None:
    store = WorkspaceStore(tmp_path / "root")
    used = _used(store, kind)
    target = used / inner if inner else used
    try:
        _CHANGES[change](target)
    except OSError as exc:  # a file system without xattrs or flags: nothing to leave
        pytest.skip(f"{change} not possible here: {exc}")
    store.discard_later(used)
    store.flush()
    assert not used.exists()  # removed, and a fresh one made instead
    for fresh in _again(store, kind):
        assert fresh != used
        assert store.looks_fresh(fresh)
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o700


def test_workspaces_are_made_while_another_worker_removes_the_empty_parents(
    tmp_path: Path,
) -> None:
    # Another worker's close() rmdirs the agents' folders it made once they are
    # empty: a folder may vanish between this store's mkdir, its EEXIST check and
    # its chmod. Every workspace asked for meanwhile is still made.
    root = tmp_path / "root"
    store = WorkspaceStore(root)
    stop = threading.Event()

    def remove_empty_parents() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):  # close() leaves the root itself
                os.rmdir(root / "a")
            time.sleep(0.005)  # 200 closes a second: far more than any fleet

    remover = threading.Thread(target=remove_empty_parents)
    remover.start()
    try:
        for i in range(1500):
            store._ready.clear()  # as a fresh worker's store: it makes every parent
            if i % 2:
                path = store.for_turn("a", None)
                store.discard(path)
            else:
                path = store.for_turn("a", f"turn-{i}")
                store.end_turn("a", f"turn-{i}")
    finally:
        stop.set()
        remover.join()


def test_end_turn_removes_the_workspace(tmp_path: Path) -> None:
    store = WorkspaceStore(tmp_path / "root")
    path = store.for_turn("agent-a", "t")
    (path / "sub").mkdir()
    (path / "sub" / "f").write_text("x")
    os.chmod(path / "sub", 0o000)  # a tool may leave an unreadable folder
    store.end_turn("agent-a", "t")
    assert not path.exists()
    store.end_turn("agent-a", "t")  # twice is fine


def test_sweep_removes_only_idle_workspaces(tmp_path: Path) -> None:
    store = WorkspaceStore(tmp_path / "root", ttl_seconds=60)
    idle = store.for_turn("agent-a", "old")
    fresh = store.for_turn("agent-a", "new")
    past = time.time() - 120
    os.utime(idle, (past, past))
    assert store.sweep() == 1
    assert not idle.exists() and fresh.exists()
    assert store.sweep() == 0


def test_using_a_workspace_refreshes_its_ttl(tmp_path: Path) -> None:
    store = WorkspaceStore(tmp_path / "root", ttl_seconds=60)
    path = store.for_turn("agent-a", "t")
    past = time.time() - 120
    os.utime(path, (past, past))
    store.for_turn("agent-a", "t")
    assert store.sweep() == 0


def test_default_workspace_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VESSEL_WORKSPACE_ROOT", str(tmp_path))
    assert default_workspace_root() == tmp_path
    monkeypatch.delenv("VESSEL_WORKSPACE_ROOT")
    assert default_workspace_root() == workspace_module.DEFAULT_WORKSPACE_ROOT


# --- what the model sees --------------------------------------------------------------------


def test_output_cut_with_the_dropped_note(sandbox: Sandbox) -> None:
    result = sandbox.call("print('x' * 5000)", output_chars=1000)
    assert result.output == "x" * 1000 + "\n[4001 characters dropped]"
    assert result.dropped_chars == 4001
    assert not result.is_error


def test_output_exactly_at_the_limit_is_not_cut(sandbox: Sandbox) -> None:
    result = sandbox.call("import sys; sys.stdout.write('y' * 1000)", output_chars=1000)
    assert result.output == "y" * 1000 and result.dropped_chars == 0


def test_empty_output_becomes_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.call(shell="exit 3")
    assert (result.output, result.exit_code, result.is_error) == ("[exit code 3]", 3, True)
    assert result.outcome == "error"
    ok = sandbox.call(shell="true")
    assert (ok.output, ok.exit_code, ok.is_error) == ("[exit code 0]", 0, False)


def test_nonzero_exit_with_output_is_an_error(sandbox: Sandbox) -> None:
    result = sandbox.call(shell="echo oops; exit 2")
    assert (result.output, result.is_error, result.exit_code) == ("oops\n", True, 2)


def test_killed_by_a_signal_says_which(sandbox: Sandbox) -> None:
    result = sandbox.call("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert result.is_error and result.exit_code == 128 + 11
    assert result.output == "[exit code 139]\n[killed by signal SIGSEGV]"


def test_missing_command_is_reported_without_host_paths(sandbox: Sandbox) -> None:
    result = sandbox.call(command=("no-such-tool", "--x"))
    assert result.is_error and "no-such-tool" in result.output
    assert str(sandbox.root) not in result.output


def test_missing_mount_source_is_reported_without_host_paths(sandbox: Sandbox) -> None:
    gone = sandbox.root / "gone"
    result = sandbox.call(shell="true", mounts={"/data": gone})
    assert result.is_error and result.outcome == "error"
    assert str(sandbox.root) not in result.output, result.output


def test_format_seconds_like_the_seed() -> None:
    assert format_seconds(2.0) == "2"
    assert format_seconds(30) == "30"
    assert format_seconds(1.5) == "1.5"
    assert timed_out_text(2.0) == "[timed out after 2 s]"


def test_timeout_text_and_prompt_return(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.call(shell="echo partial; sleep 30", timeout=1)
    # Prompt: back long before the tool's own 30 s (a loaded 2-core machine
    # takes seconds to start and reap a confined call; that is not a hang).
    assert time.monotonic() - started < 15.0
    assert result.output == "[timed out after 1 s]"
    assert (result.outcome, result.is_error, result.exit_code) == ("timeout", True, None)


def test_fractional_timeout_text(sandbox: Sandbox) -> None:
    assert sandbox.call(shell="sleep 30", timeout=0.5).output == "[timed out after 0.5 s]"


def test_timeout_while_output_stays_open_without_writes(sandbox: Sandbox) -> None:
    # The tool closes nothing and writes nothing: only the deadline ends it.
    script = "import time\nwhile True: time.sleep(1)"
    assert sandbox.call(script, timeout=1).outcome == "timeout"


def test_tool_that_never_reads_a_large_stdin(sandbox: Sandbox) -> None:
    big = {"blob": "z" * 2_000_000}
    result = sandbox.call(shell="echo ignored input", arguments=big)
    assert result.output == "ignored input\n" and result.outcome == "ok"


def test_large_stdin_is_delivered_whole(sandbox: Sandbox) -> None:
    big = {"blob": "z" * 2_000_000}
    result = sandbox.call("import json, sys; print(len(json.load(sys.stdin)['blob']))", big)
    assert result.output == "2000000\n"


def test_output_hard_cap_kills_and_says_so(sandbox: Sandbox) -> None:
    sandbox.runner = SandboxRunner(sandbox.runner.workspaces, output_hard_cap_bytes=1024 * 1024)
    started = time.monotonic()
    result = sandbox.call("import sys\nwhile True: sys.stdout.write('f' * 65536)", timeout=10)
    assert time.monotonic() - started < 5
    assert result.outcome == "killed" and result.is_error and result.exit_code is None
    assert result.output.endswith("\n[output passed 1 MiB: the tool was killed]")
    assert result.dropped_chars >= 1024 * 1024 - 2000


# --- cancel ---------------------------------------------------------------------------------


def test_cancel_from_another_thread_kills_the_tree(sandbox: Sandbox, marked: Marked) -> None:
    loop = marked.loop
    running: list[int] = []
    cancel = threading.Event()
    marker = sandbox.workspace("cancel") / "marker"

    def set_later() -> None:
        deadline = time.monotonic() + 5
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        running.extend(marked.pids())
        set_at.append(time.monotonic())
        cancel.set()

    set_at: list[float] = []
    setter = threading.Thread(target=set_later)
    setter.start()
    result = sandbox.call(
        shell=f"sh -c '{loop}' & sleep 30", timeout=10, turn="cancel", cancel=cancel
    )
    returned = time.monotonic()
    setter.join()
    assert result.output == "[cancelled]"
    assert (result.outcome, result.is_error) == ("cancelled", True)
    # At the cancel, not at the 10-s limit nor after `sleep 30`: the runner polls every
    # 50 ms; the rest is the kill and the namespace teardown, slow on a loaded host.
    assert returned - set_at[0] < 3.0, returned - set_at[0]
    assert running  # the tagged loop ran (the proof below is not vacuous)
    assert marked.gone()


def test_cancel_before_start_spawns_nothing(sandbox: Sandbox) -> None:
    cancel = threading.Event()
    cancel.set()
    result = sandbox.call(shell="touch /tmp/vessel/ran", turn="pre", cancel=cancel)
    assert result.output == "[cancelled]" and result.outcome == "cancelled"
    assert not (sandbox.workspace("pre") / "ran").exists()


# --- many at once -----------------------------------------------------------------------------


def test_concurrent_calls_from_many_threads(sandbox: Sandbox) -> None:
    agent, tool = sandbox.agent_and_tool("import json, sys; print(json.load(sys.stdin)['n'])")
    results: dict[int, str] = {}

    def one(n: int) -> None:
        results[n] = sandbox.runner.run(
            call_id=f"c{n}", agent=agent, tool=tool, arguments={"n": n}, turn=f"t{n}"
        ).output

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {n: f"{n}\n" for n in range(8)}


def test_no_descriptor_leaks(sandbox: Sandbox) -> None:
    # Counted once the workspace janitor is idle: a folder it is looking at
    # (`looks_fresh`) holds a descriptor for that moment, not a leaked one.
    # Three calls first: the third leaves a standby (`standby.py`) whose pipes and pidfd
    # are held until the next call of the same kind, as at the end here.
    for _ in range(3):
        sandbox.call("print(1)", timeout=0.5)
    sandbox.runner.workspaces.flush()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        sandbox.call("print(1)", timeout=0.5)
    sandbox.call(shell="sleep 30", timeout=0.5)
    sandbox.runner.workspaces.flush()
    assert len(os.listdir("/proc/self/fd")) == before


def test_cgroups_are_removed_after_calls(sandbox: Sandbox) -> None:
    # The direct path: one cgroup per call, removed after it.
    sandbox.runner = SandboxRunner(sandbox.runner.workspaces, launchers=False)
    support = sandbox.runner._cgroups
    if not support.controllers:
        pytest.skip("no writable cgroup hierarchy on this host")
    sandbox.call(shell="sleep 30 & sleep 30", timeout=0.3)
    prefix = f"vessel-call-{os.getpid()}-"
    for parent in support.parents.values():  # call cgroups: `<prefix><n>` (slots: `slot<n>`)
        names = [d.name for d in parent.iterdir() if d.name.startswith(prefix)]
        assert not [n for n in names if n[len(prefix) :].isdigit()]


# --- building blocks ----------------------------------------------------------------------------


def test_seccomp_filter_builds_and_each_fd_is_fresh() -> None:
    data = seccomp.filter_bytes()
    assert len(data) > 100 and len(data) % 8 == 0  # BPF instructions are 8 bytes
    a, b = seccomp.filter_fd(), seccomp.filter_fd()
    try:
        assert a != b
        assert os.read(a, len(data) + 1) == data
        assert os.read(b, len(data) + 1) == data
    finally:
        os.close(a)
        os.close(b)


def test_bwrap_options_hide_the_host(tmp_path: Path) -> None:
    layout = bwrap.Layout(
        package_dir=tmp_path / "pkg",
        workspace=tmp_path / "ws",
        outbox=tmp_path / "box",
        mounts={"/data": tmp_path / "data", "/data/inner": tmp_path / "inner"},
        workdir="/data",
        stage=tmp_path / "stage",
        prefix=command_prefix.perl_prefix(),
    )
    opts = bwrap.bwrap_options(layout, seccomp_fd=9)
    # The Perl prefix's own variable is set for it; nothing is bound for it.
    assert opts[opts.index("PERL_SKIP_LOCALE_INIT") + 1] == "1"
    assert command_prefix.STATIC_MOUNT not in opts
    for needed in ("--unshare-all", "--die-with-parent", "--new-session", "--disable-userns"):
        assert needed in opts
    assert opts[opts.index("--cap-drop") + 1] == "ALL"
    binds = [tuple(opts[i + 1 : i + 3]) for i, o in enumerate(opts) if o in ("--bind", "--ro-bind")]
    targets = [t for _, t in binds]
    for hidden in ("/root", "/home", "/var", "/run", "/etc/shadow", "/etc/ssl/private", "/etc"):
        assert hidden not in targets
    assert targets.index("/data") < targets.index("/data/inner")
    assert ("--bind", str(tmp_path / "ws"), "/tmp/vessel") == (
        "--bind",
        *binds[targets.index("/tmp/vessel")],
    )
    assert "--dir" not in opts  # /data is a mount
    assert opts[-2:] == ["--seccomp", "9"]


def test_the_stage_is_one_read_only_bind_and_the_static_prefix_sets_no_perl_variable(
    tmp_path: Path,
) -> None:
    layout = bwrap.Layout(
        package_dir=tmp_path / "pkg",
        workspace=tmp_path / "ws",
        outbox=tmp_path / "box",
        mounts={},
        workdir="/tmp/vessel",
        stage=tmp_path / "stage",
        prefix=command_prefix.CommandPrefix(
            argv=(command_prefix.STATIC_MOUNT,),
            binary=tmp_path / "landlock-exec",
            describe="test",
        ),
    )
    opts = bwrap.bwrap_options(layout, seccomp_fd=9)
    binds = [tuple(opts[i : i + 3]) for i, o in enumerate(opts) if o in ("--bind", "--ro-bind")]
    # /etc, the certificates and the prefix are all in the stage: one bind, read-only.
    assert [b for b in binds if b[2].startswith("/.vessel")] == [
        ("--ro-bind", str(tmp_path / "stage"), bwrap.STAGE_MOUNT)
    ]
    assert command_prefix.STATIC_MOUNT.startswith(bwrap.STAGE_MOUNT + "/")
    assert bwrap.ETC_MOUNT == bwrap.STAGE_MOUNT + "/etc"
    at = opts.index("/etc")
    assert opts[at - 2 : at] == ["--symlink", bwrap.ETC_MOUNT]
    assert str(tmp_path / "landlock-exec") not in opts
    assert "PERL_SKIP_LOCALE_INIT" not in opts
    # Before the root is remounted read-only: the bind is part of the fixed shape.
    assert opts.index(bwrap.STAGE_MOUNT) < opts.index("--remount-ro")


def test_the_prefix_is_chosen_by_the_setting(tmp_path: Path) -> None:
    assert command_prefix.choose({"VESSEL_LANDLOCK_EXEC": "perl"}).binary is None
    built = command_prefix.build(tmp_path / "bin" / "landlock-exec")
    (tmp_path / "bin").chmod(0o755)
    chosen = command_prefix.choose({"VESSEL_LANDLOCK_EXEC": str(built)})
    assert (chosen.argv, chosen.binary) == ((command_prefix.STATIC_MOUNT,), built.resolve())
    with pytest.raises(ValueError, match=r"VESSEL_LANDLOCK_EXEC=.*nope: not an executable file"):
        command_prefix.choose({"VESSEL_LANDLOCK_EXEC": str(tmp_path / "nope")})
    (tmp_path / "plain").write_text("not a program")
    with pytest.raises(ValueError, match="not an executable file"):
        command_prefix.choose({"VESSEL_LANDLOCK_EXEC": str(tmp_path / "plain")})


def test_a_static_prefix_the_sandbox_uid_cannot_reach_is_still_chosen(tmp_path: Path) -> None:
    # The worker copies it into its stage: the sandbox uid reaches the copy.
    built = command_prefix.build(tmp_path / "closed" / "landlock-exec")
    (tmp_path / "closed").chmod(0o700)
    chosen = command_prefix.choose({"VESSEL_LANDLOCK_EXEC": str(built)})
    assert (chosen.argv, chosen.binary) == ((command_prefix.STATIC_MOUNT,), built.resolve())


def test_building_without_a_compiler_says_so(tmp_path: Path) -> None:
    with pytest.raises(command_prefix.BuildFailed, match="failed on"):
        command_prefix.build(tmp_path / "x", cc="/bin/false")
    assert list(tmp_path.iterdir()) == []  # no half-built file left


def test_probe_passes_here() -> None:
    probe.check_confinement()
    probe.check_confinement()  # cached


def test_exported_names_exist() -> None:
    for module in (
        bwrap,
        call_results,
        call_spawn,
        cgroup,
        command_prefix,
        folders,
        launcher_children,
        launcher_client,
        launcher_placement,
        launcher_pool,
        launcher_protocol,
        limits,
        outbox,
        process,
        probe,
        reachable,
        runner,
        seccomp,
        slot_launcher,
        system_stage,
        workspace_module,
    ):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [("node", "-e", "console.log('started')"), ("java", "-Xshare:auto", "-version")],
    ids=["node", "java"],
)
def test_runtimes_start_under_the_memory_limit(sandbox: Sandbox, command: tuple[str, ...]) -> None:
    # RLIMIT_DATA, unlike RLIMIT_AS, leaves room for the large PROT_NONE
    # reservations of V8 and the JVM.
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed here")
    result = sandbox.call(command=command, memory_mb=512, timeout=20)
    assert result.outcome == "ok", result.output


def test_ulimit_script_units_match_prlimit() -> None:
    limit = limits.Limits(
        file_size_bytes=3 * limits.MIB, data_bytes=256 * limits.MIB, processes=7, cpu_seconds=2
    )
    text = limit.ulimit_script()
    # dash: -f and -c in 512-byte blocks, -d and -l in KiB; no -H/-S sets both.
    for step in ("ulimit -n 4096", "ulimit -f 6144", "ulimit -d 262144", "ulimit -c 0"):
        assert step in text
    assert "ulimit -l 64" in text and "ulimit -p 7" in text
    assert "ulimit -S -t 2 && ulimit -H -t 3" in text  # soft first: hard may not be below it
    assert text.endswith("|| exit 125")
    # The launcher's own limits never hold RLIMIT_CPU: it would count its own CPU time.
    assert resource.RLIMIT_CPU not in dict(limit.rlimits())


@pytest.mark.parametrize(
    ("timeout", "cpu_limit", "seconds"),
    [(30.0, 1.0, 30), (2.0, 0.25, 1), (0.1, 0.01, 1), (2.5, 2.0, 5), (10.0, 0.33, 4)],
)
def test_cpu_seconds_is_timeout_times_cpu_limit_rounded_up(
    timeout: float, cpu_limit: float, seconds: int
) -> None:
    assert limits.cpu_seconds(timeout, cpu_limit) == seconds


def cgroup_mode(environ: Mapping[str, str]) -> str:
    return cgroup.CgroupSettings.from_env(environ).mode


@pytest.mark.parametrize(
    ("read", "name", "default", "other", "wrong"),
    [
        (cgroup_mode, "CGROUPS", "per-call", "off", "sometimes"),
        (network_mode, "NETWORK", "slot", "per-call", "none"),
        (standby_mode, "STANDBY", "on", "off", "no"),
    ],
)
def test_a_choice_setting_defaults_strips_and_names_what_is_wrong(
    read: Callable[[Mapping[str, str]], str], name: str, default: str, other: str, wrong: str
) -> None:
    env = f"VESSEL_SANDBOX_{name}"
    assert read({}) == read({env: ""}) == default
    assert read({env: f" {other} "}) == other
    with pytest.raises(ValueError, match=rf"^{env}='{wrong}': expected one of {default}, "):
        read({env: wrong})


def test_staged_etc_holds_only_the_allow_list_and_the_hosts_certificates(tmp_path: Path) -> None:
    stage = bwrap.stage_system(tmp_path / "stage", prefix=None)
    assert os.listdir(stage) == ["etc"]  # the Perl prefix: nothing to copy
    etc = stage / "etc"
    names = set(os.listdir(etc))
    assert {"passwd", "group", "hosts", "hostname"} <= names
    assert not names & {"shadow", "gshadow", "sudoers", "machine-id", "ssh", "pip.conf"}
    assert (etc / "passwd").read_text().startswith("root:x:0:0:root:/tmp/vessel:")
    host_certs = Path("/etc/ssl/certs")
    if host_certs.is_dir():
        assert sorted(os.listdir(etc / "ssl")) <= ["certs", "openssl.cnf"]
        assert sorted(os.listdir(etc / "ssl" / "certs")) == sorted(os.listdir(host_certs))
        for name in os.listdir(host_certs):  # links stay links (into /usr/share, bound)
            host, staged = host_certs / name, etc / "ssl" / "certs" / name
            assert staged.is_symlink() == host.is_symlink(), name
            if host.is_symlink():
                assert os.readlink(staged) == os.readlink(host)
    again = bwrap.stage_system(tmp_path / "stage", prefix=None)  # rebuilt in place
    assert set(os.listdir(again / "etc")) == names


def test_the_stage_holds_a_copy_of_the_static_prefix(tmp_path: Path) -> None:
    built = command_prefix.build(tmp_path / "bin" / "landlock-exec")
    stage = bwrap.stage_system(tmp_path / "stage", prefix=built)
    copied = stage / "landlock-exec"
    assert copied.read_bytes() == built.read_bytes()
    assert stat.S_IMODE(copied.stat().st_mode) == 0o755
    assert f"/{copied.relative_to(stage)}" == command_prefix.STATIC_MOUNT[len(bwrap.STAGE_MOUNT) :]


def _fake_etc(folder: Path, bundle: str) -> Path:
    (folder / "ssl" / "certs").mkdir(parents=True)
    (folder / "ssl" / "certs" / "ca-certificates.crt").write_text(bundle)
    return folder


def _replace(path: Path, text: str) -> None:
    """As update-ca-certificates does: a new file renamed over the old one."""
    new = path.with_name(f".{path.name}.new")
    new.write_text(text)
    new.replace(path)


def test_new_certificates_reach_the_next_call_and_the_old_stage_goes_after_its_last(
    tmp_path: Path,
) -> None:
    etc = _fake_etc(tmp_path / "etc", "bundle one\n")
    stage = system_stage.SystemStage(WorkspaceStore(tmp_path / "ws"), prefix=None, etc=etc)
    bundle = Path("etc/ssl/certs/ca-certificates.crt")
    try:
        first = stage.take()
        assert stage.take() == first  # nothing changed: the same stage, two calls on it
        assert (first / bundle).read_text() == "bundle one\n"
        _replace(etc / "ssl" / "certs" / "ca-certificates.crt", "bundle two\n")
        second = stage.take()
        assert second != first and (second / bundle).read_text() == "bundle two\n"
        stage.give(first)
        assert (first / bundle).read_text() == "bundle one\n"  # a call still binds it
        stage.give(first)
        assert not first.exists()  # its last call ended
        stage.give(second)
        assert second.is_dir()  # the current one stays for later calls
        (etc / "ssl" / "certs" / "extra.pem").write_text("x")  # a link added: the folder changed
        third = stage.take()
        assert third != second and not second.exists()  # no call held the old one
        assert (third / "etc/ssl/certs/extra.pem").read_text() == "x"
        stage.give(third)
        shutil.rmtree(third)  # gone from under the worker: made again
        fourth = stage.take()
        assert fourth.is_dir()
        stage.give(fourth)
    finally:
        stage.remove()
    assert not (tmp_path / "ws" / ".system").exists()


def test_a_held_stage_outlives_its_call_and_a_superseded_one_goes_after_both(
    tmp_path: Path,
) -> None:
    """`hold`: a standby started after a call keeps the call's stage without a new check."""
    etc = _fake_etc(tmp_path / "etc", "bundle one\n")
    stage = system_stage.SystemStage(WorkspaceStore(tmp_path / "ws"), prefix=None, etc=etc)
    try:
        first = stage.take()
        assert stage.hold(first) == first
        _replace(etc / "ssl" / "certs" / "ca-certificates.crt", "bundle two\n")
        second = stage.take()
        assert second != first
        stage.give(first)  # the call ended: the standby still binds it
        assert first.is_dir()
        stage.give(first)  # the standby let go
        assert not first.exists()
        with pytest.raises(ValueError, match="not held"):
            stage.hold(first)
        stage.give(second)
        with pytest.raises(ValueError, match="not held"):
            stage.hold(second)  # current, but no call holds it
    finally:
        stage.remove()


def test_a_rebuilt_prefix_reaches_the_next_call(tmp_path: Path) -> None:
    built = command_prefix.build(tmp_path / "bin" / "landlock-exec")
    stage = system_stage.SystemStage(
        WorkspaceStore(tmp_path / "ws"), prefix=built, etc=_fake_etc(tmp_path / "etc", "b\n")
    )
    try:
        first = stage.folder()
        old = (first / "landlock-exec").stat().st_ino
        command_prefix.build(built)  # written beside it and renamed over it
        second = stage.folder()
        assert second != first and not first.exists()
        assert (second / "landlock-exec").read_bytes() == built.read_bytes()
        assert (second / "landlock-exec").stat().st_ino != old
    finally:
        stage.remove()


def test_a_forked_child_gets_a_stage_of_its_own(tmp_path: Path) -> None:
    stage = system_stage.SystemStage(
        WorkspaceStore(tmp_path / "ws"), prefix=None, etc=_fake_etc(tmp_path / "etc", "b\n")
    )
    try:
        parents = stage.take()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child reports through the pipe)
            try:
                child = stage.take()
                stage.give(parents)  # not the child's: left alone
                stage.remove()
                os.write(write, f"{child}\n{child.exists()}\n{parents.is_dir()}".encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as reader:
            child_stage, child_left, parents_kept = reader.read().splitlines()
        os.waitpid(pid, 0)
        assert child_stage != str(parents)
        assert (child_left, parents_kept) == ("False", "True")
        assert parents.is_dir()
        stage.give(parents)
    finally:
        stage.remove()


def test_a_call_cgroup_gets_its_cpu_quota() -> None:
    support = cgroup.CgroupSupport.detect()
    if "cpu" not in support.controllers:
        pytest.skip("no writable cpu cgroup hierarchy on this host")
    made = support.create(memory_bytes=64 * limits.MIB, cpu_limit=0.5)
    try:
        period = int(made.read("cpu", "cpu.cfs_period_us"))
        assert int(made.read("cpu", "cpu.cfs_quota_us")) == period // 2
        made.set_cpu_limit(0.001)  # below the kernel's 1 ms: held at 1 ms
        assert int(made.read("cpu", "cpu.cfs_quota_us")) == cgroup.MIN_CPU_QUOTA_US
        made.set_cpu_limit(3)
        assert int(made.read("cpu", "cpu.cfs_quota_us")) == 3 * period
    finally:
        made.remove()


def test_a_call_sees_the_hosts_certificates(sandbox: Sandbox) -> None:
    host = Path("/etc/ssl/certs")
    if not (host / "ca-certificates.crt").is_file():
        pytest.skip("no CA bundle on this host")
    result = sandbox.call(
        shell="cd /etc/ssl/certs; sha256sum ca-certificates.crt; ls -A | LC_ALL=C sort | sha256sum"
    )
    bundle, names = (line.split()[0] for line in result.output.splitlines())
    assert bundle == hashlib.sha256((host / "ca-certificates.crt").read_bytes()).hexdigest()
    listed = "".join(f"{name}\n" for name in sorted(os.listdir(host)))
    assert names == hashlib.sha256(listed.encode()).hexdigest()
