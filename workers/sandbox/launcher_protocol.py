"""The wire between a worker and its slot launchers (standard library only).

An AF_UNIX SOCK_SEQPACKET pair: one JSON message per datagram, fds passed as
SCM_RIGHTS. One call at a time per launcher:

- launcher -> worker, once at start: {"ready": pid, "network": bool, "refused": why}
  (or {"error": why});
- worker -> launcher: a request {"argv", "env", "stdin", "cpu_seconds", "share_net",
  "standby"} with the fds [output write end, bwrap --args memfd, --seccomp memfd,
  (stdin read end), (a standby's command pipe, read end: at STANDBY_FD in the
  child)] (a request too large for one datagram travels in a memfd: {"in_fd": true});
- launcher -> worker: {"pid": N} with a pidfd of the child (or {"error": why}),
  then {"exit": returncode, "cpu": seconds} once it is reaped (negative: killed
  by that signal, as `subprocess` reports it; cpu: its tree's CPU time);
- worker -> launcher: {"kill": true}: SIGKILL the child's process group, only
  while it is not reaped yet (so never a recycled pid).

Both sides import this module: the launcher process (`slot_launcher.py`) runs
with no site-packages, so nothing here may import beyond the standard library.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ARGS_FD",
    "INLINE_BYTES",
    "SECCOMP_FD",
    "STANDBY_FD",
    "Rlimits",
    "read_request",
    "recv_fds",
    "send",
]

#: (resource.RLIMIT_*, value) pairs, each set soft = hard (`Limits.rlimits`).
Rlimits = tuple[tuple[int, int], ...]

#: Where the child finds bwrap's --args memfd and its --seccomp memfd.
ARGS_FD = 3
SECCOMP_FD = 4
#: Where a standby sandbox's prefix reads its command from (`standby.py`).
STANDBY_FD = 5
#: Largest datagram sent as is; a larger request travels in a memfd.
INLINE_BYTES = 64 * 1024
_RECV_BYTES = INLINE_BYTES + 1024
_MAX_FDS = 8
_FD_BYTES = 4  # a C int


def send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """One message, with `fds` attached if any."""
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
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


def read_request(message: bytes, fds: list[int]) -> tuple[dict[str, Any], list[int]]:
    """A worker's request and its fds; one sent in a memfd (the last fd) is read from it."""
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
