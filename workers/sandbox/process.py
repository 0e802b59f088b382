"""Spawn the confined command, feed and drain it, and kill its whole tree.

One pipe carries standard output and standard error (stderr=STDOUT), so the two
arrive interleaved in the order the tool wrote them. Standard input is the JSON
arguments (then closed) or /dev/null. A single poll loop with a deadline writes
stdin and reads the output, so neither a tool that never reads its input nor
one that floods its output can block the worker; the loop wakes at least every
`TICK_SECONDS` to notice a cancel.

The command runs in its own process group (`start_new_session=True`, not
`preexec_fn`). The group's leader is bwrap; its child is the sandbox's pid 1.
`killpg(SIGKILL)` kills both, and when a pid namespace's init dies the kernel
kills every process in it, so nothing the tool started survives (bwrap's
`--die-with-parent` is a second line: bwrap's death also SIGKILLs the child).

Only what the model can be shown is kept (`keep_chars`); the rest is decoded
only to be counted, so a flood costs CPU, not memory. Past `hard_cap_bytes` of
output the tree is killed.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "TICK_SECONDS",
    "Finished",
    "Reason",
    "kill_tree",
    "run_process",
]

#: Longest the loop sleeps: how soon a cancel is noticed.
TICK_SECONDS = 0.05
_READ_SIZE = 1024 * 1024
_WRITE_SIZE = 64 * 1024
#: After a kill, how long to wait for the last writer of the pipe to go.
_AFTER_KILL_DRAIN_SECONDS = 1.0

Reason = Literal["exited", "timeout", "cancelled", "overflow"]


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


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group led by `proc` (ignoring ESRCH); it must not be reaped yet."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


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


def run_process(
    argv: Sequence[str],
    *,
    stdin: bytes | None,
    env: Mapping[str, str],
    pass_fds: Sequence[int],
    timeout: float,
    keep_chars: int,
    hard_cap_bytes: int,
    cancel: threading.Event | None = None,
) -> Finished:
    """Run `argv` to its end, the deadline, a cancel or the output cap, whichever comes first.

    Raises OSError only if the process cannot be started at all.
    """
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        pass_fds=tuple(pass_fds),
        close_fds=True,
        start_new_session=True,
        cwd="/",  # nothing of the worker's working directory reaches bwrap
    )
    deadline = time.monotonic() + timeout
    out = _Collector(keep_chars)
    assert proc.stdout is not None
    out_fd = proc.stdout.fileno()
    os.set_blocking(out_fd, False)
    poller = select.poll()
    poller.register(out_fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    in_fd: int | None = None
    pending = memoryview(stdin or b"")
    if proc.stdin is not None:
        in_fd = proc.stdin.fileno()
        os.set_blocking(in_fd, False)
        if pending:
            poller.register(in_fd, select.POLLOUT | select.POLLERR)
        else:
            proc.stdin.close()
            in_fd = None

    def close_stdin() -> None:
        nonlocal in_fd
        if in_fd is not None:
            with contextlib.suppress(OSError):
                poller.unregister(in_fd)
            assert proc.stdin is not None
            with contextlib.suppress(OSError):
                proc.stdin.close()
            in_fd = None

    reason: Reason = "exited"
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
            if out.total_bytes > hard_cap_bytes:
                reason = "overflow"
                break
        close_stdin()
        if reason == "exited":
            # The output closed: every process of the sandbox is gone or going.
            # Wait for bwrap itself, still bounded by the deadline and the cancel.
            while True:
                try:
                    proc.wait(timeout=TICK_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    if cancel is not None and cancel.is_set():
                        reason = "cancelled"
                        break
                    if time.monotonic() >= deadline:
                        reason = "timeout"
                        break
        if reason != "exited":
            kill_tree(proc)
            proc.wait()
            _drain_after_kill(out_fd)
    except BaseException:
        kill_tree(proc)
        proc.wait()
        raise
    finally:
        close_stdin()
        proc.stdout.close()
    out.feed(b"", final=True)
    return Finished(
        reason=reason,
        returncode=proc.returncode if reason == "exited" else None,
        text=out.text(),
        dropped_chars=out.dropped,
        total_bytes=out.total_bytes,
        pid=proc.pid,
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
