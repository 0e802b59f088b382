"""A slot launcher's own set-up: its cgroups, its uid, its rlimits, its keeper.

Standard library only: `slot_launcher.py` (the launcher process) imports it.

Joining a cgroup v1 (writing cgroup.procs) waits for an RCU grace period, about
10 ms when nothing else wrote one just before. A launcher joins its slot's
`pids`, `memory` and `cpu` cgroups ONCE, after its imports (so its start-up
memory stays charged to the worker's cgroup: memory.move_charge_at_immigrate is
0), and everything it starts is born inside: no cgroup.procs write per call.

A root worker's launcher drops to the sandbox uid (`identity.py`) right after
joining: setgroups([]), setresgid, setresuid, then a check that no id and no
capability is left (`drop_to`). Before that it forks a keeper that stays root
and outside the slot, to remove the slot cgroups once the launcher is gone
(`fork_keeper`).
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Sequence

from workers.sandbox.launcher_children import become_subreaper, reap_all

__all__ = [
    "drop_to",
    "fork_keeper",
    "join_cgroups",
    "leave_and_remove",
    "remove_slot",
    "set_own_rlimits",
]


def drop_to(uid: int, gid: int) -> None:
    """Become uid/gid for good: no supplementary groups, no capability left (OSError if any)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError(f"could not become uid {uid}, gid {gid}")
    with open("/proc/self/status", "rb") as f:
        for line in f:
            name, _, value = line.partition(b":")
            if name in (b"CapPrm", b"CapEff", b"CapAmb") and int(value.strip(), 16):
                raise OSError(f"capabilities left after becoming uid {uid}: {line.decode()!r}")


def set_own_rlimits(rlimits: Sequence[Sequence[int]]) -> None:
    """The calls' rlimits, soft = hard, on the launcher itself: every child inherits them."""
    for which, value in rlimits:
        resource.setrlimit(int(which), (int(value), int(value)))


def join_cgroups(procs_files: Sequence[str]) -> None:
    pid = str(os.getpid()).encode()
    for path in procs_files:
        with open(path, "wb") as f:
            f.write(pid)


def leave_and_remove(procs_files: Sequence[str]) -> None:
    """Move back to each parent cgroup and remove the slot cgroups (best effort)."""
    pid = str(os.getpid()).encode()
    for path in procs_files:
        slot = os.path.dirname(path)
        try:
            with open(os.path.join(os.path.dirname(slot), "cgroup.procs"), "wb") as f:
                f.write(pid)
        except OSError:
            continue  # dropped (the keeper removes it), or the worker's close() / sweep does
        remove_slot(slot)


def remove_slot(slot: str) -> None:
    """rmdir a slot cgroup once it is empty (best effort, a few seconds)."""
    # A call killed just now takes a moment to die (its pid namespace is torn
    # down asynchronously, and its zombies are ours to reap): retry a while.
    delay, deadline = 0.005, time.monotonic() + 3.0
    while True:
        reap_all()
        try:
            os.rmdir(slot)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return  # the worker's close() or CgroupSupport.sweep removes it
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def fork_keeper(sock: socket.socket, procs_files: Sequence[str]) -> None:
    """Before dropping root: fork; the child returns and serves, the parent (the
    keeper, never in the slot) waits for it and then removes the slot cgroups,
    which the dropped launcher no longer may. This way a worker killed outright
    leaves no slot behind, as a root launcher that drops nothing would not."""
    pid = os.fork()
    if pid == 0:
        return
    sock.close()  # the worker must see EOF when the launcher proper exits
    become_subreaper()  # the call's orphans, if the launcher dies first, are ours to reap
    while True:
        try:
            os.waitpid(pid, 0)
            break
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    for path in procs_files:
        remove_slot(os.path.dirname(path))
    os._exit(0)
