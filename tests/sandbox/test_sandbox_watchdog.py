"""The workspace watchdog's walk (`workers.sandbox.watchdog.measure`) on real folders:
what it counts, what it never follows, and that it stops at a limit."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from workers.sandbox import watchdog
from workers.sandbox.watchdog import WorkspaceWatch, measure

BIG = 1 << 40


def _usage(*roots: Path, max_bytes: int = BIG, max_files: int = BIG) -> watchdog.Usage:
    return measure(roots, max_bytes=max_bytes, max_files=max_files)


def test_an_empty_workspace_is_nothing(tmp_path: Path) -> None:
    assert _usage(tmp_path) == watchdog.Usage(0, 0)


def test_every_entry_counts_and_blocks_on_disk_are_the_size(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "data").write_bytes(b"x" * 100_000)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)  # 1 GiB long, nothing on disk
    os.mkfifo(tmp_path / "fifo")
    usage = _usage(tmp_path)
    assert usage.files == 5 and usage.breach is None
    blocks = sum(
        os.lstat(p).st_blocks * 512
        for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "data")
    )
    assert usage.bytes == blocks + os.lstat(tmp_path / "sparse").st_blocks * 512
    assert usage.bytes < 1 << 20


def test_links_are_counted_never_followed(tmp_path: Path) -> None:
    os.symlink("/usr", tmp_path / "usr")
    os.symlink("/", tmp_path / "root")
    (tmp_path / "file").write_bytes(b"x" * 65536)
    for n in range(5):
        os.link(tmp_path / "file", tmp_path / f"hard{n}")
    usage = _usage(tmp_path)
    assert usage.files == 8
    assert usage.bytes == os.lstat(tmp_path / "file").st_blocks * 512  # hard links once


def test_the_walk_stops_as_soon_as_a_limit_is_passed(tmp_path: Path) -> None:
    for n in range(300):
        (tmp_path / str(n)).touch()
    assert _usage(tmp_path, max_files=100) == watchdog.Usage(0, 101, breach="files")
    (tmp_path / "big").write_bytes(b"x" * (1 << 20))
    usage = _usage(tmp_path, max_bytes=1000)
    assert usage.breach == "size" and usage.bytes > 1000


def test_the_outbox_counts_with_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "out").write_bytes(b"x" * 8192)
    (tmp_path / "ws" / "in").write_bytes(b"x" * 8192)
    assert _usage(tmp_path / "ws", tmp_path / "box").files == 2


def test_nesting_past_path_max_cannot_be_hidden(tmp_path: Path) -> None:
    # Past PATH_MAX a folder cannot be opened by path: the call is stopped, not let be.
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(900):
            os.mkdir("abcdefg", dir_fd=fd)
            new = os.open("abcdefg", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = new
    finally:
        os.close(fd)
    usage = _usage(tmp_path)
    assert usage.breach == "unmeasurable" and usage.problem, usage
    subprocess.run(["rm", "-rf", str(tmp_path / "abcdefg")], check=True)


def test_a_missing_workspace_is_nothing(tmp_path: Path) -> None:
    assert _usage(tmp_path / "gone") == watchdog.Usage(0, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_a_non_root_worker_sees_into_a_folder_the_tool_locked(
    request: pytest.FixtureRequest,
) -> None:
    # As the folder's owner (a non-root worker's tools write as its uid), chmod 000
    # and 0400 hide nothing: the walk gives the owner's rwx back, by fd.
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for another user")
    # pytest's tmp_path is under a root-only folder: another user needs its own.
    root = Path(tempfile.mkdtemp(prefix="vessel-watchdog-"))
    os.chown(root, 65534, 65534)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(Path(watchdog.__file__).parents[2])!r})
        from workers.sandbox import watchdog as module
        root = {str(root)!r}
        for name, mode in (("locked", 0), ("listable", 0o400)):
            os.mkdir(f"{{root}}/{{name}}")
            for n in range(50):
                open(f"{{root}}/{{name}}/{{n}}", "w").close()
            os.chmod(f"{{root}}/{{name}}", mode)
        usage = module.measure([root], max_bytes=1 << 40, max_files=1 << 40)
        print(usage.files, usage.breach, oct(os.stat(f"{{root}}/locked").st_mode & 0o777))
        """
    )
    done = subprocess.run(
        [python, "-I", "-c", script], user=65534, group=65534, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["102", "None", "0o700"]


def test_poll_walks_at_most_every_min_interval(tmp_path: Path) -> None:
    watch = WorkspaceWatch((tmp_path,), max_bytes=BIG, max_files=BIG)
    assert watch.check() is False and watch.walks == 1
    assert watch.poll() is False and watch.walks == 1  # not due yet
    time.sleep(watchdog.MIN_INTERVAL_SECONDS + 0.01)
    assert watch.poll() is False and watch.walks == 2
    for n in range(3):
        (tmp_path / str(n)).touch()
    small = WorkspaceWatch((tmp_path,), max_bytes=BIG, max_files=2)
    assert small.poll() is True and small.usage is not None and small.usage.breach == "files"
