"""A private redis-server on a free port: how the tests and the benchmark start one.

One definition of the command line (bound to 127.0.0.1, no persistence,
`maxmemory-policy noeviction` unless a caller wants another, as a worker
requires) and of the wait until it answers, so a test's Redis and the bench's
are the same server. Stdlib and redis-py only: tests/conftest.py imports it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import redis

__all__ = [
    "RedisServer",
    "RedisServerError",
    "free_port",
    "redis_server_argv",
    "start_redis_server",
    "wait_until_answering",
]

#: How long a fresh redis-server gets to answer PING (it takes milliseconds unloaded).
START_SECONDS = 10.0


class RedisServerError(RuntimeError):
    """redis-server is missing, or did not start."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_argv(
    port: int,
    folder: Path,
    *,
    policy: str = "noeviction",
    databases: int = 16,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of a private redis-server on `port`, its files in `folder`."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerError(
            "redis-server is not installed: run .ci/run or apt-get install redis-server"
        )
    return [
        *(binary, "--port", str(port), "--bind", "127.0.0.1"),
        *("--save", "", "--appendonly", "no", "--maxmemory-policy", policy),
        *("--databases", str(databases), "--dir", str(folder), *extra),
    ]


def wait_until_answering(
    proc: subprocess.Popen[bytes],
    port: int,
    *,
    password: str | None = None,
    tls: bool = False,
    seconds: float = START_SECONDS,
) -> None:
    """Return once the server on `port` answers (a password demand is an answer);
    `tls`: over TLS, any certificate accepted.

    Kills it and raises RedisServerError if it exits or stays silent for `seconds`.
    """
    client = (
        redis.Redis(port=port, password=password, ssl=True, ssl_cert_reqs="none")
        if tls
        else redis.Redis(port=port, password=password)
    )
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                client.ping()
                return
            except redis.AuthenticationError:
                return  # it answers: it wants a password
            except redis.ConnectionError:
                if proc.poll() is not None:
                    raise RedisServerError(
                        f"redis-server on port {port} exited with status {proc.returncode}"
                    ) from None
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise RedisServerError(
                        f"redis-server on port {port} did not answer within {seconds:g} s"
                    ) from None
                time.sleep(0.02)
    finally:
        client.close()


@dataclass(frozen=True)
class RedisServer:
    """A started redis-server; `stop` ends it."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        """Its base URL, no database: `redis://127.0.0.1:PORT`."""
        return f"redis://127.0.0.1:{self.port}"

    def stop(self, seconds: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `seconds`."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(seconds)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_redis_server(
    folder: Path,
    *,
    policy: str = "noeviction",
    databases: int = 16,
    extra: Sequence[str] = (),
    password: str | None = None,
    output: IO[bytes] | int = subprocess.DEVNULL,
) -> RedisServer:
    """Start a private redis-server on a free port and wait until it answers."""
    port = free_port()
    argv = redis_server_argv(port, folder, policy=policy, databases=databases, extra=extra)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output)
    wait_until_answering(proc, port, password=password)
    return RedisServer(proc=proc, port=port)
