"""Cluster fixtures: a Redis of the module's own, a deployment written into a temp
folder, a real HTTP server on 127.0.0.1 that records every request, and real
worker processes started through `python -m workers.cli worker …`.

Workers are shared by the tests of a module (starting one costs about a second
on two cores); tests keep apart by agent, turn and call ids, never by flushing
Redis under live workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.redis_server import start_redis_server
from broker.client import VesselClient
from broker.config import Settings
from broker.loading import load_deployment

REPO = Path(__file__).resolve().parents[2]

# Small timings so crashes are noticed within seconds (defaults: 30 s grace, 2 s beats).
CLUSTER_ENV = {
    "VESSEL_LEASE_GRACE_SECONDS": "1",
    "VESSEL_HEARTBEAT_SECONDS": "0.5",
    "VESSEL_SWEEP_SECONDS": "0.5",
    "PYTHONUNBUFFERED": "1",
}


def start_redis(folder: Path, *, policy: str = "noeviction") -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server (bench.redis_server) and the URL of its database 0."""
    server = start_redis_server(folder, policy=policy)
    return server.proc, f"{server.url}/0"


# --- the recording HTTP server ------------------------------------------------------


@dataclass
class Record:
    agent: str
    n: Any
    start: float
    end: float = 0.0


@dataclass
class Recorder:
    """What the server saw: every request in arrival order, and concurrency per agent."""

    records: list[Record] = field(default_factory=list)
    running: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, n: Any) -> int:
        with self.lock:
            return sum(1 for r in self.records if r.n == n)

    def finished(self) -> list[Record]:
        with self.lock:
            return sorted((r for r in self.records if r.end), key=lambda r: r.end)


def serve(recorder: Recorder) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            agent = self.headers.get("X-Vessel-Agent", "")
            record = Record(agent=agent, n=body.get("n"), start=time.monotonic())
            with recorder.lock:
                recorder.records.append(record)
                recorder.running[agent] = recorder.running.get(agent, 0) + 1
                recorder.peak[agent] = max(recorder.peak.get(agent, 0), recorder.running[agent])
            try:
                time.sleep(float(body.get("sleep", 0)))
                answer = json.dumps(
                    {
                        "n": body.get("n"),
                        "owner": self.headers.get("X-Vessel-Owner"),
                        "agent": agent,
                        "tool": self.headers.get("X-Vessel-Tool"),
                    }
                ).encode()
            finally:
                with recorder.lock:
                    recorder.running[agent] -= 1
                    record.end = time.monotonic()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
            except OSError:  # the caller was killed mid-call: that is the test
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --- the deployment -----------------------------------------------------------------

SERVICE_TOOL = """\
name = "work"
description = "Ask the test server to do some work."
service = "app"
path = "/work"
timeout_seconds = {timeout}
[parameters]
type = "object"
"""

ECHO_PY = """\
import json, sys
print(json.dumps({"got": json.load(sys.stdin)}))
"""

# Starts a grandchild whose argv carries a marker the host can find in /proc.
SPIN_PY = """\
import json, subprocess, sys, time
args = json.load(sys.stdin)
subprocess.Popen(["sleep", args["marker"]])
print("spinning", flush=True)
time.sleep(600)
"""

# Leaves a mark in the turn's workspace (a host folder) before doing its work, so
# the host can count how many times the tool started.
COUNT_PY = """\
import json, os, sys, time
args = json.load(sys.stdin)
with open(os.path.join(os.environ["HOME"], "runs.log"), "a") as log:
    log.write(f"{args['n']}\\n")
subprocess_marker = args.get("marker")
if subprocess_marker:
    import subprocess
    subprocess.Popen(["sleep", subprocess_marker])
time.sleep(float(args.get("sleep", 0)))
print("counted", args["n"])
"""


# Works in the turn's workspace: writes the files it is given (folders made as
# needed), makes the links it is given, reads the files it is asked for (null
# when missing), appends "start/end <time>" lines to a log.
WS_PY = """\
import json, os, sys, time
args = json.load(sys.stdin)
home = os.environ["HOME"]
log = args.get("log")
def mark(what):
    if log:
        with open(os.path.join(home, log), "a") as f:
            f.write(f"{what} {time.time()}\\n")
mark("start")
for name, text in args.get("write", {}).items():
    os.makedirs(os.path.dirname(os.path.join(home, name)), exist_ok=True)
    with open(os.path.join(home, name), "w") as f:
        f.write(text)
for name, target in args.get("link", {}).items():
    os.symlink(target, os.path.join(home, name))
seen = {}
for name in args.get("read", []):
    try:
        with open(os.path.join(home, name)) as f:
            seen[name] = f.read()
    except FileNotFoundError:
        seen[name] = None
time.sleep(float(args.get("sleep", 0)))
mark("end")
print(json.dumps({"read": seen, "files": sorted(os.listdir(home))}))
"""


def _declared(name: str, script: str, timeout: float) -> str:
    return (
        f'name = "{name}"\ndescription = "{name} (test tool)"\n'
        f'command = ["python3", "{{package}}/tools/{script}"]\n'
        f'timeout_seconds = {timeout}\n[parameters]\ntype = "object"\n'
    )


def write_deployment(
    folder: Path, server_port: int, agents: dict[str, dict[str, Any]], *, timeout: float = 5
) -> Path:
    """Agents named `svc…` get the service tool `work`, others the declared tools."""
    svc = folder / "svcpkg"
    (svc / "tools").mkdir(parents=True)
    (svc / "vessel.toml").write_text(
        f'tool_timeout_seconds = {timeout}\n[tools]\ndeclared = ["tools/work.toml"]\n'
    )
    (svc / "tools" / "work.toml").write_text(SERVICE_TOOL.format(timeout=timeout))
    box = folder / "boxpkg"
    (box / "tools").mkdir(parents=True)
    (box / "vessel.toml").write_text(
        f"tool_timeout_seconds = {timeout}\n"
        '[tools]\ndeclared = ["tools/echo.toml", "tools/spin.toml", "tools/count.toml", '
        '"tools/ws.toml"]\n'
    )
    for name, script, body in (
        ("echo", "echo.py", ECHO_PY),
        ("spin", "spin.py", SPIN_PY),
        ("count", "count.py", COUNT_PY),
        ("ws", "ws.py", WS_PY),
    ):
        (box / "tools" / script).write_text(body)
        (box / "tools" / f"{name}.toml").write_text(_declared(name, script, timeout))
    (folder / "data").mkdir()
    lines = []
    for agent_id, options in agents.items():
        service = agent_id.startswith("svc")
        lines.append(
            f'[[agents]]\nid = "{agent_id}"\npackage = "{"svcpkg" if service else "boxpkg"}"'
        )
        if "max_concurrent_calls" in options:
            lines.append(f"max_concurrent_calls = {options['max_concurrent_calls']}")
        if service:
            lines.append(f'[agents.services.app]\nurl = "http://127.0.0.1:{server_port}"')
        else:
            lines.append('[agents.mounts]\n"/data" = "data"')
        lines.append("")
    path = folder / "deployment.toml"
    path.write_text("\n".join(lines))
    return path


def check_deployment(path: Path) -> None:
    """`vessel-workers check` on the deployment: it writes each plugin's lock,
    without which a plugin worker refuses to start."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "check", "-d", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def cluster_env(url: str, workspaces: Path, **extra: str) -> dict[str, str]:
    """The environment of a cluster's workers and clients: this one's, with the
    small timings, the broker and the workspace root."""
    env = {k: v for k, v in os.environ.items() if k != "VESSEL_RESULT_BACKEND"}
    env.update(CLUSTER_ENV)
    env.update(extra)
    env["VESSEL_BROKER_URL"] = url
    env["VESSEL_WORKSPACE_ROOT"] = str(workspaces)
    return env


# --- worker processes ----------------------------------------------------------------


@dataclass
class Cluster:
    """One Redis, one deployment, the server's recorder and the workers started."""

    url: str
    deployment_path: Path
    env: dict[str, str]
    recorder: Recorder
    workspaces: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)
    _redis: redis.Redis[str] | None = None

    @property
    def redis(self) -> redis.Redis[str]:
        if self._redis is None:
            self._redis = redis.Redis.from_url(self.url, decode_responses=True)
        return self._redis

    def client(self) -> VesselClient:
        return VesselClient(load_deployment(self.deployment_path), Settings.from_environ(self.env))

    def start_worker(
        self,
        kind: str,
        *args: str,
        name: str,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        log = open(self.workspaces.parent / f"{name}.log", "wb")  # noqa: SIM115
        self.logs.append(log)
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "workers.cli", "worker", kind),
                *("-d", str(self.deployment_path), "--hostname", f"{name}@%h", "-l", "WARNING"),
                *args,
            ],
            env={**self.env, **(env or {})},
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill it whole
        )
        self.procs.append(proc)
        if wait:
            self.wait_registered(name, proc)
        return proc

    def start_host(
        self, host: str, *args: str, wait: bool = True, set_id: bool = True
    ) -> subprocess.Popen[bytes]:
        """A sandbox worker that is a host of its own: its own VESSEL_HOST_ID and
        workspace root (`root_of(host)`), as on a machine of its own. `set_id`
        False leaves VESSEL_HOST_ID unset: the worker derives it from the root."""
        root = self.root_of(host)
        root.mkdir(exist_ok=True)
        env = {"VESSEL_WORKSPACE_ROOT": str(root)}
        if set_id:
            env["VESSEL_HOST_ID"] = host
        else:
            env["VESSEL_HOST_ID"] = ""
        return self.start_worker("sandbox", *args, name=host, wait=wait, env=env)

    def root_of(self, host: str) -> Path:
        return self.workspaces.parent / f"root-{host}"

    def wait_registered(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        """Until the worker's heartbeat is in Redis and Celery consumes its lanes."""
        client = self.redis
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"worker {name} exited with {proc.returncode}")
            hosts = [
                h
                for key in client.keys("vessel:workers:*")
                for h in client.hkeys(key)
                if h.startswith(f"{name}@")
            ]
            ready = client.keys("_kombu.binding.vessel.*")
            if hosts and ready:
                return
            time.sleep(0.1)
        raise AssertionError(f"worker {name} did not register within 30 s")

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(30)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill(proc)
        for log in self.logs:
            log.close()
        if self._redis is not None:
            self._redis.close()


def files_named(root: Path, pattern: str) -> list[Path]:
    """Files under `root` whose name matches `pattern` (fnmatch). os.walk, not
    rglob: workers replace their /etc stage and remove workspaces while a test
    looks, and a folder gone meanwhile is skipped, not an error."""
    import fnmatch

    return [
        Path(folder) / name
        for folder, _dirs, files in os.walk(root)
        for name in fnmatch.filter(files, pattern)
    ]


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv:
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def make_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., Cluster]]:
    """`make_cluster(agents, **env)`: a Redis, a server, a deployment; workers on demand."""
    made: list[tuple[Cluster, subprocess.Popen[bytes], ThreadingHTTPServer]] = []

    def make(agents: dict[str, dict[str, Any]], *, timeout: float = 5, **extra: str) -> Cluster:
        folder = tmp_path_factory.mktemp("cluster")
        redis_proc, url = start_redis(folder)
        recorder = Recorder()
        server = serve(recorder)
        deployment = write_deployment(folder, server.server_address[1], agents, timeout=timeout)
        workspaces = folder / "workspaces"
        env = cluster_env(url, workspaces, **extra)
        cluster = Cluster(
            url=url, deployment_path=deployment, env=env, recorder=recorder, workspaces=workspaces
        )
        made.append((cluster, redis_proc, server))
        return cluster

    yield make
    for cluster, redis_proc, server in made:
        cluster.stop_all()
        server.shutdown()
        server.server_close()
        redis_proc.terminate()
        redis_proc.wait(10)
