"""The processes a bench run needs, started on free ports and always torn down.

A `Cluster` starts a private redis-server, the local HTTP server for service
calls, vessel-workers workers (`vessel-workers worker sandbox|service`) and the
raw Celery baseline workers, each as its own process group, with its output in
a log file under the run's folder. `close()` (also on error, Ctrl-C or SIGTERM,
via the context manager) stops every group it started, and only those.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from bench.baselines import RAW_BROKER_ENV, RAW_SERVICE_URL_ENV
from bench.cpu_account import CpuAccount
from bench.memory import count_cpu_in
from bench.redis_server import RedisServerError, free_port, redis_server_argv, wait_until_answering

__all__ = ["Cluster", "ClusterError", "Proc", "free_port"]

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
#: Seconds a worker gets to finish its running calls on SIGTERM before SIGKILL.
_STOP_GRACE_SECONDS = 10.0


class ClusterError(RuntimeError):
    """A process of the cluster did not start or died."""


@dataclass(kw_only=True)
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    argv: list[str] = field(default_factory=list)
    #: The cgroup counting its CPU time and its descendants' (None: none made).
    account: CpuAccount | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if not self.alive():
            raise ClusterError(
                f"{self.name} exited with status {self.popen.returncode}; "
                f"last lines of {self.log}:\n{self.log_tail()}"
            )


class Cluster:
    """Owns every process it starts; use as a context manager."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self._procs: list[Proc] = []
        self.redis_port: int | None = None

    # --- lifecycle -----------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        counted: bool = False,
    ) -> Proc:
        """`counted`: in a cgroup of its own where one can be made, so that its CPU
        time counts every process it starts (`bench.cpu_account`)."""
        log = self.folder / f"{name}.log"
        account = CpuAccount.make(name) if counted else None
        command = list(argv) if account is None else account.wrap(argv)
        with log.open("wb") as out:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                # Its own process group, so close() can stop the worker and its
                # pool children together without touching anything else.
                start_new_session=True,
            )
        proc = Proc(name=name, popen=popen, log=log, argv=list(argv), account=account)
        if account is not None:
            count_cpu_in(popen.pid, account)
        self._procs.append(proc)
        return proc

    def pid_of(self, name: str) -> int:
        for proc in self._procs:
            if proc.name == name:
                return proc.pid
        raise ClusterError(f"no process {name!r} in this cluster")

    def stop(self, proc: Proc) -> None:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(_STOP_GRACE_SECONDS)
        # Pool children may outlive a dead parent: finish the whole group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(5)
        if proc in self._procs:
            self._procs.remove(proc)
        if proc.account is not None:
            count_cpu_in(proc.pid, None)
            proc.account.remove()

    def close(self) -> None:
        # Workers first (they need Redis to shut down cleanly), Redis last.
        for proc in reversed(list(self._procs)):
            self.stop(proc)

    # --- the parts -------------------------------------------------------------

    def start_redis(self) -> str:
        """A redis-server of our own (noeviction, no persistence); its base URL."""
        port = free_port()
        data = self.folder / "redis"
        data.mkdir(exist_ok=True)
        try:
            proc = self._spawn("redis", redis_server_argv(port, data))
            wait_until_answering(proc.popen, port)
        except RedisServerError as exc:
            raise ClusterError(f"{exc}; see {self.folder / 'redis.log'}") from None
        self.redis_port = port
        return f"redis://127.0.0.1:{port}"

    def redis_url(self, db: int) -> str:
        if self.redis_port is None:
            raise ClusterError("start_redis() first")
        return f"redis://127.0.0.1:{self.redis_port}/{db}"

    def start_httpd(self) -> str:
        """The local service the service calls post to; its base URL."""
        port = free_port()
        proc = self._spawn("httpd", [sys.executable, "-m", "bench.httpd", str(port)])

        def answering() -> bool:
            with socket.socket() as s:
                s.settimeout(0.5)
                return s.connect_ex(("127.0.0.1", port)) == 0

        self._wait(answering, proc, "bench.httpd", 10)
        return f"http://127.0.0.1:{port}"

    def start_vessel_worker(
        self,
        name: str,
        kind: str,
        *,
        deployment: Path,
        broker_url: str,
        options: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> Proc:
        """`vessel-workers worker KIND -d DEPLOYMENT OPTIONS…` against `broker_url`."""
        workspaces = self.folder / f"workspaces-{name}"
        workspaces.mkdir(exist_ok=True)
        argv = [
            str(VENV_BIN / "vessel-workers"),
            "worker",
            kind,
            "-d",
            str(deployment),
            *options,
        ]
        return self._spawn(
            name,
            argv,
            env={
                "VESSEL_BROKER_URL": broker_url,
                "VESSEL_RESULT_BACKEND": broker_url,
                "VESSEL_WORKSPACE_ROOT": str(workspaces),
                **(env or {}),
            },
            counted=True,
        )

    def start_vessel_mcp(
        self,
        name: str,
        agent: str,
        *,
        deployment: Path,
        broker_url: str,
        address: str,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """`vessel-workers mcp AGENT --http ADDRESS -d DEPLOYMENT` against `broker_url`."""
        argv = [
            str(VENV_BIN / "vessel-workers"),
            "mcp",
            agent,
            "--http",
            address,
            "-d",
            str(deployment),
        ]
        return self._spawn(
            name,
            argv,
            env={
                "VESSEL_BROKER_URL": broker_url,
                "VESSEL_RESULT_BACKEND": broker_url,
                **(env or {}),
            },
        )

    def start_raw_worker(
        self,
        name: str,
        *,
        broker_url: str,
        queue: str,
        pool: str,
        concurrency: int,
        service_url: str = "",
    ) -> Proc:
        """The baseline: `celery -A bench.baselines:raw_app worker` on one queue."""
        argv = [
            str(VENV_BIN / "celery"),
            "-A",
            "bench.baselines:raw_app",
            "worker",
            "-Q",
            queue,
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--hostname",
            f"{name}@%h",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
        ]
        return self._spawn(
            name,
            argv,
            env={RAW_BROKER_ENV: broker_url, RAW_SERVICE_URL_ENV: service_url},
            counted=True,
        )

    # --- waiting -------------------------------------------------------------

    @staticmethod
    def _wait(check: Callable[[], bool], proc: Proc, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            proc.check_alive()
            try:
                if check():
                    return
            except Exception as exc:  # not up yet: keep trying until the deadline
                last = exc
            time.sleep(0.05)
        raise ClusterError(
            f"{what} not ready after {timeout:.0f} s (last error: {last!r}); "
            f"last lines of {proc.log}:\n{proc.log_tail()}"
        )

    def wait_ready(
        self, check: Callable[[], bool], procs: Sequence[Proc], what: str, timeout: float = 60
    ) -> None:
        """Until `check()` (a real round trip) succeeds, failing early if a process dies."""
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            for proc in procs:
                proc.check_alive()
            try:
                if check():
                    return
            except Exception as exc:  # not up yet: keep trying until the deadline
                last = exc
            time.sleep(0.1)
        tails = "\n".join(f"--- {p.log}:\n{p.log_tail()}" for p in procs)
        raise ClusterError(f"{what} not ready after {timeout:.0f} s (last: {last!r})\n{tails}")
