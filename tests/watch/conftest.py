"""A small real cluster for the watching tests: the example records service, worker
processes started through `vessel-workers worker`, and Flower, all on free ports.

- `records`: examples/records_service.py as a subprocess; yields its base URL.
- `deployment`: a deployment in tmp_path with one agent, `watcher`, whose tools
  end every way a call can end: `echo` (ok), `fail` (exit 3), `slow` (timed
  out after 1 s), and `lookup`, a service tool on the records service.
- `cluster`: a factory that starts worker and Flower processes against the
  test's Redis database and stops them all (SIGTERM, then SIGKILL) at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from conftest import EXAMPLES, free_port

T = TypeVar("T")

BIN = Path(sys.executable).parent
RECORDS_TOKEN = "watch-records-token-0123456789"
AGENT = "watcher"
OWNER = "web/alice"

_PACKAGE_FILES = {
    "vessel.toml": """\
tool_timeout_seconds = 20
[tools]
declared = ["tools/echo.toml", "tools/fail.toml", "tools/slow.toml", "tools/lookup.toml"]
""",
    "tools/echo.toml": """\
name = "echo"
description = "Print the arguments back."
command = ["cat"]
""",
    "tools/fail.toml": """\
name = "fail"
description = "Always fails."
command = ["sh", "-c", "echo broken; exit 3"]
""",
    "tools/slow.toml": """\
name = "slow"
description = "Runs past its time limit."
command = ["sleep", "30"]
timeout_seconds = 1
""",
    "tools/lookup.toml": """\
name = "lookup"
description = "Look up a record by its id."
service = "records"
path = "/agent-tools/lookup"
[parameters]
type = "object"
required = ["id"]
[parameters.properties.id]
type = "string"
""",
}


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    explain: Callable[[], str] = str,
) -> T:
    """Call `probe` until it returns something other than None (or False)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (httpx.HTTPError, OSError, KeyError, ValueError) as exc:
            last, value = exc, None
        if value is not None and value is not False:
            return value
        time.sleep(0.2)
    reason = f" (last error: {last!r})" if last else ""
    pytest.fail(f"timed out after {timeout} s waiting for {what}{reason}\n{explain()}")


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


@dataclass
class Cluster:
    """Starts real processes against one Redis database; `close` stops them all."""

    redis_url: str
    folder: Path
    processes: list[Process] = field(default_factory=list)

    def _environ(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VESSEL_", "FLOWER_"))}
        env.pop("RECORDS_TOKEN", None)
        env.update({"VESSEL_BROKER_URL": self.redis_url, "PYTHONUNBUFFERED": "1"})
        env.update(extra)
        return env

    def _start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Process:
        log = self.folder / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.folder
            )
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def worker(
        self,
        kind: str,
        deployment: Path,
        *,
        metrics_port: int | None = None,
        extra: Sequence[str] = (),
    ) -> Process:
        """`vessel-workers worker KIND`, named `KIND-watch@<host>`."""
        argv = [str(BIN / "vessel-workers"), "worker", kind, "-d", str(deployment)]
        argv += ["--hostname", f"{kind}-watch@%h", "--concurrency", "2", "--loglevel", "INFO"]
        if metrics_port is not None:
            argv += ["--metrics-port", str(metrics_port)]
        argv += list(extra)
        env: dict[str, str] = {"VESSEL_WORKSPACE_ROOT": str(self.folder / f"workspaces-{kind}")}
        if kind == "service":  # only service workers hold the grants' secrets
            env["RECORDS_TOKEN"] = RECORDS_TOKEN
        return self._start(f"worker-{kind}", argv, self._environ(env))

    def flower(self, port: int, *options: str) -> Process:
        argv = [str(BIN / "celery"), "-A", "broker.celery_app", "flower"]
        argv += [f"--port={port}", "--address=127.0.0.1", *options]
        return self._start("flower", argv, self._environ({"FLOWER_UNAUTHENTICATED_API": "true"}))

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} (exit {p.popen.poll()}) ---\n{p.output()[-6000:]}"
            for p in self.processes
        )

    def close(self) -> None:
        for process in self.processes:
            process.stop()


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    built = Cluster(redis_url, tmp_path)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
def records(tmp_path: Path) -> Iterator[str]:
    """The example records service on a free port of 127.0.0.1."""
    port = free_port()
    log = tmp_path / "records.log"
    env = {**os.environ, "RECORDS_TOKEN": RECORDS_TOKEN, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "records_service.py"), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for(
            lambda: "listening on" in log.read_text(),
            timeout=15,
            what="the records service",
            explain=log.read_text,
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        popen.terminate()
        popen.wait(10)


@pytest.fixture
def deployment(tmp_path: Path, records: str) -> Path:
    """deployment.toml granting `watcher` the records service."""
    folder = tmp_path / "deploy"
    for name, text in _PACKAGE_FILES.items():
        path = folder / AGENT / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    path = folder / "deployment.toml"
    path.write_text(
        f"""\
[[agents]]
id = "{AGENT}"
package = "{AGENT}"
[agents.services.records]
url = "{records}"
headers = {{ "X-Internal-Token" = "env:RECORDS_TOKEN" }}
"""
    )
    return path


@pytest.fixture
def client(deployment: Path, redis_url: str) -> Iterator[Any]:
    """A platform's client of the cluster (broker.client.VesselClient)."""
    from broker.client import VesselClient
    from broker.config import Settings
    from broker.loading import load_deployment

    built = VesselClient(load_deployment(deployment), Settings(broker_url=redis_url))
    try:
        yield built
    finally:
        built.close()
        # Celery's Redis backend subscribes to a sent task's result channel unless
        # it is sent with ignore_result; the client polls instead, so close that
        # pubsub connection too (else it is left for the garbage collector).
        consumer = getattr(built.app.backend, "result_consumer", None)
        if consumer is not None:
            consumer.stop()
        built.app.close()
