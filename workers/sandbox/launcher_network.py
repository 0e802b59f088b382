"""The network namespace a slot launcher's calls run in, one call after another.

Standard library only: `slot_launcher.py` (the launcher process) imports it.

bwrap's `--unshare-net` makes a network namespace per call, and the kernel tears
each one down afterwards in a work queue of its own (`cleanup_net`, serialised
across the machine): at volume that is most of a millisecond of CPU a call and a
sixth of a burst's throughput (bench/README.md, 2026-12-07). A launcher serves one
call at a time, so it makes one empty namespace when it starts and runs its calls
in it (`bwrap --share-net`), with these guarantees:

- No interface is up: a new namespace's loopback starts down, and no call can
  bring it up or change anything in it. The namespace belongs to the launcher's
  own user namespace; a call's processes live in a user namespace of their own
  below it, with no capability over it. TCP and UDP fail with ENETUNREACH, to
  127.0.0.1 too (`VESSEL_SANDBOX_NETWORK=per-call` gives each call bwrap's own
  namespace, loopback up, as before).
- Never two calls in it at once: a call is started only when the previous one is
  gone, i.e. the launcher has no child left. The call's pid-namespace init, which
  the launcher reaps as subreaper, exits only after every process of the call.
- Nothing of a previous call in it: a socket can outlive its processes (an fd in
  flight in a unix socket's queue waits for the kernel's garbage collector, and a
  bound abstract name with it). So before each call the launcher reads the
  namespace's count of sockets (`/proc/self/net/sockstat`, "sockets: used"); if it
  is not 0, or a child is still there after a short wait, the call and the ones
  after it get a new empty namespace.

The launcher makes it with unshare(CLONE_NEWUSER | CLONE_NEWNET) after its uid
drop, mapping its own uid and gid to themselves. It thereby holds capabilities in
that user namespace alone, which owns nothing but its network namespaces and, when
it has a hole for its standbys, one mount namespace whose only mounts of its own
are that hole's (`launcher_holes.py`; every pid and ipc namespace it is in is the
host's): that is what lets it make the next one. Its children lose them at exec
(bwrap is not uid 0 there).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from workers.sandbox.env_choice import env_choice

__all__ = [
    "ENV_SANDBOX_NETWORK",
    "NETWORK_MODES",
    "CallNetwork",
    "network_mode",
    "sockets_in_namespace",
]

#: `slot` (default): a launcher's calls share its empty namespace, one after
#: another; `per-call`: bwrap makes one per call, loopback up.
ENV_SANDBOX_NETWORK = "VESSEL_SANDBOX_NETWORK"
NETWORK_MODES = ("slot", "per-call")

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
_SOCKSTAT = "/proc/self/net/sockstat"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> None:
    if _libc().unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def network_mode(environ: Mapping[str, str]) -> str:
    """`$VESSEL_SANDBOX_NETWORK` (unset or empty: slot); ValueError if unknown."""
    return env_choice(environ, ENV_SANDBOX_NETWORK, NETWORK_MODES)


def sockets_in_namespace() -> int:
    """How many sockets exist in the calling thread's network namespace."""
    with open(_SOCKSTAT, "rb") as f:
        first = f.readline()  # b"sockets: used N"
    return int(first.rsplit(None, 1)[-1])


class CallNetwork:
    """The launcher's empty network namespace (see the module's text)."""

    def __init__(self) -> None:
        #: How often a call found the namespace not empty and got a new one.
        self.renewed = 0

    @classmethod
    def enter(cls) -> CallNetwork:
        """Move the launcher into a new user and network namespace (OSError if refused)."""
        uid, gid = os.getuid(), os.getgid()
        libc = _libc()
        # A process that dropped root is not dumpable, and its /proc/self files are
        # root's: it could not write its own maps. Dumpable for that moment only.
        dumpable = libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
        if dumpable != 1:
            libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        try:
            _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
            _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        finally:
            if dumpable != 1:
                libc.prctl(_PR_SET_DUMPABLE, dumpable, 0, 0, 0)
        if sockets_in_namespace() != 0:
            raise OSError("a new network namespace holds sockets")
        return cls()

    def ready_for_call(self, children_gone: bool) -> None:
        """Before a call: a new empty namespace unless this one is free and empty.

        `children_gone`: the previous call's processes are all reaped."""
        if children_gone and sockets_in_namespace() == 0:
            return
        try:
            _unshare(_CLONE_NEWNET)
        except OSError as exc:
            why = f"cannot make the call a new network namespace: {exc.strerror}"
            raise OSError(exc.errno, why) from exc
        self.renewed += 1
