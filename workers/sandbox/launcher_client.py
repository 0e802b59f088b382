"""The worker's end of one slot launcher (`slot_launcher.py`): start it, hand it a
call, read the call's exit, stop it.

`Launcher.start` runs the launcher script in a new session with the slot's
cgroup.procs files, the calls' rlimits and whom to drop to, and waits for its
{"ready"}; `Launcher.send_spawn` sends one call's argv, environment and fds
(`launcher_protocol.py`) and `Launcher.spawned` reads the answer, a `LaunchedChild`
(the `process.Child` that `process.drive_child` drains, times out and kills). The
slot's per-call caps
(memory.limit_in_bytes, the CPU quota) are set from here between calls
(`prepare`); `memory_failures` reads whether the call hit its memory cap.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.sandbox.launcher_holes import HOLE_NAME
from workers.sandbox.launcher_protocol import INLINE_BYTES, Rlimits, recv_fds, send

if TYPE_CHECKING:
    from workers.sandbox.cgroup import CallCgroup
    from workers.sandbox.identity import SandboxIdentity
    from workers.sandbox.standby import Standby

__all__ = ["LaunchedChild", "Launcher", "LauncherLost", "LauncherUnavailable"]

#: The launcher process's script.
_SCRIPT = str(Path(__file__).resolve().with_name("slot_launcher.py"))


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
    """The next message, None if none came in `timeout` (None: wait); LauncherLost on
    EOF or garbage."""
    if timeout is not None:
        ready, _, _ = select.select([sock], [], [], max(timeout, 0.0))
        if not ready:
            return None
    return _recv_now(sock)


def _recv_now(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The next message, waiting for it; LauncherLost on EOF or garbage."""
    try:
        data, fds = recv_fds(sock)
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
        self.exited(message)
        return self.returncode

    def exited(self, message: Mapping[str, Any]) -> None:
        """Note the launcher's `{"exit": code, "cpu": seconds}` for this child."""
        self.returncode = int(message["exit"])
        cpu = message.get("cpu")
        self.cpu_seconds = float(cpu) if isinstance(cpu, int | float) else None
        self.launcher.busy = False
        self.close()

    def kill_tree(self) -> None:
        """SIGKILL the child's group through the launcher (or the child by pidfd if it is lost)."""
        if self.returncode is not None:
            return
        if not self.launcher.broken:
            try:
                send(self.launcher.sock, {"kill": True})
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
        #: The serving process (for a root worker, a child of `process`, the keeper).
        self.pid = process.pid
        self.sock = sock
        #: Set once the launcher died or broke the protocol: retire it.
        self.broken = False
        #: A child was started and its exit not read yet: not reusable as it is.
        self.busy = False
        #: Its calls run in its own empty network namespace (bwrap --share-net).
        self.shared_network = False
        #: Why it could not make one, when asked to ("" if it was not, or could).
        self.network_refused = ""
        #: The folder its standbys bind at the workspace's place, the call's workspace
        #: mounted there at the call (`launcher_holes.py`); None: it has no hole.
        self.hole: str | None = None
        #: Why it has none, when given a folder for one ("" otherwise).
        self.holes_refused = ""
        #: The folder made for its hole (removed with it).
        self.hole_dir: Path | None = None
        self._memory_bytes: int | None = None
        self._cpu_limit: float | None = None
        self._failures = 0
        #: The sandbox started ahead for its next call, if any (`standby.py`): its child
        #: is this launcher's, so the launcher is busy with it but free for a call.
        self.standby: Standby | None = None

    @classmethod
    def start(
        cls,
        slot: CallCgroup | None,
        rlimits: Rlimits,
        identity: SandboxIdentity | None = None,
        *,
        memory_bytes: int | None = None,
        cpu_limit: float | None = None,
        share_network: bool = False,
        hole_dir: Path | None = None,
    ) -> Launcher:
        """Start a launcher in `slot` with `rlimits` and wait until it says ready;
        LauncherUnavailable if it does not. With `identity.drop` it serves as
        identity.uid/gid; with a memory slot its children are the OOM's first pick.
        `memory_bytes` and `cpu_limit`: the caps `slot` was made with (None: unknown).
        `share_network`: its calls run in one empty network namespace of its own, one
        after another (`launcher_network.py`), if it can make one (`shared_network`).
        `hole_dir`: an empty folder for its hole (`launcher_holes.py`; only with
        `share_network`), removed when it closes."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        procs_files = [str(p) for p in slot.procs_files] if slot is not None else []
        try:
            with theirs:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",  # isolated: no PYTHON* variables, no user site, no cwd
                        "-S",  # no site-packages: the standard library only
                        _SCRIPT,
                        str(theirs.fileno()),
                        json.dumps([list(pair) for pair in rlimits]),
                        json.dumps(
                            {
                                "uid": identity.uid if identity and identity.drop else None,
                                "gid": identity.gid if identity and identity.drop else None,
                                "oom": slot is not None and "memory" in slot.paths,
                                "network": share_network,
                                "hole": str(hole_dir) if hole_dir is not None else None,
                            }
                        ),
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
        launcher.hole_dir = hole_dir
        try:
            got = _recv(ours, _START_SECONDS)
            if got is None:
                raise LauncherUnavailable("a launcher did not start in time")
            message, fds = got
            for fd in fds:
                os.close(fd)
            if not isinstance(message.get("ready"), int):
                raise LauncherUnavailable(f"a launcher refused to start: {message.get('error')}")
            launcher.pid = message["ready"]
            launcher.shared_network = message.get("network") is True
            launcher.network_refused = str(message.get("refused") or "")
            if message.get("holes") is True and hole_dir is not None:
                launcher.hole = str(hole_dir / HOLE_NAME)
            launcher.holes_refused = str(message.get("holes_refused") or "")
        except BaseException as exc:
            launcher.close()
            if isinstance(exc, LauncherLost):
                raise LauncherUnavailable(f"a launcher exited at start: {exc}") from exc
            raise
        launcher._memory_bytes = memory_bytes
        launcher._cpu_limit = cpu_limit
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

    def send_spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        stdin_fd: int | None,
        out_fd: int,
        args_fd: int,
        seccomp_fd: int,
        cpu_seconds: tuple[int, int] | None = None,
        share_net: bool = False,
        command_fd: int | None = None,
    ) -> None:
        """Ask for `argv` to be started in the slot: `out_fd` at 1 and 2, the memfds at
        ARGS_FD and SECCOMP_FD; RLIMIT_CPU (soft, hard) set on the child alone if
        `cpu_seconds`; `share_net`: argv is a bwrap with --share-net, to start in the
        launcher's network namespace once that is free and empty; `command_fd`: a
        standby's command pipe (read end), at STANDBY_FD in the child (`standby.py`).

        Not waited for: the launcher starts the child while the caller goes on, and
        `spawned` reads its answer. The fds are in flight once this returns: the
        caller may close its own. A standby's request has the launcher reap what is
        left of the previous call first, so the slot is empty."""
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
            "share_net": share_net,
            "standby": command_fd is not None,
        }
        fds = [out_fd, args_fd, seccomp_fd, *([stdin_fd] if stdin_fd is not None else [])]
        if command_fd is not None:
            fds.append(command_fd)
        data = json.dumps(request).encode()
        memfd = -1
        try:
            if len(data) <= INLINE_BYTES:
                socket.send_fds(self.sock, [data], fds)
            else:
                memfd = os.memfd_create("vessel-launch", os.MFD_CLOEXEC)
                os.write(memfd, data)
                socket.send_fds(self.sock, [b'{"in_fd": true}'], [*fds, memfd])
        except OSError as exc:
            self.broken = True
            raise LauncherLost(f"launcher lost: {exc}") from exc
        finally:
            if memfd >= 0:
                os.close(memfd)
        self.busy = True  # until the child's exit is read, or the request refused

    def spawned(self) -> LaunchedChild:
        """The answer to `send_spawn`: the child, or OSError (LauncherLost if the
        launcher is gone)."""
        try:
            message, reply_fds = _recv_now(self.sock)
        except LauncherLost:
            self.broken = True
            raise
        if not isinstance(message.get("pid"), int) or len(reply_fds) != 1:
            for fd in reply_fds:
                os.close(fd)
            self.busy = False
            raise OSError(f"launcher: {message.get('error', message)}")
        return LaunchedChild(self, message["pid"], reply_fds[0])

    def send_mount(self, workspace: Path, outbox: Path | None) -> None:
        """Ask the launcher to mount `workspace` (and `outbox` over its `outbox/`) at
        its hole, where its standby waits; `mounted` reads the answer. Not waited
        for: the launcher mounts while the worker readies the call. OSError if the
        launcher is gone."""
        try:
            send(self.sock, {"mount": [str(workspace), None if outbox is None else str(outbox)]})
        except OSError as exc:
            self.broken = True
            raise OSError(f"launcher lost: {exc}") from exc

    def mounted(self, child: LaunchedChild) -> None:
        """The answer to `send_mount`; OSError if the launcher did not mount (the
        standby is then not usable). An exit of `child`, the standby, read meanwhile
        is kept for its wait."""
        try:
            while True:
                message, fds = _recv_now(self.sock)
                for fd in fds:
                    os.close(fd)
                if isinstance(message.get("exit"), int):  # the standby died first
                    child.exited(message)
                    continue
                if message.get("mounted") is True:
                    return
                raise OSError(f"launcher: {message.get('error', message)}")
        except (LauncherLost, BrokenPipeError, ConnectionResetError) as exc:
            self.broken = True
            raise OSError(f"launcher lost: {exc}") from exc

    def alive(self) -> bool:
        """True unless the launcher died, broke the protocol or has an exit left unread
        (a standby's child is not a call's: a launcher holding one is free for a call)."""
        if self.broken or (self.busy and self.standby is None):
            return False
        return self.process.poll() is None

    def has_message(self) -> bool:
        """True if the launcher sent something not read yet (a standby's exit)."""
        ready, _, _ = select.select([self.sock], [], [], 0)
        return bool(ready)

    def drop_standby(self) -> None:
        """Kill its standby, if it holds one (`Standby.discard`)."""
        if self.standby is not None:
            self.standby.discard()

    def settled(self) -> bool:
        """True once the slot holds no process but the launcher (bounded wait).

        The previous call's bwrap is reaped before its exit is reported; its
        pid-namespace init, orphaned, is reaped by the launcher a moment later.
        """
        if self.slot is None or "pids" not in self.slot.paths or self.standby is not None:
            return True  # a standby was started only once the slot was empty
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
        self.drop_standby()
        self.sock.close()
        try:
            self.process.wait(timeout=_CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.slot is not None:
            self.slot.remove()
        if self.hole_dir is not None:  # its tmpfs was in its own mount namespace: gone
            with contextlib.suppress(OSError):
                self.hole_dir.rmdir()

    def abandon(self) -> None:
        """In a forked child: drop this process's copy of the socket, nothing else."""
        if self.standby is not None:
            self.standby.abandon()
            self.standby = None
        self.sock.close()
