"""The turn's workspace, measured while a call runs: its size and its number of files.

A call may write only its turn's workspace (and its outbox, bound inside it),
but nothing else bounds their sum: RLIMIT_FSIZE caps one file (disk_limit_mb),
and a tool may write as many as it likes. A size-limited filesystem per turn
needs root (a loop device or a tmpfs per turn) and a quota needs a filesystem
that has them; neither exists for a non-root worker in a container. So a
watchdog, that works on every host kind: the call's poll loop
(`process.run_child`) asks `WorkspaceWatch.poll` at each turn (at least every
50 ms); at most every `MIN_INTERVAL_SECONDS` it walks the workspace and the
outbox (`measure`) and says when either passes `workspace_limit_mb` or
`workspace_files`; the runner then kills the call's tree. The runner also
checks once before the call starts: a workspace already over a limit (a call
before this one ended between two checks) refuses the call.

The walk (`measure`):

- never follows a link: each folder is opened with O_NOFOLLOW|O_DIRECTORY and
  must be the folder its parent listed (same device and inode), so a tool that
  swaps a folder for a link mid-walk only makes the walk skip it;
- counts every entry (files, folders, links, fifos) and adds st_blocks x 512 of
  each (blocks on disk: a sparse file counts what it holds, a folder its own
  blocks); a file with several hard links counts once;
- is bounded: it stops as soon as a limit is passed (at most workspace_files + 1
  entries), and a folder it cannot open (nested past PATH_MAX, or unreadable
  and not fixable) stops the call as "cannot be measured";
- as a non-root worker (whose tools' files are its own), gives a folder the tool
  made unreadable (chmod 000) its owner's rwx back, by fd (never through a link),
  rather than leave its contents unseen. A root worker reads every folder as is.

Cost, measured here (2 cores, shared): an empty workspace takes 8 us per walk; a
walk costs about 4.3 us per entry (0.43 s for 100,000 files). The next check
comes `COST_FACTOR` times the last walk's cost later (at least
`MIN_INTERVAL_SECONDS`, at most `MAX_INTERVAL_SECONDS`), so the watchdog spends
under 5% of a core on a workspace up to ~45,000 entries and under 18% at
100,000. What a fast writer can pass the limit by is its write speed times the
interval plus one walk (see docs/limits.md: dd wrote 430-560 MB/s here).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workers.sandbox.folders import DIR_FLAGS

__all__ = [
    "COST_FACTOR",
    "MAX_INTERVAL_SECONDS",
    "MIN_INTERVAL_SECONDS",
    "Breach",
    "Usage",
    "WorkspaceWatch",
    "measure",
]

#: Shortest time between two walks: 0.05 s, every tick of the poll loop. A walk
#: of an empty or small workspace costs tens of microseconds (under 0.2% of a core
#: at this rate), and the interval is what a fast writer can overshoot by.
MIN_INTERVAL_SECONDS = 0.05
#: Longest time between two walks, whatever they cost (a workspace of 100,000
#: files takes ~0.4 s to walk here): a writer cannot hide behind a big workspace.
MAX_INTERVAL_SECONDS = 2.0
#: The next walk comes this many times the last walk's cost later: the watchdog
#: spends at most 1/(1 + 20), under 5%, of a core (until MAX_INTERVAL_SECONDS).
COST_FACTOR = 20.0

#: Which limit was passed: size, file count, or the walk could not finish.
Breach = Literal["size", "files", "unmeasurable"]

_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: What the walk skips silently: the entry went away or was replaced meanwhile.
_GONE = (FileNotFoundError, NotADirectoryError)
_OWNER_RWX = stat.S_IRWXU


@dataclass(frozen=True, slots=True)
class Usage:
    """What one walk found (up to where it stopped)."""

    bytes: int
    files: int
    #: The limit passed (the walk stopped there), or None.
    breach: Breach | None = None
    #: Why the walk could not finish, for "unmeasurable".
    problem: str | None = None


def _same(fd: int, expected: tuple[int, int] | None) -> bool:
    if expected is None:
        return True
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == expected


def _open_dir(path: str, expected: tuple[int, int] | None, fix: bool) -> int | None:
    """The folder at `path`, opened without following a link; None if it is no longer
    the folder its parent listed. Raises OSError if it cannot be opened."""
    try:
        fd = os.open(path, DIR_FLAGS)
    except PermissionError:
        if not fix:
            raise
        # The tool took its own folder's permissions away: give the owner's back,
        # through an O_PATH fd of the very folder (chmod via /proc never follows
        # the tool's links: the fd is the folder itself).
        pfd = os.open(path, _PATH_FLAGS)
        try:
            if not _same(pfd, expected):
                return None
            mode = stat.S_IMODE(os.fstat(pfd).st_mode)
            os.chmod(f"/proc/self/fd/{pfd}", mode | _OWNER_RWX)
        finally:
            os.close(pfd)
        fd = os.open(path, DIR_FLAGS)
    try:
        st = os.fstat(fd)
        if expected is not None and (st.st_dev, st.st_ino) != expected:
            os.close(fd)
            return None
        if fix and st.st_mode & _OWNER_RWX != _OWNER_RWX:
            # Readable but not searchable (e.g. 0400): its entries could not be stat-ed.
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | _OWNER_RWX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def measure(roots: Sequence[Path], *, max_bytes: int, max_files: int) -> Usage:
    """Size (st_blocks x 512) and entries under `roots`, stopping once past a limit."""
    fix = os.geteuid() != 0
    total = files = 0
    linked: set[tuple[int, int]] = set()
    pending: list[tuple[str, tuple[int, int] | None]] = [(str(r), None) for r in roots]
    while pending:
        path, expected = pending.pop()
        try:
            fd = _open_dir(path, expected, fix)
        except _GONE:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP and expected is not None:  # now a link: skip it
                continue
            why = exc.strerror or type(exc).__name__
            return Usage(total, files, breach="unmeasurable", problem=why)
        if fd is None:
            continue
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    files += 1
                    if files > max_files:
                        return Usage(total, files, breach="files")
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except _GONE:
                        continue
                    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                        key = (st.st_dev, st.st_ino)
                        if key in linked:
                            continue
                        linked.add(key)
                    total += st.st_blocks * 512
                    if total > max_bytes:
                        return Usage(total, files, breach="size")
                    if stat.S_ISDIR(st.st_mode):
                        pending.append((f"{path}/{entry.name}", (st.st_dev, st.st_ino)))
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            return Usage(total, files, breach="unmeasurable", problem=why)
        finally:
            os.close(fd)
    return Usage(total, files)


class WorkspaceWatch:
    """The limits of one call's workspace, checked at most every so often (`poll`)."""

    def __init__(self, roots: Sequence[Path], *, max_bytes: int, max_files: int) -> None:
        self.roots = tuple(roots)
        self.max_bytes = max_bytes
        self.max_files = max_files
        #: The last walk's finding once a limit is passed (None while within them).
        self.usage: Usage | None = None
        #: Walks made and the seconds they took, for measurements.
        self.walks = 0
        self.walk_seconds = 0.0
        self._next = 0.0

    def check(self) -> bool:
        """Walk now; True if a limit is passed (then `usage` says which)."""
        started = time.monotonic()
        usage = measure(self.roots, max_bytes=self.max_bytes, max_files=self.max_files)
        ended = time.monotonic()
        cost = ended - started
        self.walks += 1
        self.walk_seconds += cost
        interval = min(MAX_INTERVAL_SECONDS, max(MIN_INTERVAL_SECONDS, COST_FACTOR * cost))
        self._next = ended + interval
        if usage.breach is not None:
            self.usage = usage
            return True
        return False

    def poll(self) -> bool:
        """`check` if the next walk is due, else False: for the call's poll loop."""
        if time.monotonic() < self._next:
            return False
        return self.check()
