"""The staged /etc of one worker process (`bwrap.stage_etc`), and its clean-up.

One folder per worker process, `.system/etc-<random>` under the workspace root,
marked as that process's by an flock on `.system/etc-<random>.lock` held for
its life: no pid in a name a call can read in its mount table. A starting
worker removes the stages whose lock no one holds (their worker is gone);
`EtcStage.remove` removes its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import time
from pathlib import Path

from workers.sandbox.bwrap import stage_etc
from workers.sandbox.folders import remove_tree
from workers.sandbox.workspace import WorkspaceStore

__all__ = ["EtcStage"]

#: Stage entries with no lock file (an older version's `etc-<pid>`, a crash
#: between two steps) are removed only once this old.
_STALE_STAGE_SECONDS = 3600.0
_STAGE_PREFIX = "etc-"
_LOCK_SUFFIX = ".lock"
_STAGE_RANDOM_BYTES = 8


def _claim_stage(system: Path) -> tuple[Path, int]:
    """A fresh stage path and the flock-ed descriptor that marks it as this process's.

    The lock file is locked under a temporary name and renamed into place, so
    no other worker ever sees it unlocked while its owner lives.
    """
    name = f"{_STAGE_PREFIX}{secrets.token_hex(_STAGE_RANDOM_BYTES)}"
    tmp = system / f".{name}{_LOCK_SUFFIX}.new"
    for attempt in range(3):
        system.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(system, 0o755)  # noqa: S103 (the sandbox uid must reach its stage; umask aside)
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600)
            break
        except FileNotFoundError:  # another worker's close() removed .system just now
            if attempt == 2:
                raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until close(), or the process's end
        os.rename(tmp, system / f"{name}{_LOCK_SUFFIX}")
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return system / name, fd


def _stage_owner(name: str) -> str:
    """`etc-X` for each entry of the stage `etc-X` (`etc-X.lock`, `.etc-X.<build>`)."""
    return name.lstrip(".").split(".", 1)[0]


def _remove_stale_stages(system: Path, *, keep: Path) -> None:
    """Remove the stages of workers that are gone: their lock is free (best effort)."""
    owners: dict[str, list[Path]] = {}
    with contextlib.suppress(OSError):
        for entry in system.iterdir():
            if entry.name.lstrip(".").startswith(_STAGE_PREFIX):
                owners.setdefault(_stage_owner(entry.name), []).append(entry)
    for owner, entries in owners.items():
        if owner == keep.name:
            continue
        lock = system / f"{owner}{_LOCK_SUFFIX}"
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            # No lock: an older version's `etc-<pid>` or a crash's leftover.
            for entry in entries:
                with contextlib.suppress(OSError):
                    if time.time() - entry.lstat().st_mtime >= _STALE_STAGE_SECONDS:
                        remove_tree(entry)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its worker is alive
            for entry in entries:
                if entry != lock:
                    remove_tree(entry)
            with contextlib.suppress(OSError):
                lock.unlink()
        finally:
            os.close(fd)


class EtcStage:
    """This process's staged /etc: built at its first call, rebuilt if it went missing
    (one stat per call); a forked child claims a stage of its own."""

    def __init__(self, workspaces: WorkspaceStore) -> None:
        self.workspaces = workspaces
        self._folder: Path | None = None
        #: The flock-ed lock of this process's stage (-1: none yet), and its owner.
        self._lock_fd = -1
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def folder(self) -> Path:
        """The stage, made now if there is none (stages of dead workers are removed then)."""
        with self._lock:
            folder = self._folder
            if folder is None or not folder.is_dir():
                self.workspaces.ensure_root()
                system = self.workspaces.root / ".system"
                if folder is None or self._lock_fd < 0 or self._pid != os.getpid():
                    folder, self._lock_fd = _claim_stage(system)
                    self._pid = os.getpid()
                folder = stage_etc(folder)
                _remove_stale_stages(system, keep=folder)
                self._folder = folder
            return folder

    def remove(self) -> None:
        """Remove this process's stage and its lock (a forked child leaves its parent's
        alone); idempotent."""
        with self._lock:
            folder, self._folder = self._folder, None
            lock, self._lock_fd = self._lock_fd, -1
        if lock < 0 or self._pid != os.getpid():
            return
        try:
            if folder is not None:
                remove_tree(folder)
                with contextlib.suppress(OSError):
                    (folder.parent / f"{folder.name}{_LOCK_SUFFIX}").unlink()
                with contextlib.suppress(OSError):
                    folder.parent.rmdir()  # .system, if no other worker's stage is there
        finally:
            os.close(lock)
