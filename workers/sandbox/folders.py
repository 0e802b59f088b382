"""Folder operations that never follow a link: owning, sharing and removing a tree.

A tool may leave (or swap in, while the worker works) symlinks in its
workspace; everything here goes through descriptors opened with O_NOFOLLOW
(openat for a tree), so a link is changed or removed itself, never its target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

__all__ = ["DIR_FLAGS", "remove_tree", "set_owner", "share_with_workspace_owner"]

#: How every folder a tool could have touched is opened: a link is refused, not followed.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def set_owner(path: Path, *, uid: int, gid: int, mode: int) -> None:
    """chown and chmod the folder `path` itself: opened with O_NOFOLLOW, so never
    through a symlink (OSError, ELOOP or ENOTDIR, if `path` is one)."""
    fd = os.open(path, DIR_FLAGS)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def share_with_workspace_owner(fd: int, dir_fd: int) -> None:
    """Give `fd` (a file or folder a worker just made in a workspace) to the owner
    of `dir_fd`, the folder it was made in.

    A root worker's calls run as the sandbox uid, which owns the workspace: a
    file the worker writes there for a call (`files put`, a plugin's
    host.workspace.write) must be that uid's too, or the tool cannot read it.
    A worker that is not root makes files as the workspace's owner already.
    """
    if os.geteuid() != 0:
        return
    owner = os.fstat(dir_fd)
    if owner.st_uid != 0:
        os.fchown(fd, owner.st_uid, owner.st_gid)


def _open_dir(name: str, parent_fd: int) -> int:
    """Open the folder `name` of `parent_fd` without following a link; if a tool
    made it unreadable (chmod 000), make it 0700 first (through an O_PATH
    descriptor of the folder itself, never of a link's target)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        pass
    path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        if stat.S_ISDIR(os.fstat(path_fd).st_mode):
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
    finally:
        os.close(path_fd)
    return os.open(name, DIR_FLAGS, dir_fd=parent_fd)


def _empty(fd: int) -> None:
    """Remove everything in the open folder `fd`; a link is removed, never followed."""
    with os.scandir(fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        with contextlib.suppress(FileNotFoundError):
            if is_dir:
                _remove_dir(name, fd)
            else:
                os.unlink(name, dir_fd=fd)


def _remove_dir(name: str, parent_fd: int) -> None:
    try:
        fd = _open_dir(name, parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=parent_fd)  # no longer a folder: a link or a file
        return
    try:
        try:
            _empty(fd)
        except PermissionError:
            # A tool made it read-only (chmod 500): fchmod the folder we hold open.
            os.fchmod(fd, 0o700)
            _empty(fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def remove_tree(path: Path) -> None:
    """Remove a workspace whatever a tool left in it (read-only dirs included), best effort.

    Walked through descriptors (openat with O_NOFOLLOW): a symlink a tool left,
    or swapped in while this runs, is removed itself; its target is never
    entered, chmod-ed or removed.
    """
    try:
        parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return  # no parent: nothing to remove
    try:
        with contextlib.suppress(FileNotFoundError):
            _remove_dir(path.name, parent_fd)
    except OSError:
        pass  # left for `sweep` (e.g. a folder a tool made immutable)
    finally:
        os.close(parent_fd)
