"""A slot launcher's hole: where a standby's workspace is mounted at its call.

Standard library only: `slot_launcher.py` (the launcher process) imports it.

A standby sandbox (`standby.py`) is started before its call, so it cannot bind the
workspace of a turn whose next call it does not know yet. Instead it binds an empty
folder, the hole, and at the call the launcher mounts the turn's workspace (and
the call's own outbox over its `outbox/`) onto the hole; the mount propagates into
the waiting sandbox, where it covers the workspace's place. bwrap makes every
mount of the sandbox's namespace a slave of the launcher's (`MS_SLAVE | MS_REC` on
`/`), so it receives the mount, and cannot undo it: a mount that came from a more
privileged namespace is locked there. What the tool sees is what a bind at its
start would have shown: the same folder at the same place, `nosuid,nodev`.

How: after its user and network namespaces (`launcher_network.py`), the launcher
makes a mount namespace of its own, so its mounts are seen by no one but its
children. On the empty folder the worker made for it (`Holes.make`), it mounts a
small tmpfs, `MS_SHARED` (a bind of a shared mount is a slave of it), with the
hole `h` in it. `mount_at_hole` clones each folder with `open_tree`, sets its
flags with `mount_setattr` (a propagated copy keeps the flags its source had when
it arrived: set before the move, never after), and `move_mount`s it into place.
`clear` detaches what was mounted once the call's processes are gone, before the
next sandbox binds the hole. On a host without these system calls (Linux before
5.12) there is no hole, and a turn's standbys bind the turn's workspace as before.
"""

from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["HOLE_NAME", "Holes"]

#: The hole's name in the launcher's tmpfs.
HOLE_NAME = "h"
#: The system calls' numbers, the same on every architecture (added after 5.0).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = 0o2000000
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_SYMLINK_NOFOLLOW = 0x100
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_CLONE_NEWNS = 0x00020000
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_SHARED = 1 << 20
_MNT_DETACH = 0x2


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class Holes:
    """The launcher's tmpfs and its hole (see the module's text)."""

    def __init__(self, folder: str) -> None:
        #: The folder a standby binds at its workspace's place.
        self.hole = os.path.join(folder, HOLE_NAME)
        #: A workspace is mounted at the hole now (`clear` detaches it).
        self.mounted = False
        self._libc = _libc()

    @classmethod
    def make(cls, folder: str) -> Holes:
        """In a new mount namespace: the tmpfs on `folder` (empty, made by the
        worker) with the hole in it. OSError if the host refuses any of it, or has no
        `open_tree` (then the launcher's mount namespace is left as it is: harmless)."""
        holes = cls(folder)
        libc = holes._libc
        # Asked first, with nothing to clone: ENOSYS on a kernel without the call.
        if libc.syscall(_SYS_OPEN_TREE, -1, b"", 0) < 0 and ctypes.get_errno() == errno.ENOSYS:
            raise OSError(errno.ENOSYS, "open_tree: this kernel has no new mount API")
        _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        options = b"size=64k,mode=0700"
        _check(
            libc.mount(b"vessel-hole", folder.encode(), b"tmpfs", flags, options),
            f"mount tmpfs on {folder}",
        )
        _check(libc.mount(None, folder.encode(), None, _MS_SHARED, None), "mount --make-shared")
        os.mkdir(holes.hole, 0o700)
        return holes

    def mount_at_hole(self, workspace: str, outbox: str | None) -> None:
        """`workspace` at the hole, then `outbox` (if any) over its `outbox/`; OSError
        (with nothing left mounted) if either cannot be.

        The workspace's `outbox/` is found without following a link: a tool of the
        turn, in a call running elsewhere now, may have made it one, and a mount
        through it would land anywhere in this namespace, which every later sandbox
        of this launcher is made from."""
        self.clear()
        try:
            self._move(workspace, os.open(self.hole, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            self.mounted = True
            if outbox is not None:
                top = os.open(self.hole, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                try:  # the workspace's root now; its outbox/ must be a folder, not a link
                    target = os.open(
                        "outbox",
                        os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                        dir_fd=top,
                    )
                finally:
                    os.close(top)
                self._move(outbox, target)
        except OSError:
            self.clear()
            raise

    def clear(self) -> None:
        """Detach what is mounted at the hole (the call's processes are gone)."""
        if not self.mounted:
            return
        # Lazily: the workspace and the outbox on it go in one call.
        _check(self._libc.umount2(self.hole.encode(), _MNT_DETACH), f"umount {self.hole}")
        self.mounted = False

    def _move(self, source: str, target: int) -> None:
        """Mount a clone of `source` on the folder open as `target` (an O_PATH fd, closed)."""
        try:
            self._move_to_fd(source, target)
        finally:
            os.close(target)

    def _move_to_fd(self, source: str, target: int) -> None:
        libc = self._libc
        fd = _check(
            libc.syscall(
                _SYS_OPEN_TREE,
                _AT_FDCWD,
                source.encode(),
                _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_SYMLINK_NOFOLLOW,
            ),
            f"open_tree {source}",
        )
        try:
            attr = _MountAttr(attr_set=_MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
            _check(
                libc.syscall(
                    _SYS_MOUNT_SETATTR,
                    fd,
                    b"",
                    _AT_EMPTY_PATH,
                    ctypes.byref(attr),
                    ctypes.c_size_t(ctypes.sizeof(attr)),
                ),
                f"mount_setattr {source}",
            )
            _check(
                libc.syscall(
                    _SYS_MOVE_MOUNT,
                    fd,
                    b"",
                    target,
                    b"",
                    _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH,
                ),
                f"move_mount {source}",
            )
        finally:
            os.close(fd)
