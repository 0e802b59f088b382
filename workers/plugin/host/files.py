"""File operations on one turn's workspace folder, never through a symbolic link.

The one place `host.workspace` touches files, kept small so that it can be
pointed at routed workspace operations (the turn's home host) without touching
the namespace's rules: `LocalFiles` works on this host's `WorkspaceStore`, and
anything with the same four methods can replace it.

Every path arrives already checked by `workers.plugin.host.workspace` (relative,
no `..`, no empty or `.` parts). Each part is opened relative to its parent's
directory fd with O_NOFOLLOW (as `workers.sandbox.outbox` reads outboxes), so a
link a declared tool of the same turn left anywhere on the path is refused,
never followed; files are opened O_NONBLOCK (a fifo cannot hang the worker)
and fstat-checked to be regular. Writes go to a fresh temporary name and are
renamed into place, so a reader never sees half a file, and a link at the final
name is replaced, not followed.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workers.sandbox.workspace import WorkspaceStore, share_with_workspace_owner

__all__ = [
    "MAX_LIST_ENTRIES",
    "Entry",
    "LocalFiles",
    "NotAFile",
    "NotEmpty",
    "NotFound",
    "SymlinkInPath",
    "TooLarge",
]

#: Entries one `list` returns; the rest are not read (a million files cannot stall the worker).
MAX_LIST_ENTRIES = 1_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TMP_PREFIX = ".vessel-write-"


class SymlinkInPath(Exception):
    """A part of the path is a symbolic link; `.part` is the path up to it."""

    def __init__(self, part: str) -> None:
        super().__init__(part)
        self.part = part


class NotFound(Exception):
    """Nothing at the path (or a folder on the way is missing)."""


class NotAFile(Exception):
    """The path is a folder, a fifo, a device...; `.what` says which."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class NotEmpty(Exception):
    """`delete` of a folder that holds something."""


class TooLarge(Exception):
    """The file is larger than the caller's limit."""


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    type: Literal["file", "directory", "symlink", "other"]
    size: int


def _kind(mode: int) -> Literal["file", "directory", "symlink", "other"]:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _open_dir(parent: int, name: str, shown: str, *, create: bool) -> int:
    """The fd of folder `name` in `parent`, never following a link (made if `create`)."""
    made = False
    if create:
        with suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
            made = True
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        if made:
            share_with_workspace_owner(fd, parent)
        return fd
    except FileNotFoundError:
        raise NotFound(shown) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            except OSError:
                raise NotFound(shown) from None
            if stat.S_ISLNK(mode):
                raise SymlinkInPath(shown) from None
            raise NotAFile(f"{shown} is not a folder") from None
        raise


@contextmanager
def _walk_to(root: Path, parts: Sequence[str], *, create: bool) -> Iterator[int]:
    """The fd of the folder holding `parts[-1]` (the root itself for no parts)."""
    fds = [os.open(root, _DIR_FLAGS)]
    try:
        for i, name in enumerate(parts[:-1]):
            fds.append(_open_dir(fds[-1], name, "/".join(parts[: i + 1]), create=create))
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


class LocalFiles:
    """`host.workspace`'s files on this host's `WorkspaceStore` (`for_turn(agent, turn)`)."""

    def __init__(self, store: WorkspaceStore) -> None:
        self.store = store

    def _root(self, agent: str, turn: str) -> Path:
        return self.store.for_turn(agent, turn)

    def read(self, agent: str, turn: str, parts: Sequence[str], limit: int) -> bytes:
        shown = "/".join(parts)
        with _walk_to(self._root(agent, turn), parts, create=False) as parent:
            try:
                fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                raise NotFound(shown) from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise SymlinkInPath(shown) from None
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise NotAFile(f"{shown} is a {_kind(st.st_mode)}, not a file")
                if st.st_size > limit:
                    raise TooLarge(shown)
                chunks: list[bytes] = []
                total = 0
                while True:
                    chunk = os.read(fd, min(1 << 20, limit + 1 - total))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > limit:  # it grew while being read
                        raise TooLarge(shown)
                return b"".join(chunks)
            finally:
                os.close(fd)

    def write(self, agent: str, turn: str, parts: Sequence[str], data: bytes) -> None:
        shown = "/".join(parts)
        root = self._root(agent, turn)
        with _walk_to(root, parts, create=True) as parent:
            tmp = f"{_TMP_PREFIX}{secrets.token_hex(8)}"
            fd = os.open(tmp, _WRITE_FLAGS, 0o600, dir_fd=parent)
            try:
                share_with_workspace_owner(fd, parent)
                with os.fdopen(fd, "wb", closefd=True) as out:
                    out.write(data)
                try:
                    os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
                except IsADirectoryError:
                    raise NotAFile(f"{shown} is a folder") from None
            except BaseException:
                with suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=parent)
                raise
        self.store.touch(root)

    def entries(self, agent: str, turn: str, parts: Sequence[str]) -> tuple[list[Entry], bool]:
        """The folder's entries by name, and whether more than `MAX_LIST_ENTRIES` were left out."""
        root = self._root(agent, turn)
        # The walk stops at the folder holding the last part: "." makes that the folder itself.
        with _walk_to(root, [*parts, "."], create=False) as folder:
            names = sorted(os.listdir(folder))
            entries: list[Entry] = []
            for name in names[:MAX_LIST_ENTRIES]:
                if name.startswith(_TMP_PREFIX):
                    continue
                try:
                    st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                kind = _kind(st.st_mode)
                size = st.st_size if kind == "file" else 0
                entries.append(Entry(name=name, type=kind, size=size))
            return entries, len(names) > MAX_LIST_ENTRIES

    def delete(self, agent: str, turn: str, parts: Sequence[str]) -> None:
        shown = "/".join(parts)
        with _walk_to(self._root(agent, turn), parts, create=False) as parent:
            name = parts[-1]
            try:
                mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            except FileNotFoundError:
                raise NotFound(shown) from None
            try:
                if stat.S_ISDIR(mode):
                    os.rmdir(name, dir_fd=parent)
                else:
                    os.unlink(name, dir_fd=parent)  # a link itself goes, never its target
            except FileNotFoundError:
                raise NotFound(shown) from None
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY:
                    raise NotEmpty(shown) from None
                raise
