"""Spawn the confined command, feed and drain it, and kill its whole tree.

One pipe carries standard output and standard error (stderr=STDOUT), so the two
arrive interleaved in the order the tool wrote them. Standard input is the JSON
arguments (then closed) or /dev/null. A single poll loop with a deadline writes
stdin and reads the output, so neither a tool that never reads its input nor
one that floods its output can block the worker; the loop wakes at least every
`TICK_SECONDS` to notice a cancel.

The command runs in its own process group and session: `start_new_session=True`
on the direct path (`run_process`, a `subprocess.Popen`, not `preexec_fn`), the
launcher's posix_spawn setsid on the launcher path (`launcher.LaunchedChild`).
`run_child` drives either through `Child` (pid, wait, kill_tree). The group's
leader is bwrap; its child is the sandbox's pid 1. Killing the group kills both,
and when a pid namespace's init dies the kernel kills every process in it, so
nothing the tool started survives (bwrap's `--die-with-parent` is a second line:
bwrap's death also SIGKILLs the child). A launcher lost mid-call raises OSError
from `Child.wait`, after its child was killed by pidfd; the loop drains the
output until every writer is gone, then lets it through.

Only what the model can be shown is kept (`keep_chars`); the rest is decoded
only to be counted, so a flood costs CPU, not memory. Past `hard_cap_bytes` of
output the tree is killed. A `watch` (the workspace watchdog, `watchdog.py`)
is asked at every turn of the loop, so at least every `TICK_SECONDS`; when it
says stop, the tree is killed (reason "limit").
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "TICK_SECONDS",
    "Child",
    "Drain",
    "Finished",
    "PopenChild",
    "Reason",
    "Spawn",
    "drive_child",
    "kill_tree",
    "run_child",
    "run_process",
    "start_child",
]

#: Longest the loop sleeps: how soon a cancel is noticed.
TICK_SECONDS = 0.05
_READ_SIZE = 1024 * 1024
_WRITE_SIZE = 64 * 1024
#: After a kill, how long to wait for the last writer of the pipe to go.
_AFTER_KILL_DRAIN_SECONDS = 1.0

Reason = Literal["exited", "timeout", "cancelled", "overflow", "limit"]


@dataclass(frozen=True, slots=True)
class Finished:
    """How the process ended and what it said."""

    reason: Reason
    #: bwrap's exit status: the tool's, or 128+N if the tool died of signal N.
    #: None when we killed it.
    returncode: int | None
    #: The first `keep_chars` characters of the combined output.
    text: str
    #: Characters after those, counted but not kept.
    dropped_chars: int
    total_bytes: int
    pid: int
    #: CPU seconds of the process tree (user + system of every process reaped
    #: in it), when the spawner reports them (a launcher does; None otherwise).
    cpu_seconds: float | None = None


class Child(Protocol):
    """A started process as the loop sees it: a `Popen` (direct path) or a launcher's child."""

    @property
    def pid(self) -> int: ...

    @property
    def cpu_seconds(self) -> float | None:
        """CPU seconds of its tree once reaped, if known."""

    def wait(self, timeout: float | None) -> int | None:
        """Its exit status, or None if it is still running after `timeout` seconds.

        May raise OSError (a launcher lost mid-call); the child is then killed.
        """

    def kill_tree(self) -> None:
        """SIGKILL its whole process group; a no-op once it is reaped. Never raises."""

    def close(self) -> None:
        """Release what the handle holds (a pidfd)."""


#: Starts the process given the read end of its stdin pipe (None: /dev/null) and
#: the write end of its output pipe (its fds 1 and 2); the loop closes both after.
Spawn = Callable[[int | None, int], Child]


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group led by `proc` (ignoring ESRCH); it must not be reaped yet."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


class PopenChild:
    """`Child` over a `subprocess.Popen` started with start_new_session=True."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def cpu_seconds(self) -> float | None:
        return None  # Popen reaps it without the rusage

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_tree(self) -> None:
        if self.proc.returncode is None:
            kill_tree(self.proc)

    def close(self) -> None:
        pass


class _Collector:
    """Decodes output as UTF-8 (errors replaced), keeps a prefix, counts the rest."""

    def __init__(self, keep_chars: int) -> None:
        self.keep_chars = keep_chars
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0
        self.total_bytes = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, *, final: bool = False) -> None:
        self.total_bytes += len(data)
        text = self._decoder.decode(data, final)
        room = self.keep_chars - self.kept
        if room > 0:
            head = text[:room]
            self.parts.append(head)
            self.kept += len(head)
            self.dropped += len(text) - len(head)
        else:
            self.dropped += len(text)

    def text(self) -> str:
        return "".join(self.parts)


@dataclass(frozen=True, kw_only=True, slots=True)
class Drain:
    """How long a call's output is read and what stops it early: the deadline
    (`timeout` seconds from the start of the drain), a `cancel`, output past
    `hard_cap_bytes`, or `watch()` returning True (reason "limit"). The first
    `keep_chars` characters of the output are kept, the rest counted."""

    timeout: float
    keep_chars: int
    hard_cap_bytes: int
    cancel: threading.Event | None = None
    watch: Callable[[], bool] | None = None


def run_process(
    argv: Sequence[str],
    *,
    stdin: bytes | None,
    env: Mapping[str, str],
    pass_fds: Sequence[int],
    drain: Drain,
) -> Finished:
    """`run_child` of `argv` started by `subprocess.Popen` (the direct path).

    Raises OSError only if the process cannot be started at all.
    """

    def popen(stdin_fd: int | None, out_fd: int) -> Child:
        return PopenChild(
            subprocess.Popen(
                list(argv),
                stdin=stdin_fd if stdin_fd is not None else subprocess.DEVNULL,
                stdout=out_fd,
                stderr=subprocess.STDOUT,
                env=dict(env),
                pass_fds=tuple(pass_fds),
                close_fds=True,
                start_new_session=True,
                cwd="/",  # nothing of the worker's working directory reaches bwrap
            )
        )

    return run_child(popen, stdin=stdin, drain=drain)


def run_child(
    spawn: Spawn,
    *,
    stdin: bytes | None,
    drain: Drain,
) -> Finished:
    """Run what `spawn` starts to its end, or to what `drain` stops it at, whichever
    comes first.

    Raises OSError if the process cannot be started, or if its launcher is lost
    mid-call (after killing what is left of it).
    """
    child, out_fd, in_fd = start_child(spawn, with_stdin=stdin is not None)
    return drive_child(child, out_fd, in_fd, stdin=stdin, drain=drain)


def start_child(spawn: Spawn, *, with_stdin: bool) -> tuple[Child, int, int | None]:
    """What `spawn` starts, with the read end of its output pipe and the write end
    of its stdin pipe (None: its stdin is /dev/null); OSError if it cannot start."""
    out_fd, child_out = os.pipe2(os.O_CLOEXEC)
    in_fd: int | None = None
    child_in: int | None = None
    try:
        if with_stdin:
            child_in, in_fd = os.pipe2(os.O_CLOEXEC)
        child = spawn(child_in, child_out)
    except BaseException:
        for fd in (out_fd, in_fd):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        # The child has its own copies: ours would keep the output open forever.
        os.close(child_out)
        if child_in is not None:
            os.close(child_in)
    return child, out_fd, in_fd


def drive_child(
    child: Child,
    out_fd: int,
    in_fd: int | None,
    *,
    stdin: bytes | None,
    drain: Drain,
) -> Finished:
    """`run_child`'s loop over a started child (`start_child`, or a standby's): it
    owns `out_fd` and `in_fd` from here and closes both."""
    deadline = time.monotonic() + drain.timeout
    cancel, watch = drain.cancel, drain.watch
    out = _Collector(drain.keep_chars)
    os.set_blocking(out_fd, False)
    poller = select.poll()
    poller.register(out_fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    pending = memoryview(stdin or b"")
    if in_fd is not None:
        os.set_blocking(in_fd, False)
        if pending:
            poller.register(in_fd, select.POLLOUT | select.POLLERR)
        else:
            os.close(in_fd)
            in_fd = None

    def close_stdin() -> None:
        nonlocal in_fd
        if in_fd is not None:
            with contextlib.suppress(OSError):
                poller.unregister(in_fd)
            with contextlib.suppress(OSError):
                os.close(in_fd)
            in_fd = None

    reason: Reason = "exited"
    returncode: int | None = None
    try:
        eof = False
        while not eof:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            for fd, event in poller.poll(min(remaining, TICK_SECONDS) * 1000):
                if fd == out_fd:
                    try:
                        chunk = os.read(out_fd, _READ_SIZE)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        eof = True
                        break
                    out.feed(chunk)
                elif fd == in_fd:
                    if event & (select.POLLERR | select.POLLHUP):
                        close_stdin()
                        continue
                    try:
                        written = os.write(in_fd, pending[:_WRITE_SIZE])
                    except BlockingIOError:
                        continue
                    except OSError as exc:  # EPIPE: the tool does not read its input
                        if exc.errno not in (errno.EPIPE, errno.EBADF):
                            raise
                        close_stdin()
                        continue
                    pending = pending[written:]
                    if not pending:
                        close_stdin()
            if out.total_bytes > drain.hard_cap_bytes:
                reason = "overflow"
                break
            if watch is not None and watch():
                reason = "limit"
                break
        close_stdin()
        if reason == "exited":
            # The output closed: every process of the sandbox is gone or going.
            # Wait for bwrap itself, still bounded by the deadline and the cancel.
            while (returncode := child.wait(TICK_SECONDS)) is None:
                if cancel is not None and cancel.is_set():
                    reason = "cancelled"
                    break
                if time.monotonic() >= deadline:
                    reason = "timeout"
                    break
        if reason != "exited":
            child.kill_tree()
            child.wait(None)
            _drain_after_kill(out_fd)
    except BaseException:
        child.kill_tree()
        with contextlib.suppress(OSError):
            child.wait(None)
        _drain_after_kill(out_fd)  # bounded: the tree is dead or dying
        raise
    finally:
        close_stdin()
        child.close()
        os.close(out_fd)
    out.feed(b"", final=True)
    return Finished(
        reason=reason,
        returncode=returncode if reason == "exited" else None,
        text=out.text(),
        dropped_chars=out.dropped,
        total_bytes=out.total_bytes,
        pid=child.pid,
        cpu_seconds=child.cpu_seconds,
    )


def _drain_after_kill(fd: int) -> None:
    """Read (and discard) until EOF: then no process of the call holds the pipe.

    Bounded: a kill is final, but the kernel tears a pid namespace down
    asynchronously; this waits for it so the caller sees the call's processes gone.
    """
    end = time.monotonic() + _AFTER_KILL_DRAIN_SECONDS
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return
        try:
            if not os.read(fd, _READ_SIZE):
                return
        except BlockingIOError:
            continue
        except OSError:
            return
