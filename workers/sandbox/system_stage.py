"""The stage of one worker process (`bwrap.stage_system`), kept current, and its clean-up.

One stage per worker process at a time, `.system/etc-<random>` under the
workspace root (a later one of the same process `etc-<random>.<n>`), marked as
that process's by an flock on `.system/etc-<random>.lock` held for its life: no
pid in a name a call can read in its mount table. A starting worker removes
the stages whose lock no one holds (their worker is gone); `SystemStage.remove`
removes its own.

A stage is a copy: of the host's CA certificates and of the static prefix. When
either changes on the host (a ca-certificates update, the prefix rebuilt), the
next call gets a new stage; the old one is removed once the last call that
bound it has ended (a call's mount holds the folder, not a copy of it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import time
from pathlib import Path

from workers.sandbox.bwrap import certificates_signature, file_signature, stage_system
from workers.sandbox.folders import remove_tree
from workers.sandbox.workspace import WorkspaceStore

__all__ = ["SystemStage"]

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


class SystemStage:
    """This process's stage: built when first asked for (the runner asks at its
    start, `SandboxRunner._stage_now`), built anew when the host's
    certificates or the prefix changed or it went missing (four stats a call);
    a forked child claims a stage of its own."""

    def __init__(
        self, workspaces: WorkspaceStore, *, prefix: Path | None, etc: Path = Path("/etc")
    ) -> None:
        self.workspaces = workspaces
        #: The static prefix's host file, copied into the stage (None: none to copy).
        self.prefix = prefix
        self.etc = etc
        self._owner: Path | None = None  # etc-<random>: this process's first stage
        self._folder: Path | None = None  # the stage calls get now
        self._generation = 0
        self._signature: tuple[tuple[int, int, int], ...] = ()
        #: Calls running on each stage of this process; a stage no call gets any
        #: more is removed when its count falls to zero.
        self._users: dict[Path, int] = {}
        #: The flock-ed lock of this process's stages (-1: none yet), and its owner.
        self._lock_fd = -1
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def take(self) -> Path:
        """The stage for a call about to start (made now if needed); `give` it back
        when the call's processes are gone."""
        prefix = (0, 0, 0) if self.prefix is None else file_signature(self.prefix)
        signature = (*certificates_signature(self.etc), prefix)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's stages are not its own
                self._owner = self._folder = None
                self._users = {}
                self._lock_fd = -1
                self._pid = os.getpid()
            folder = self._folder
            if folder is None or signature != self._signature or not folder.is_dir():
                folder = self._restage(signature)
            self._users[folder] = self._users.get(folder, 0) + 1
            return folder

    def hold(self, folder: Path) -> Path:
        """One more user of `folder`, a stage the caller holds (taken, not given back
        yet): no check of the certificates; `give` it back as a taken one. ValueError
        if it is not held."""
        with self._lock:
            if not self._users.get(folder):
                raise ValueError(f"the stage {folder} is not held")
            self._users[folder] += 1
            return folder

    def give(self, folder: Path) -> None:
        """A call on `folder` has ended."""
        with self._lock:
            if folder not in self._users:
                return  # not this process's (a forked child's parent's), or removed
            left = self._users[folder] - 1
            if left > 0 or folder == self._folder:
                self._users[folder] = left
                return
            del self._users[folder]
        remove_tree(folder)  # superseded, and no call binds it any more

    def folder(self) -> Path:
        """The stage calls get now (made if there is none), with no call held on it."""
        folder = self.take()
        self.give(folder)
        return folder

    def _restage(self, signature: tuple[tuple[int, int, int], ...]) -> Path:
        """Build the next stage (the lock held); the one it replaces goes when unused."""
        self.workspaces.ensure_root()
        system = self.workspaces.root / ".system"
        if self._owner is None or self._lock_fd < 0:
            self._owner, self._lock_fd = _claim_stage(system)
            self._generation = 0
        self._generation += 1
        name = self._owner.name + ("" if self._generation == 1 else f".{self._generation}")
        folder = stage_system(system / name, prefix=self.prefix, etc=self.etc)
        _remove_stale_stages(system, keep=self._owner)
        old, self._folder, self._signature = self._folder, folder, signature
        if old is not None and not self._users.get(old):
            self._users.pop(old, None)
            remove_tree(old)
        return folder

    def remove(self) -> None:
        """Remove this process's stages and its lock (a forked child leaves its parent's
        alone); idempotent. Calls on them have ended."""
        with self._lock:
            owner, self._owner, self._folder = self._owner, None, None
            self._users = {}
            lock, self._lock_fd = self._lock_fd, -1
        if lock < 0 or self._pid != os.getpid() or owner is None:
            return
        try:
            with contextlib.suppress(OSError):
                for entry in owner.parent.iterdir():
                    if _stage_owner(entry.name) == owner.name and entry.suffix != _LOCK_SUFFIX:
                        remove_tree(entry)
            with contextlib.suppress(OSError):
                (owner.parent / f"{owner.name}{_LOCK_SUFFIX}").unlink()
            with contextlib.suppress(OSError):
                owner.parent.rmdir()  # .system, if no other worker's stage is there
        finally:
            os.close(lock)
