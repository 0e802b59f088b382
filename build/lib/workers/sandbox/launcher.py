"""Slot launchers: a small spawn server per execution slot, placed in its cgroups once.

    worker thread --(AF_UNIX SOCK_SEQPACKET: JSON + fds)--> launcher (slot cgroups, rlimits)
        posix_spawn: setsid, default signals, fds 0/1/2/3/4 -> bwrap --args 3 -- ...

Joining a cgroup v1 (writing cgroup.procs) waits for an RCU grace period, about
10 ms when nothing else wrote one just before. A launcher joins its slot's
`pids`, `memory` and `cpu` cgroups ONCE, after its imports (so its start-up memory
stays charged to the worker's cgroup: memory.move_charge_at_immigrate is 0),
and everything it starts is born inside: no cgroup.procs write per call.

It is single-threaded, and its rlimits are those of the calls it serves: it sets
them on itself at start (soft = hard, `Limits.rlimits`), and every child
inherits them, which replaces the direct path's `/bin/sh` wrapper. Children are
started with posix_spawn (vfork: no page tables copied, no Python between fork
and exec; here 0.6 ms instead of 2 ms for os.fork + execve), with exact fd
control: every fd of the launcher is close-on-exec, and dup2 actions put stdin
(or /dev/null) at 0, the output pipe at 1 and 2, the bwrap --args memfd at
ARGS_FD and the --seccomp memfd at SECCOMP_FD. The launcher is a child
subreaper: bwrap's outer process exits before its pid-namespace init is
reaped, and that orphan would otherwise stay a zombie (counted in pids.current)
until the host's init reaps it, seconds later here.

The launcher process runs this file as a script (`python -I -S launcher.py`):
isolated, no site-packages, standard-library imports only, so it starts fast and
stays small (about 11 MB RSS, most of it shared with any Python). The worker's
side (`Launcher`, `LaunchedChild`, `LauncherPool`) lives here as well; its
extra imports are made inside it, never in the launcher process.

Protocol, one call at a time per launcher:

- launcher -> worker, once at start: {"ready": pid} (or {"error": why});
- worker -> launcher: a request {"argv", "env", "stdin", "cpu_seconds"} with the fds [output
  write end, bwrap --args memfd, --seccomp memfd, (stdin read end)] (a request
  too large for one datagram travels in a memfd: {"in_fd": true});
- launcher -> worker: {"pid": N} with a pidfd of the child (or {"error": why}),
  then {"exit": returncode, "cpu": seconds} once it is reaped (negative: killed
  by that signal, as `subprocess` reports it; cpu: its tree's CPU time);
- worker -> launcher: {"kill": true}: SIGKILL the child's process group, only
  while it is not reaped yet (so never a recycled pid).

On EOF (the worker closed the socket or died) the launcher kills its child's
group, reaps it, moves itself back to the parent cgroups, removes its slot
cgroups (best effort; `CgroupSupport.sweep` removes leftovers) and exits.
bwrap keeps --die-with-parent: a launcher that dies takes the call with it, and
the worker holds the child's pidfd to kill it if the launcher is gone first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

#: (resource.RLIMIT_*, value) pairs, each set soft = hard (`Limits.rlimits`).
Rlimits = tuple[tuple[int, int], ...]

if TYPE_CHECKING:
    import subprocess
    import weakref
    from collections.abc import Mapping, Sequence

    from workers.sandbox.cgroup import CallCgroup, CgroupSupport

__all__ = [
    "ARGS_FD",
    "MIN_DATA_BYTES",
    "SECCOMP_FD",
    "LaunchedChild",
    "Launcher",
    "LauncherLost",
    "LauncherPool",
    "LauncherUnavailable",
    "Rlimits",
    "main",
    "serve",
]

#: Where the child finds bwrap's --args memfd and its --seccomp memfd.
ARGS_FD = 3
SECCOMP_FD = 4
#: Received fds are first copied at or above this, clear of 0..4.
_HIGH_FD = 10
#: Largest datagram sent as is; a larger request travels in a memfd.
_INLINE_BYTES = 64 * 1024
_RECV_BYTES = _INLINE_BYTES + 1024
_MAX_FDS = 8
_FD_BYTES = 4  # a C int
#: Python ignores the first three at start-up, and ignored dispositions survive
#: execve; the launcher itself ignores SIGINT (and handles SIGCHLD).
_DEFAULT_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ", "SIGINT", "SIGCHLD")
    if hasattr(signal, name)
)
_PR_SET_CHILD_SUBREAPER = 36
#: After a SIGKILL, how long to wait for the call's orphaned init (for its rusage).
_REAP_REST_SECONDS = 0.25
#: Memory the launcher must be able to allocate under the calls' RLIMIT_DATA.
_HEADROOM_BYTES = 8 * 1024 * 1024
#: Calls with a smaller RLIMIT_DATA (memory_limit_mb) take the direct path: a
#: launcher (about 10 MB of Python) would not fit under it with room to spare.
MIN_DATA_BYTES = 32 * 1024 * 1024


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _recv_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and its fds, received close-on-exec (MSG_CMSG_CLOEXEC): a received
    fd reaches a child only through a dup2 action. (socket.recv_fds drops its flags
    argument in Python 3.11, hence recvmsg.)"""
    data, ancillary, _, _ = sock.recvmsg(
        _RECV_BYTES, socket.CMSG_SPACE(_MAX_FDS * _FD_BYTES), socket.MSG_CMSG_CLOEXEC
    )
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % _FD_BYTES
            fds += [
                int.from_bytes(payload[i : i + _FD_BYTES], sys.byteorder, signed=True)
                for i in range(0, usable, _FD_BYTES)
            ]
    return data, fds


# --- the launcher process ----------------------------------------------------------


def _spawn(request: Mapping[str, Any], fds: list[int]) -> int:
    """posix_spawn the call's command (vfork: no Python runs in the child); its pid.

    The child gets: stdin (or /dev/null) at 0, the output at 1 and 2, the memfds
    at ARGS_FD and SECCOMP_FD, nothing else (every fd of the launcher is
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
    # Sources clear of 0..4 first: a received fd may sit on a target number.
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
        argv = [a.encode("latin-1") for a in request["argv"]]
        env = {k.encode("latin-1"): v.encode("latin-1") for k, v in request["env"].items()}
        pid = os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=actions,
            setsid=True,  # its own session and process group: killpg reaches every process
            setsigdef=_DEFAULT_SIGNALS,
            setsigmask=(),
        )
        if cpu is not None:
            os.close(gate_r)
            gate_r = -1
            try:
                resource.prlimit(pid, resource.RLIMIT_CPU, (int(cpu[0]), int(cpu[1])))
            except (OSError, ValueError):
                _kill_group(pid)  # reaped by the SIGCHLD loop; its exit is reported
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


def _set_own_rlimits(rlimits: Sequence[Sequence[int]]) -> None:
    """The calls' rlimits, soft = hard, on the launcher itself: every child inherits them."""
    for which, value in rlimits:
        resource.setrlimit(int(which), (int(value), int(value)))


def _kill_group(pid: int) -> None:
    """SIGKILL the child's process group and the child; it must not be reaped yet."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


def _read_request(message: bytes, fds: list[int]) -> tuple[dict[str, Any], list[int]]:
    request: dict[str, Any] = json.loads(message)
    if request.get("in_fd"):
        memfd, fds = fds[-1], fds[:-1]
        try:
            size = os.fstat(memfd).st_size
            data = os.pread(memfd, size, 0)
        finally:
            os.close(memfd)
        request = json.loads(data)
    return request, fds


def _join(procs_files: Sequence[str]) -> None:
    pid = str(os.getpid()).encode()
    for path in procs_files:
        with open(path, "wb") as f:
            f.write(pid)


def _leave_and_remove(procs_files: Sequence[str]) -> None:
    """Move back to each parent cgroup and remove the slot cgroups (best effort)."""
    pid = str(os.getpid()).encode()
    for path in procs_files:
        slot = os.path.dirname(path)
        try:
            with open(os.path.join(os.path.dirname(slot), "cgroup.procs"), "wb") as f:
                f.write(pid)
        except OSError:
            continue  # the worker's close() or CgroupSupport.sweep removes it
        # A call killed just now takes a moment to die (its pid namespace is torn
        # down asynchronously, and its zombies are ours to reap): retry a while.
        delay, deadline = 0.005, time.monotonic() + 3.0
        while True:
            _reap_all()
            try:
                os.rmdir(slot)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() >= deadline:
                    break  # the worker's close() or CgroupSupport.sweep removes it
                time.sleep(delay)
                delay = min(delay * 2, 0.1)


def _reap_all() -> None:
    """Reap every exited child (and adopted orphan), without waiting."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_subreaper() -> None:
    """Be the reaper of orphans from our calls (best effort).

    bwrap's outer process exits before its pid-namespace init is reaped: that
    init is orphaned, and a host init that reaps lazily keeps it a zombie (still
    counted in pids.current) for seconds. As a subreaper the launcher reaps it
    at once, so the slot is empty again before its next call.
    """
    import ctypes  # noqa: PLC0415 (only here; before the cgroup join, so charged to the worker)

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap(child: int) -> tuple[int | None, float]:
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


def _reap_rest(wake_r: int, seconds: float) -> float:
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


def serve(
    sock: socket.socket, rlimits: Sequence[Sequence[int]], procs_files: Sequence[str]
) -> None:
    """The launcher's loop: one child at a time, until the socket's EOF."""
    try:
        os.set_inheritable(sock.fileno(), False)
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
        _become_subreaper()
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the select below
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        os.close(os.pidfd_open(os.getpid()))  # pidfds work here
        _join(procs_files)  # last but one: what was allocated so far stays the worker's
        _set_own_rlimits(rlimits)
        # The launcher lives under the calls' RLIMIT_DATA too: make sure it has room.
        headroom = bytearray(_HEADROOM_BYTES)
        del headroom
    except (OSError, ValueError, AttributeError, MemoryError) as exc:
        _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
        return
    _send(sock, {"ready": os.getpid()})
    pid = -1  # the call's child while it is not reaped
    call_cpu = 0.0  # CPU seconds of what this call's processes reaped so far
    try:
        while True:
            ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                code, cpu = _reap(pid)
                call_cpu += cpu
                if code is not None:
                    pid = -1
                    if code in (-signal.SIGKILL, 128 + signal.SIGKILL):
                        call_cpu += _reap_rest(wake_r, _REAP_REST_SECONDS)
                    _send(sock, {"exit": code, "cpu": call_cpu})
            if sock.fileno() not in ready:
                continue
            message, fds = _recv_fds(sock)
            if not message:
                for fd in fds:
                    os.close(fd)
                return  # EOF: the worker is gone or done with this slot
            try:
                request, fds = _read_request(message, fds)
                if request.get("kill"):
                    if pid > 0:  # not reaped yet: the pid (and group) is still the child's
                        _kill_group(pid)
                    continue
                if pid > 0 or len(fds) < 3:
                    _send(sock, {"error": "launcher busy or request without its fds"})
                    continue
                try:
                    pid = _spawn(request, fds)
                    call_cpu = 0.0
                except (OSError, ValueError) as exc:
                    _send(sock, {"error": f"cannot execute {request['argv'][0]}: {exc}"})
                    continue
                pidfd = os.pidfd_open(pid)  # unreaped: surely this child
                try:
                    _send(sock, {"pid": pid}, [pidfd])
                finally:
                    os.close(pidfd)
            finally:
                for fd in fds:
                    os.close(fd)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the worker is gone
    finally:
        if pid > 0:
            _kill_group(pid)
            os.waitpid(pid, 0)
        _reap(-1)
        _leave_and_remove(procs_files)


def main(argv: Sequence[str]) -> int:
    """`launcher.py FD RLIMITS_JSON [CGROUP_PROCS_FILE...]`: serve on the socket at FD."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the worker's to handle
    sock = socket.socket(fileno=int(argv[0]))
    try:
        serve(sock, json.loads(argv[1]), argv[2:])
    finally:
        sock.close()
    return 0


# --- the worker's side ---------------------------------------------------------------------


class LauncherUnavailable(OSError):
    """A launcher could not be started (the caller takes the direct path)."""


class LauncherLost(OSError):
    """The launcher of a call died or broke the protocol mid-call."""


#: How long a new launcher may take to import, join its cgroups and say ready.
_START_SECONDS = 10.0
#: How long `close` waits for a launcher to exit before killing it.
_CLOSE_SECONDS = 2.0
#: After the launcher is lost and the child killed by pidfd, wait this long for it.
_LOST_KILL_SECONDS = 1.0
#: Before reuse: how long a slot may take to be empty again (pids.current = 1).
_EMPTY_SLOT_SECONDS = 0.5
#: The launcher's own environment (the child's is given per call).
_LAUNCHER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _recv(sock: socket.socket, timeout: float | None) -> tuple[dict[str, Any], list[int]] | None:
    """The next message, None if none came in `timeout`; LauncherLost on EOF or garbage."""
    if timeout is not None:
        ready, _, _ = select.select([sock], [], [], max(timeout, 0.0))
        if not ready:
            return None
    try:
        data, fds = _recv_fds(sock)
    except OSError as exc:
        raise LauncherLost(f"launcher lost: {exc}") from exc
    if not data:
        for fd in fds:
            os.close(fd)
        raise LauncherLost("launcher lost: it exited")
    try:
        message = json.loads(data)
        if not isinstance(message, dict):
            raise ValueError(message)
    except ValueError as exc:
        for fd in fds:
            os.close(fd)
        raise LauncherLost(f"launcher lost: unreadable message {data[:80]!r}") from exc
    return message, list(fds)


class LaunchedChild:
    """One call's process started by a launcher: `process.Child` for `run_child`."""

    def __init__(self, launcher: Launcher, pid: int, pidfd: int) -> None:
        self.launcher = launcher
        self.pid = pid
        self._pidfd = pidfd
        self.returncode: int | None = None
        #: CPU seconds of the child's tree, once reaped (None before, or if unknown).
        self.cpu_seconds: float | None = None

    def wait(self, timeout: float | None) -> int | None:
        """The exit status (None: not yet within `timeout`); LauncherLost if the launcher is."""
        if self.returncode is not None:
            return self.returncode
        try:
            got = _recv(self.launcher.sock, timeout)
            if got is None:
                return None
            message, fds = got
            for fd in fds:
                os.close(fd)
            if not isinstance(message.get("exit"), int):
                raise LauncherLost(f"launcher lost: unexpected message {message!r}")
        except LauncherLost:
            self.launcher.broken = True
            self._kill_by_pidfd()
            raise
        self.returncode = message["exit"]
        cpu = message.get("cpu")
        self.cpu_seconds = float(cpu) if isinstance(cpu, int | float) else None
        self.launcher.busy = False
        self.close()
        return self.returncode

    def kill_tree(self) -> None:
        """SIGKILL the child's group through the launcher (or the child by pidfd if it is lost)."""
        if self.returncode is not None:
            return
        if not self.launcher.broken:
            try:
                _send(self.launcher.sock, {"kill": True})
                return
            except OSError:
                self.launcher.broken = True
        self._kill_by_pidfd()

    def _kill_by_pidfd(self) -> None:
        """Without its launcher: kill the child itself (bwrap's death ends the sandbox)."""
        if self._pidfd < 0:
            return
        with contextlib.suppress(OSError):  # already gone
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        select.select([self._pidfd], [], [], _LOST_KILL_SECONDS)  # readable once it exited
        self.close()

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class Launcher:
    """The worker's end of one launcher: its process, its socket and its slot cgroup."""

    def __init__(
        self,
        slot: CallCgroup | None,
        rlimits: Rlimits,
        process: subprocess.Popen[bytes],
        sock: socket.socket,
    ) -> None:
        self.slot = slot
        #: The rlimits of every call it serves (its own, inherited by its children).
        self.rlimits = rlimits
        self.process = process
        self.sock = sock
        #: Set once the launcher died or broke the protocol: retire it.
        self.broken = False
        #: A child was started and its exit not read yet: not reusable as it is.
        self.busy = False
        self._memory_bytes: int | None = None
        self._cpu_limit: float | None = None
        self._failures = 0

    @classmethod
    def start(cls, slot: CallCgroup | None, rlimits: Rlimits) -> Launcher:
        """Start a launcher in `slot` with `rlimits` and wait until it says ready;
        LauncherUnavailable if it does not."""
        import subprocess  # noqa: PLC0415 (the launcher process never needs it)

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        procs_files = [str(p) for p in slot.procs_files] if slot is not None else []
        try:
            with theirs:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",  # isolated: no PYTHON* variables, no user site, no cwd
                        "-S",  # no site-packages: the standard library only
                        os.path.abspath(__file__),
                        str(theirs.fileno()),
                        json.dumps([list(pair) for pair in rlimits]),
                        *procs_files,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    env=_LAUNCHER_ENV,
                    cwd="/",
                    start_new_session=True,  # no terminal's signals; its children setsid anyway
                )
        except OSError as exc:
            ours.close()
            raise LauncherUnavailable(f"cannot start a launcher: {exc}") from exc
        launcher = cls(slot, rlimits, proc, ours)
        try:
            got = _recv(ours, _START_SECONDS)
            if got is None:
                raise LauncherUnavailable("a launcher did not start in time")
            message, fds = got
            for fd in fds:
                os.close(fd)
            if "ready" not in message:
                raise LauncherUnavailable(f"a launcher refused to start: {message.get('error')}")
        except BaseException as exc:
            launcher.close()
            if isinstance(exc, LauncherLost):
                raise LauncherUnavailable(f"a launcher exited at start: {exc}") from exc
            raise
        launcher._failures = launcher._memory_failcnt()
        return launcher

    def prepare(self, memory_bytes: int, cpu_limit: float | None = None) -> None:
        """Cap the slot's memory and CPU for the next call (OSError if the host refuses)."""
        if self.slot is None:
            return
        if cpu_limit is not None and cpu_limit != self._cpu_limit:
            self.slot.set_cpu_limit(cpu_limit)  # a no-op without a cpu cgroup
            self._cpu_limit = cpu_limit
        if "memory" not in self.slot.paths:
            return
        if memory_bytes != self._memory_bytes:
            self.slot.write("memory", "memory.limit_in_bytes", str(memory_bytes))
            self._memory_bytes = memory_bytes
            self._failures = self._memory_failcnt()

    def memory_failures(self) -> int:
        """How often the slot hit its memory cap in the call just ended (once per call).

        memory.failcnt counts since the slot was made: the count at the end of
        the previous call (or at a new cap) is this call's zero.
        """
        now = self._memory_failcnt()
        failures, self._failures = now - self._failures, now
        return failures

    def _memory_failcnt(self) -> int:
        if self.slot is None or "memory" not in self.slot.paths:
            return 0
        try:
            return int(self.slot.read("memory", "memory.failcnt"))
        except (OSError, ValueError):
            return 0

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        stdin_fd: int | None,
        out_fd: int,
        args_fd: int,
        seccomp_fd: int,
        cpu_seconds: tuple[int, int] | None = None,
    ) -> LaunchedChild:
        """Start `argv` in the slot: `out_fd` at 1 and 2, the memfds at ARGS_FD and SECCOMP_FD;
        RLIMIT_CPU (soft, hard) set on the child alone (`_spawn`) if `cpu_seconds`."""
        encoded = [os.fsencode(a) for a in argv]  # UnicodeEncodeError (ValueError) here, as Popen
        if any(b"\0" in a for a in encoded):
            raise ValueError("embedded null byte")
        request = {
            "argv": [a.decode("latin-1") for a in encoded],
            "env": {
                os.fsencode(k).decode("latin-1"): os.fsencode(v).decode("latin-1")
                for k, v in env.items()
            },
            "stdin": stdin_fd is not None,
            "cpu_seconds": list(cpu_seconds) if cpu_seconds is not None else None,
        }
        fds = [out_fd, args_fd, seccomp_fd, *([stdin_fd] if stdin_fd is not None else [])]
        data = json.dumps(request).encode()
        memfd = -1
        try:
            if len(data) <= _INLINE_BYTES:
                socket.send_fds(self.sock, [data], fds)
            else:
                memfd = os.memfd_create("vessel-launch", os.MFD_CLOEXEC)
                os.write(memfd, data)
                socket.send_fds(self.sock, [b'{"in_fd": true}'], [*fds, memfd])
            got = _recv(self.sock, None)
        except LauncherLost:
            self.broken = True
            raise
        except OSError as exc:
            self.broken = True
            raise LauncherLost(f"launcher lost: {exc}") from exc
        finally:
            if memfd >= 0:
                os.close(memfd)
        assert got is not None
        message, reply_fds = got
        if not isinstance(message.get("pid"), int) or len(reply_fds) != 1:
            for fd in reply_fds:
                os.close(fd)
            raise OSError(f"launcher: {message.get('error', message)}")
        self.busy = True
        return LaunchedChild(self, message["pid"], reply_fds[0])

    def alive(self) -> bool:
        """True unless the launcher died, broke the protocol or has an exit left unread."""
        return not self.broken and not self.busy and self.process.poll() is None

    def settled(self) -> bool:
        """True once the slot holds no process but the launcher (bounded wait).

        The previous call's bwrap is reaped before its exit is reported; its
        pid-namespace init, orphaned, is reaped by the launcher a moment later.
        """
        if self.slot is None or "pids" not in self.slot.paths:
            return True
        import time  # noqa: PLC0415 (the launcher process never needs it)

        end = time.monotonic() + _EMPTY_SLOT_SECONDS
        delay = 0.0002
        while True:
            try:
                if int(self.slot.read("pids", "pids.current")) <= 1:
                    return True
            except (OSError, ValueError):
                return False
            if time.monotonic() >= end:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def close(self) -> None:
        """Stop the launcher (EOF on its socket, SIGKILL if it lingers) and remove its slot."""
        import subprocess  # noqa: PLC0415

        self.sock.close()
        try:
            self.process.wait(timeout=_CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.slot is not None:
            self.slot.remove()

    def abandon(self) -> None:
        """In a forked child: drop this process's copy of the socket, nothing else."""
        self.sock.close()


class LauncherPool:
    """The launchers of one process: taken by a call, given back after it.

    A call takes a free launcher with its rlimits (a launcher's rlimits are its
    own); if there is none, a new one is started, and an idle one with other
    rlimits is stopped instead, so the pool grows to the number of calls at
    once, not to calls times limit sets. A pool belongs to the process that made
    it: in a forked child (prefork) it is emptied without touching the parent's
    launchers, and it refuses to serve if used from another pid anyway.
    """

    def __init__(self, cgroups: CgroupSupport) -> None:
        import threading  # noqa: PLC0415 (the launcher process never needs it)

        self.cgroups = cgroups
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._free: list[Launcher] = []  # most recently given back last
        self._all: set[Launcher] = set()
        self._abandoned: list[Launcher] = []
        self._closed = False
        _forget_after_fork(self)

    def _new(self, memory_bytes: int, rlimits: Rlimits, cpu_limit: float | None) -> Launcher:
        from workers.sandbox.cgroup import PIDS_MAX  # noqa: PLC0415

        slot = None
        if self.cgroups.controllers:
            # pids.max counts the launcher itself: the call keeps PIDS_MAX.
            slot = self.cgroups.create(
                memory_bytes=memory_bytes, cpu_limit=cpu_limit, pids_max=PIDS_MAX + 1, kind="slot"
            )
        try:
            launcher = Launcher.start(slot, rlimits)
        except BaseException:
            if slot is not None:
                slot.remove()
            raise
        launcher._memory_bytes = memory_bytes
        launcher._cpu_limit = cpu_limit
        return launcher

    def take(
        self, memory_bytes: int, rlimits: Rlimits, cpu_limit: float | None = None
    ) -> Launcher | None:
        """A free launcher with `rlimits` (a new one if none is), its slot empty, its
        memory capped at `memory_bytes` and its CPU at `cpu_limit` cores (None: left as
        it is); None if the pool is closed or not this process's,
        or if RLIMIT_DATA is below MIN_DATA_BYTES.

        Raises LauncherUnavailable or OSError if a new one cannot be made.
        """
        if os.getpid() != self.owner:
            return None
        if any(which == resource.RLIMIT_DATA and v < MIN_DATA_BYTES for which, v in rlimits):
            return None
        while True:
            idle: Launcher | None = None
            with self._lock:
                if self._closed:
                    return None
                launcher = next(
                    (each for each in reversed(self._free) if each.rlimits == rlimits), None
                )
                if launcher is not None:
                    self._free.remove(launcher)
                elif self._free:
                    idle = self._free.pop(0)  # the longest idle, of other limits
            if idle is not None:
                self._retire(idle)
            if launcher is None:
                break
            try:
                if launcher.settled():
                    launcher.prepare(memory_bytes, cpu_limit)
                    return launcher
            except OSError:
                pass  # e.g. EBUSY: its page cache is over the new cap
            self._retire(launcher)
        launcher = self._new(memory_bytes, rlimits, cpu_limit)
        with self._lock:
            self._all.add(launcher)
        return launcher

    def give(self, launcher: Launcher) -> None:
        """Back to the free list after a call, or stopped if it broke."""
        if os.getpid() != self.owner:
            return
        if launcher.alive():
            with self._lock:
                if not self._closed:
                    self._free.append(launcher)
                    return
        self._retire(launcher)

    def _retire(self, launcher: Launcher) -> None:
        with self._lock:
            self._all.discard(launcher)
        launcher.close()

    def close(self) -> None:
        """Stop every free launcher and remove its slot; busy ones stop when given back."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
            self._all.difference_update(free)
        if os.getpid() != self.owner:
            return
        for launcher in free:
            launcher.close()

    def _after_fork_in_child(self) -> None:
        import threading  # noqa: PLC0415

        self._lock = threading.Lock()  # the parent's may have been held at the fork
        for launcher in self._all | set(self._free):
            launcher.abandon()
        # Kept referenced: a collected Popen of the parent's would warn "still running".
        self._abandoned = [*self._all, *self._free]
        self._all, self._free = set(), []


_POOLS: weakref.WeakSet[LauncherPool] | None = None


def _forget_after_fork(pool: LauncherPool) -> None:
    """Have `pool` emptied in every forked child of this process (one hook for all pools)."""
    global _POOLS  # noqa: PLW0603 (one at-fork hook per process, registered on first use)
    if _POOLS is None:
        import weakref  # noqa: PLC0415 (the launcher process never needs it)

        pools: weakref.WeakSet[LauncherPool] = weakref.WeakSet()

        def after_fork_in_child() -> None:
            for each in list(pools):
                each._after_fork_in_child()

        os.register_at_fork(after_in_child=after_fork_in_child)
        _POOLS = pools
    _POOLS.add(pool)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
