"""One confined runtime process and its line protocol (js/runtime.mjs).

One JSON object per line each way. The worker side never blocks without a
deadline: `read` polls the process's stdout until the deadline, and a line
longer than `MAX_LINE_BYTES` (the runtime cuts results long before) ends the
process as a protocol error. `kill` SIGKILLs the process group (bwrap leads it;
its pid namespace takes node and every thread with it).

Memory: RLIMIT_DATA bounds everything the process maps writable (V8's heaps,
ArrayBuffers, thread stacks), which worker resourceLimits alone do not. Node
reserves a fixed amount up front (its code range, about 512 MB of untouched
RW mapping), so the limit is what `probe_data_bytes` measures for a process
with one idle isolate, plus the call's own limit, plus `DATA_MARGIN_BYTES`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from typing import IO, Any

from workers.plugin.confine import Confinement, node_argv, spawn_runtime

__all__ = [
    "DATA_MARGIN_BYTES",
    "MAX_LINE_BYTES",
    "ProtocolError",
    "RuntimeEnded",
    "RuntimeProcess",
    "probe_data_bytes",
    "run_once",
]

#: A line past this is not the runtime speaking (results are cut to the
#: agent's tool_output_chars in the isolate, host arguments are bounded by
#: the bridge): 32 MiB.
MAX_LINE_BYTES = 32 * 1024 * 1024
#: Room above the probe for the main thread's message buffers and the threads
#: V8 and libuv start later: 64 MiB.
DATA_MARGIN_BYTES = 64 * 1024 * 1024
_READ_SIZE = 1024 * 1024
#: How long `kill` waits for bwrap to be reaped.
_REAP_SECONDS = 5.0


class RuntimeEnded(OSError):
    """The runtime process ended (or closed its stdout)."""


class ProtocolError(OSError):
    """The runtime sent something that is not a protocol line."""


class RuntimeProcess:
    """A started runtime: send lines, read lines with a deadline, kill. One user at a time."""

    def __init__(self, popen: subprocess.Popen[bytes], stderr: IO[bytes]) -> None:
        self.popen = popen
        self._stderr = stderr
        self._buffer = bytearray()
        self._write_lock = threading.Lock()
        if popen.stdout is None or popen.stdin is None:
            raise ValueError(
                "RuntimeProcess: the runtime must be started with stdin and stdout pipes"
            )
        self._out = popen.stdout.fileno()
        os.set_blocking(self._out, False)
        self.calls = 0

    @classmethod
    def start(
        cls, confinement: Confinement, config: dict[str, Any], *, probe: bool = False
    ) -> RuntimeProcess:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (owned by the process object)
        try:
            argv = node_argv(json.dumps(config), probe=probe)
            return cls(spawn_runtime(confinement, argv, stderr=stderr), stderr)
        except BaseException:
            stderr.close()
            raise

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        """Write one line; RuntimeEnded if the process is gone."""
        data = json.dumps(message, ensure_ascii=False, allow_nan=False).encode() + b"\n"
        stdin = self.popen.stdin
        if stdin is None:  # checked at start; never closed here but by close()
            raise RuntimeEnded("the plugin runtime's stdin is closed")
        with self._write_lock:
            try:
                stdin.write(data)
                stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise RuntimeEnded("the runtime process ended") from exc

    def read(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None at the deadline; RuntimeEnded, ProtocolError."""
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                try:
                    message = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    raise ProtocolError("the runtime sent a line that is not JSON") from exc
                if not isinstance(message, dict):
                    raise ProtocolError("the runtime sent a line that is not an object")
                return message
            if len(self._buffer) > MAX_LINE_BYTES:
                raise ProtocolError(f"the runtime sent a line over {MAX_LINE_BYTES} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._out], [], [], min(left, 0.05))
            if not ready:
                continue
            try:
                chunk = os.read(self._out, _READ_SIZE)
            except BlockingIOError:
                continue
            if not chunk:
                raise RuntimeEnded("the runtime process ended")
            self._buffer += chunk

    def stderr_tail(self, size: int = 4096) -> str:
        """The end of what the process wrote to stderr (crash reports), for the worker's log."""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0, os.SEEK_END)
            end = self._stderr.tell()
            self._stderr.seek(max(0, end - size))
            return self._stderr.read().decode("utf-8", "replace")
        return ""

    def kill(self) -> None:
        """SIGKILL the whole process group and reap bwrap; never raises."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=_REAP_SECONDS)
        for stream in (self.popen.stdin, self.popen.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        with contextlib.suppress(OSError):
            self._stderr.close()


def run_once(
    confinement: Confinement, config: dict[str, Any], *, timeout: float, probe: bool = False
) -> dict[str, Any]:
    """Start a runtime in register or probe mode and return its one message.

    Raises RuntimeEnded / ProtocolError, or TimeoutError past `timeout`.
    """
    process = RuntimeProcess.start(confinement, config, probe=probe)
    try:
        try:
            message = process.read(time.monotonic() + timeout)
        except RuntimeEnded as exc:
            process.popen.wait(timeout=_REAP_SECONDS)
            tail = process.stderr_tail().strip().splitlines()
            why = tail[-1] if tail else f"exit status {process.popen.returncode}"
            raise RuntimeEnded(f"the runtime ended without an answer ({why})") from exc
        if message is None:
            raise TimeoutError(f"the runtime did not answer within {timeout:g} s")
        return message
    finally:
        process.kill()


def probe_data_bytes(confinement: Confinement, *, heap_mb: int, timeout: float = 30.0) -> int:
    """What a runtime process maps writable with one idle isolate up, in bytes.

    `confinement.data_bytes` must leave room for the probe itself.
    """
    config = {"mode": "probe", "root": "/plugin", "sources": [], "heapMb": heap_mb}
    message = run_once(confinement, config, timeout=timeout, probe=True)
    found = message.get("vmDataKb")
    if message.get("op") != "probe" or not isinstance(found, int) or found <= 0:
        raise ProtocolError(f"the runtime's probe answered {message!r}")
    return found * 1024
