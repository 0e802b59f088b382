"""Whose host uid a confined command runs as: never 0.

A worker that is not root (the image's uid 10001) runs bwrap as itself: its
calls are that uid on the host, and nothing here changes. A root worker would
make bwrap's `--unshare-user` map the sandbox's uid 0 to host uid 0, and a tool
could then write host sysctls through /proc/sys and read root-only /proc files.
So a root worker starts bwrap only after dropping to an unprivileged host uid
that owns nothing, `VESSEL_SANDBOX_UID` / `VESSEL_SANDBOX_GID` (default
`DEFAULT_SANDBOX_UID`, a uid in the range Debian keeps unallocated, so no
package's user or file has it); 0 is refused. The slot launcher drops itself
(setgroups([]), setresgid, setresuid) after joining its slot cgroups; the
direct path's `/bin/sh` wrapper executes bwrap through util-linux `setpriv`.

What that uid must reach, and how the runner sees to it (`workspace.py`):
its workspaces are owned by it (0700); the folders above them and the staged
/etc are root's, mode 0710 and group `gid`: searchable by that gid only.
Package folders and data mounts must be readable by it; `unreachable` names
the first folder that is not (the call then gets a clear error).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_SANDBOX_GID",
    "DEFAULT_SANDBOX_UID",
    "ENV_SANDBOX_GID",
    "ENV_SANDBOX_UID",
    "SandboxIdentity",
    "unreachable",
]

ENV_SANDBOX_UID = "VESSEL_SANDBOX_UID"
ENV_SANDBOX_GID = "VESSEL_SANDBOX_GID"
#: A root worker's calls run as this host uid and gid by default. Debian
#: reserves 65000-65533 and allocates none of it, so no account, package or
#: file has this id; it is not `nobody` (65534), which NFS maps files to.
DEFAULT_SANDBOX_UID = 65520
DEFAULT_SANDBOX_GID = 65520
#: Largest valid id: (uid_t)-1 means "unchanged" to setresuid.
_MAX_ID = 2**32 - 2


def _parse_id(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text, 10)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a number (a host uid or gid).") from None
    if value == 0:
        raise ValueError(
            f"{name}=0: a root worker's calls must not run as root; "
            f"pick an unprivileged id that owns no files (default {default})."
        )
    if not 0 < value <= _MAX_ID:
        raise ValueError(f"{name}={text!r}: expected a number from 1 to {_MAX_ID}.")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxIdentity:
    """The host uid and gid every confined command of this worker runs as."""

    uid: int
    gid: int
    #: True: the worker is root and drops to uid/gid before starting bwrap.
    drop: bool

    @classmethod
    def for_worker(cls, environ: Mapping[str, str] | None = None) -> SandboxIdentity:
        """The worker's own ids if it is not root; else `VESSEL_SANDBOX_UID/GID`
        (ValueError, naming the variable, if one is 0 or not a number)."""
        if os.geteuid() != 0:
            return cls(uid=os.geteuid(), gid=os.getegid(), drop=False)
        env = os.environ if environ is None else environ
        return cls(
            uid=_parse_id(env, ENV_SANDBOX_UID, DEFAULT_SANDBOX_UID),
            gid=_parse_id(env, ENV_SANDBOX_GID, DEFAULT_SANDBOX_GID),
            drop=True,
        )

    def describe(self) -> str:
        """For the start-up log: `uid 65520, gid 65520 (VESSEL_SANDBOX_UID: the worker is root)`."""
        why = f"{ENV_SANDBOX_UID}: the worker is root" if self.drop else "the worker's own"
        return f"uid {self.uid}, gid {self.gid} ({why})"

    def setpriv_argv(self, binary: str) -> list[str]:
        """util-linux `setpriv` prefix: become uid/gid with no groups and no capabilities."""
        return [
            binary,
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]


def _allows(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Mode bits `bits` (as for "others", e.g. S_IROTH | S_IXOTH) granted to uid/gid."""
    if st.st_uid == uid:
        return (st.st_mode >> 6) & bits == bits
    if st.st_gid == gid:
        return (st.st_mode >> 3) & bits == bits
    return st.st_mode & bits == bits


def _has_acl(path: Path) -> bool:
    try:
        return "system.posix_acl_access" in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False


def unreachable(path: Path, uid: int, gid: int, *, read: bool = True) -> Path | None:
    """The first folder on the way to `path` (itself included, which must be
    readable too unless `read` is False) that uid/gid (no supplementary groups)
    cannot use; None if none.

    From the mode bits; a folder with an ACL is given the benefit of the doubt.
    Symlinks along the way are followed, as bwrap follows them.
    """
    try:
        target = path.resolve(strict=True)
    except OSError:
        return None  # absent: the bind's own error says so
    for folder in (*reversed(target.parents), target):
        try:
            st = os.stat(folder)
        except OSError:
            return folder
        if folder != target or not read:
            bits = stat.S_IXOTH  # search
        elif stat.S_ISDIR(st.st_mode):
            bits = stat.S_IROTH | stat.S_IXOTH  # list and search
        else:
            bits = stat.S_IROTH
        if not _allows(st, uid, gid, bits) and not _has_acl(folder):
            return folder
    return None
