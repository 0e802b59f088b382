"""What a folder looks like to the calls that use it: everything but its times.

The workspace janitor hands a used one-call workspace or outbox to a later
call only if it looks as a folder just made in the same parent does
(`WorkspaceStore.looks_fresh`). A tool owns its folders, so it may have changed
more than their contents: their mode (chmod), their ACLs and other extended
attributes (setfacl, setfattr), their inode flags (chattr: `S` makes every
later write synchronous, and on ext4 an empty folder may take `F` casefolding
or an encryption policy, `E`), or grown them (a folder that held many names
keeps its size). `FolderState` holds all of those, so two states compare
equal only if no later call could tell the folders apart but by their times
and inode numbers.

The inode flags are read with the `FS_IOC_GETFLAGS` and `FS_IOC_FSGETXATTR`
ioctls, whose numbers are known here for x86_64 and aarch64 only; elsewhere a
state is not `comparable` and nothing is kept for reuse.
"""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import struct
from dataclasses import dataclass

from workers.sandbox.folders import DIR_FLAGS

__all__ = ["FolderState", "folder_state"]

#: _IOR('f', 1, long) and _IOR('X', 31, struct fsxattr): the generic ioctl
#: encoding, which x86_64 and aarch64 use (other architectures differ).
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_FSGETXATTR = 0x801C581F
_FSXATTR = struct.Struct("=IIIII8x")  # xflags, extsize, nextents, projid, cowextsize
#: Whether those numbers hold on this machine (read once: it never changes).
_COMPARABLE = platform.machine() in frozenset({"x86_64", "aarch64"})
#: What a file system without inode flags answers: nothing a tool could set either.
_NOT_SUPPORTED = frozenset({errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})


@dataclass(frozen=True, slots=True)
class FolderState:
    mode: int
    uid: int
    gid: int
    size: int
    links: int
    #: The names in it, sorted.
    names: tuple[str, ...]
    #: (name, value) of every extended attribute, sorted; ACLs are among them.
    xattrs: tuple[tuple[str, bytes], ...]
    #: FS_IOC_GETFLAGS, or None where the file system has no inode flags.
    flags: int | None
    #: FS_IOC_FSGETXATTR's xflags and project id, or None likewise.
    fsx: tuple[int, int] | None
    #: False where the flags cannot be read reliably (an unknown architecture).
    comparable: bool


def _ioctl(fd: int, request: int, size: int) -> bytes | None:
    try:
        return fcntl.ioctl(fd, request, bytes(size))
    except OSError as exc:
        if exc.errno in _NOT_SUPPORTED:
            return None
        raise


def _xattrs(fd: int) -> tuple[tuple[str, bytes], ...]:
    try:
        names = os.listxattr(fd)
    except OSError as exc:
        if exc.errno in _NOT_SUPPORTED:
            return ()
        raise
    return tuple(sorted((name, os.getxattr(fd, name)) for name in names))


def folder_state(path: os.PathLike[str] | str) -> FolderState:
    """The state of the folder `path` (never through a symlink: OSError if it is one,
    or not a folder)."""
    fd = os.open(path, DIR_FLAGS)
    try:
        st = os.fstat(fd)
        flags = fsx = None
        if _COMPARABLE:
            raw_flags = _ioctl(fd, _FS_IOC_GETFLAGS, 8)
            flags = None if raw_flags is None else struct.unpack("=q", raw_flags)[0]
            raw_fsx = _ioctl(fd, _FS_IOC_FSGETXATTR, _FSXATTR.size)
            if raw_fsx is not None:
                xflags, _extsize, _extents, projid, _cow = _FSXATTR.unpack(raw_fsx)
                fsx = (xflags, projid)
        return FolderState(
            mode=st.st_mode,  # type and permission bits
            uid=st.st_uid,
            gid=st.st_gid,
            size=st.st_size,
            links=st.st_nlink,
            names=tuple(sorted(os.listdir(fd))),
            xattrs=_xattrs(fd),
            flags=flags,
            fsx=fsx,
            comparable=_COMPARABLE,
        )
    finally:
        os.close(fd)
