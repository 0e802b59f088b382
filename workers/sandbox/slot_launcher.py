"""The slot launcher process: a small spawn server per execution slot (this file
is its script, run as `python -I -S slot_launcher.py ...`).

    worker thread --(AF_UNIX SOCK_SEQPACKET: JSON + fds)--> launcher (slot cgroups, rlimits)
        posix_spawn: setsid, default signals, fds 0/1/2/3/4 -> bwrap --args 3 -- ...

The worker's side is `launcher_client.py` (one launcher) and `launcher_pool.py`
(a process's launchers); the wire is `launcher_protocol.py`; what the launcher
does to place itself is `launcher_placement.py` (cgroups joined once, the uid
drop, its rlimits, the keeper), and what it does to the call's processes is
`launcher_children.py` (posix_spawn, kill, reap).

It is single-threaded, and its rlimits are those of the calls it serves: it sets
them on itself at start (soft = hard, `Limits.rlimits`), and every child
inherits them, which replaces the direct path's `/bin/sh` wrapper.

A root worker's launcher drops to the sandbox uid right after joining its slot
cgroups, before it serves. Everything it starts (bwrap, the call) is that uid
on the host, never root. The slot cgroups and their control files stay root's:
the worker sets and reads them.

The launcher lives in its slot's memory cgroup, and a call that fills it calls
the OOM killer into that cgroup: it must pick the call, never the launcher
(whose loss ends the call as a sandbox error instead of the memory text). So
every child is born with oom_score_adj 1000 (the first to go), which needs no
privilege: the launcher raises its own value to 1000 for the posix_spawn (the
child inherits it at the vfork) and lowers it back to its starting value at
once (allowed unprivileged, as that is not below the kernel's
`oom_score_adj_min`; checked when the launcher starts). A call may lower its
own value as far as that minimum (normally 0, the launcher's own) and no
further: a hostile call can at most make the OOM killer weigh it against the
launcher by size, and then it is usually the larger.

The process is isolated (`-I`), with no site-packages (`-S`): standard-library
imports only, so it starts fast and stays small (about 11 MB RSS, most of it
shared with any Python). Run as a script, it puts the folder holding the
`workers` package on sys.path (last, after the standard library) for its
four sibling modules, which import nothing else either.

Started as `slot_launcher.py FD RLIMITS_JSON IDENTITY_JSON [CGROUP_PROCS_FILE...]`,
IDENTITY_JSON `{"uid": N or null, "gid": N or null, "oom": true or false, "network":
true or false, "hole": FOLDER or null}`: whom to drop to (null: stay), whether to
favour children as OOM victims, whether to make the calls' network namespace, and
the empty folder for its hole (`launcher_holes.py`: in its own network namespace's
user namespace only). The ready message says whether it has one ("holes"); a
request `{"mount": [workspace, outbox or null]}` while a standby waits mounts them
at the hole (`{"mounted": true}` or an error), and what was mounted there is
detached once the child's exit is sent.

Asked to (IDENTITY_JSON's "network": true), the launcher moves into an empty
network namespace of its own after the uid drop, and a request with "share_net"
(a bwrap with --share-net) starts there once the previous call is gone and the
namespace is empty, or in a new one (`launcher_network.py`). The ready message
says whether it could ({"ready": pid, "network": bool, "refused": why}). A
standby's request ("standby", `standby.py`) starts once the previous call's
processes are reaped too, so the slot holds nothing of it.

On EOF (the worker closed the socket or died) the launcher kills its child's
group, reaps it, moves itself back to the parent cgroups, removes its slot
cgroups (best effort; `CgroupSupport.sweep` removes leftovers) and exits.
bwrap keeps --die-with-parent: a launcher that dies takes the call with it, and
the worker holds the child's pidfd to kill it if the launcher is gone first.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

if __name__ == "__main__":  # a script under -I -S: its package's root is not on sys.path
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from workers.sandbox.launcher_children import (
    OomBias,
    become_subreaper,
    children_left,
    kill_group,
    reap,
    reap_rest,
    spawn_child,
)
from workers.sandbox.launcher_holes import Holes
from workers.sandbox.launcher_network import CallNetwork
from workers.sandbox.launcher_placement import (
    drop_to,
    fork_keeper,
    join_cgroups,
    leave_and_remove,
    set_own_rlimits,
)
from workers.sandbox.launcher_protocol import read_request, recv_fds, send

__all__ = ["main", "serve"]

#: After a SIGKILL, how long to wait for the call's orphaned init (for its rusage).
_REAP_REST_SECONDS = 0.25
#: Memory the launcher must be able to allocate under the calls' RLIMIT_DATA.
_HEADROOM_BYTES = 8 * 1024 * 1024
#: Before a call in the shared network namespace: how long the previous call's
#: processes may take to go (its pid-namespace init exits just after bwrap).
_SETTLE_SECONDS = 0.05


def serve(
    sock: socket.socket,
    rlimits: Sequence[Sequence[int]],
    procs_files: Sequence[str],
    identity: Mapping[str, Any] | None = None,
) -> None:
    """The launcher's loop: one child at a time, until the socket's EOF.

    `identity`: {"uid", "gid"} to drop to after joining the cgroups (None: stay),
    {"oom": True} to make every child the OOM killer's first pick.
    """
    identity = identity or {}
    oom: OomBias | None = None
    try:
        os.set_inheritable(sock.fileno(), False)
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
        if identity.get("uid") is not None and procs_files:
            fork_keeper(sock, procs_files)  # returns in the launcher proper
        become_subreaper()
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the select below
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        os.close(os.pidfd_open(os.getpid()))  # pidfds work here
        join_cgroups(procs_files)  # what was allocated so far stays the worker's
        if identity.get("oom"):
            oom = OomBias()
        if identity.get("uid") is not None:
            drop_to(int(identity["uid"]), int(identity["gid"]))
        network: CallNetwork | None = None
        network_refused = ""
        if identity.get("network"):
            try:
                network = CallNetwork.enter()
            except OSError as exc:  # no user namespaces for this process: bwrap's per call
                network_refused = f"{type(exc).__name__}: {exc}"
        holes: Holes | None = None
        holes_refused = ""
        if network is not None and identity.get("hole"):  # its user namespace may mount
            try:
                holes = Holes.make(str(identity["hole"]))
            except OSError as exc:  # a turn's standby binds the turn's workspace, as before
                holes_refused = f"{type(exc).__name__}: {exc}"
        set_own_rlimits(rlimits)
        # The launcher lives under the calls' RLIMIT_DATA too: make sure it has room.
        headroom = bytearray(_HEADROOM_BYTES)
        del headroom
    except (OSError, ValueError, AttributeError, MemoryError) as exc:
        send(sock, {"error": f"{type(exc).__name__}: {exc}"})
        return
    send(
        sock,
        {
            "ready": os.getpid(),
            "network": network is not None,
            "refused": network_refused,
            "holes": holes is not None,
            "holes_refused": holes_refused,
        },
    )
    pid = -1  # the call's child while it is not reaped
    call_cpu = 0.0  # CPU seconds of what this call's processes reaped so far
    try:
        while True:
            ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                code, cpu = reap(pid)
                call_cpu += cpu
                if code is not None:
                    pid = -1
                    if code in (-signal.SIGKILL, 128 + signal.SIGKILL):
                        call_cpu += reap_rest(wake_r, _REAP_REST_SECONDS)
                    send(sock, {"exit": code, "cpu": call_cpu})
                    if holes is not None:
                        with contextlib.suppress(OSError):  # then the next mount says so
                            holes.clear()
            if sock.fileno() not in ready:
                continue
            message, fds = recv_fds(sock)
            if not message:
                for fd in fds:
                    os.close(fd)
                return  # EOF: the worker is gone or done with this slot
            try:
                request, fds = read_request(message, fds)
                if request.get("kill"):
                    if pid > 0:  # not reaped yet: the pid (and group) is still the child's
                        kill_group(pid)
                    continue
                if "mount" in request:  # a standby's call: its workspace at the hole
                    send(sock, _mount_for_standby(holes, pid, request["mount"]))
                    continue
                wanted = 3 + bool(request.get("stdin")) + bool(request.get("standby"))
                if pid > 0 or len(fds) != wanted:
                    send(sock, {"error": "launcher busy or request without its fds"})
                    continue
                try:
                    shared = network is not None and request.get("share_net")
                    if shared or request.get("standby"):
                        reap_rest(wake_r, _SETTLE_SECONDS)  # the previous call's last processes
                    if network is not None and shared:
                        network.ready_for_call(children_gone=not children_left())
                    pid = spawn_child(request, fds, oom)
                    call_cpu = 0.0
                except (OSError, ValueError) as exc:
                    send(sock, {"error": f"cannot execute {request['argv'][0]}: {exc}"})
                    continue
                pidfd = os.pidfd_open(pid)  # unreaped: surely this child
                try:
                    send(sock, {"pid": pid}, [pidfd])
                finally:
                    os.close(pidfd)
            finally:
                for fd in fds:
                    os.close(fd)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the worker is gone
    finally:
        if pid > 0:
            kill_group(pid)
            os.waitpid(pid, 0)
        reap(-1)
        leave_and_remove(procs_files)


def _mount_for_standby(holes: Holes | None, pid: int, folders: Any) -> dict[str, Any]:
    """The answer to a `{"mount": [workspace, outbox or null]}` request: `{"mounted":
    true}`, or an error (the worker then starts the call the usual way)."""
    if holes is None or pid <= 0:
        return {"error": "no standby at the hole to mount a workspace for"}
    try:
        workspace, outbox = folders
        holes.mount_at_hole(str(workspace), None if outbox is None else str(outbox))
    except (OSError, TypeError, ValueError) as exc:
        return {"error": f"cannot mount the call's workspace: {exc}"}
    return {"mounted": True}


def main(argv: Sequence[str]) -> int:
    """`launcher.py FD RLIMITS_JSON IDENTITY_JSON [CGROUP_PROCS_FILE...]`: serve on FD."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the worker's to handle
    sock = socket.socket(fileno=int(argv[0]))
    try:
        serve(sock, json.loads(argv[1]), argv[3:], json.loads(argv[2]))
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
