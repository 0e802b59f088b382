"""The call's processes as a slot launcher sees them: started, killed, reaped.

Standard library only: `slot_launcher.py` (the launcher process) imports it.

Children are started with posix_spawn (vfork: no page tables copied, no Python
between fork and exec; here 0.6 ms instead of 2 ms for os.fork + execve), with
exact fd control: every fd of the launcher is close-on-exec, and dup2 actions
put stdin (or /dev/null) at 0, the output pipe at 1 and 2, the bwrap --args
memfd at ARGS_FD and the --seccomp memfd at SECCOMP_FD.

The launcher is a child subreaper: bwrap's outer process exits before its
pid-namespace init is reaped, and that orphan would otherwise stay a zombie
(counted in pids.current) until the host's init reaps it, seconds later here.

Every child is born with oom_score_adj 1000 where the slot has a memory cgroup
(`OomBias`): a call that fills it must be the OOM killer's pick, never the
launcher (see `slot_launcher.py`).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import resource
import select
import signal
import time
from collections.abc import Mapping
from typing import Any

from workers.sandbox.launcher_protocol import ARGS_FD, SECCOMP_FD, STANDBY_FD

__all__ = [
    "OomBias",
    "become_subreaper",
    "children_left",
    "kill_group",
    "reap",
    "reap_all",
    "reap_rest",
    "spawn_child",
]

#: Received fds are first copied at or above this, clear of 0..4.
_HIGH_FD = 10
#: Python ignores the first three at start-up, and ignored dispositions survive
#: execve; the launcher itself ignores SIGINT (and handles SIGCHLD).
_DEFAULT_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ", "SIGINT", "SIGCHLD")
    if hasattr(signal, name)
)
_PR_SET_CHILD_SUBREAPER = 36
#: A call's processes are the OOM killer's first pick (the kernel's maximum).
_CHILD_OOM_SCORE_ADJ = b"1000"


class OomBias:
    """The launcher's own /proc/self/oom_score_adj, opened before any uid drop
    (a dropped process is not dumpable: its /proc files become root's)."""

    def __init__(self) -> None:
        self.fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
        self.own = os.pread(self.fd, 16, 0).strip() or b"0"
        os.pwrite(self.fd, self.own, 0)  # EACCES here if it could not be lowered back

    def for_child(self) -> None:
        os.pwrite(self.fd, _CHILD_OOM_SCORE_ADJ, 0)

    def back(self) -> None:
        os.pwrite(self.fd, self.own, 0)


def spawn_child(request: Mapping[str, Any], fds: list[int], oom: OomBias | None = None) -> int:
    """posix_spawn the call's command (vfork: no Python runs in the child); its pid.

    The child gets: stdin (or /dev/null) at 0, the output at 1 and 2, the memfds
    at ARGS_FD and SECCOMP_FD, a standby's command pipe at STANDBY_FD ("standby"
    in the request), nothing else (every fd of the launcher is
    close-on-exec); its own session; default signal dispositions, an empty
    mask; the launcher's rlimits and cwd (/). Raises OSError if it cannot exec.

    With `cpu_seconds` [soft, hard] in the request, the child's RLIMIT_CPU is set
    by prlimit(2) right after the spawn (never on the launcher: it would count
    the launcher's own CPU time, see `limits.py`). To leave no window in which
    bwrap could start the sandbox first, ARGS_FD is then a pipe, filled from the
    --args memfd only after the prlimit: bwrap reads its arguments to their end
    before it creates anything.
    """
    cpu = request.get("cpu_seconds")
    # Sources clear of 0..5 first: a received fd may sit on a target number.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD) for fd in fds]
    gate_r = gate_w = -1
    try:
        out, args, seccomp_fd = high[:3]
        if cpu is not None:
            gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_DUP2, out, 1),
            (os.POSIX_SPAWN_DUP2, out, 2),
            (os.POSIX_SPAWN_DUP2, args if gate_r < 0 else gate_r, ARGS_FD),
            (os.POSIX_SPAWN_DUP2, seccomp_fd, SECCOMP_FD),
        ]
        if request["stdin"]:
            actions.append((os.POSIX_SPAWN_DUP2, high[3], 0))
        else:
            actions.append((os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0))
        if request.get("standby"):  # the command pipe, last: the prefix reads it at fd 5
            actions.append((os.POSIX_SPAWN_DUP2, high[-1], STANDBY_FD))
        argv = [a.encode("latin-1") for a in request["argv"]]
        env = {k.encode("latin-1"): v.encode("latin-1") for k, v in request["env"].items()}
        if oom is not None:
            oom.for_child()  # inherited at the vfork: the call, not us, is the OOM victim
        try:
            pid = os.posix_spawn(
                argv[0],
                argv,
                env,
                file_actions=actions,
                setsid=True,  # its own session and process group: killpg reaches every process
                setsigdef=_DEFAULT_SIGNALS,
                setsigmask=(),
            )
        finally:
            if oom is not None:
                oom.back()
        if cpu is not None:
            os.close(gate_r)
            gate_r = -1
            try:
                resource.prlimit(pid, resource.RLIMIT_CPU, (int(cpu[0]), int(cpu[1])))
            except (OSError, ValueError):
                kill_group(pid)  # reaped by the SIGCHLD loop; its exit is reported
                raise
            data = memoryview(os.pread(args, os.fstat(args).st_size, 0))
            with contextlib.suppress(BrokenPipeError):  # bwrap died: its exit says why
                while data:
                    data = data[os.write(gate_w, data) :]
        return pid
    finally:
        for fd in (*high, gate_r, gate_w):
            if fd >= 0:
                os.close(fd)


def kill_group(pid: int) -> None:
    """SIGKILL the child's process group and the child; it must not be reaped yet."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


def reap_all() -> None:
    """Reap every exited child (and adopted orphan), without waiting."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def children_left() -> bool:
    """True if any child (or adopted orphan) is not reaped yet."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def become_subreaper() -> None:
    """Be the reaper of orphans from our calls (best effort).

    bwrap's outer process exits before its pid-namespace init is reaped: that
    init is orphaned, and a host init that reaps lazily keeps it a zombie (still
    counted in pids.current) for seconds. As a subreaper the launcher reaps it
    at once, so the slot is empty again before its next call.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap(child: int) -> tuple[int | None, float]:
    """Reap every exited child (orphans included): `child`'s exit status if it was one
    (else None), and the CPU seconds of all reaped (user + system of each and of the
    processes it reaped: bwrap's init reaps the tool, and as an orphan is ours)."""
    code = None
    cpu = 0.0
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return code, cpu
        if pid == 0:
            return code, cpu
        cpu += usage.ru_utime + usage.ru_stime
        if pid == child:
            code = os.waitstatus_to_exitcode(status)


def reap_rest(wake_r: int, seconds: float) -> float:
    """After a call killed by SIGKILL: reap what is left of it (bwrap's init, orphaned,
    exits just after bwrap) for at most `seconds`; the CPU seconds of all reaped.

    Its rusage holds the tool's: it tells a kill at RLIMIT_CPU's hard limit from
    any other SIGKILL (the runner's `_hit_cpu_limit`)."""
    cpu = 0.0
    end = time.monotonic() + seconds
    while True:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return cpu
        if pid:
            cpu += usage.ru_utime + usage.ru_stime
            continue
        left = end - time.monotonic()
        if left <= 0 or not select.select([wake_r], [], [], left)[0]:
            return cpu
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_r, 512):
                pass
