"""One declared call, confined: the runner the sandbox worker uses.

    slot launcher (in its slot's cgroups; the call's rlimits are its own)
        -> posix_spawn bwrap (namespaces, mounts, --args memfd, --seccomp memfd)
        -> /usr/bin/perl -e <Landlock prefix> -- the tool's command (landlock.py)

A call takes a launcher from this process's pool (`launcher.py`; the pool grows
to the number of calls at once) and gives it back after; the launcher's slot
cgroups carry the call's caps (memory.limit_in_bytes set per call, pids.max =
PIDS_MAX + the launcher), so no cgroup is made, joined or removed per call.
Where no launcher can be started, the direct path stays: `/bin/sh` (ulimit:
rlimits; joins a fresh per-call cgroup where cgroups are on and writable) ->
bwrap, started by `subprocess.Popen`. `cgroup_mode` (the start-up log) says
which path and which cgroups are in force.

Cgroups: `SandboxRunner(..., cgroups=CgroupSettings(mode=...))`, by default
`$VESSEL_SANDBOX_CGROUPS` read once here: `per-call` (default; pids, memory and cpu
caps per call where a v1 hierarchy is writable: a slot's on the launcher path,
a fresh cgroup's on the direct path) or `off` (none: the rlimits, RLIMIT_NPROC
for a non-root worker, the pid namespace and the timeout hold; see `limits.py`
and `cgroup.py`). Launchers are used in both modes.

The turn's workspace and the call's outbox are measured before the call (past
workspace_limit_mb or workspace_files: not run) and while it runs, from the poll
loop (`watchdog.py`: past a limit, the tree is killed). `cpu_limit` is a CPU
quota where a `cpu` hierarchy is writable, and RLIMIT_CPU everywhere (`limits.py`).

Whose uid: a root worker's calls run as the sandbox uid (`identity.py`,
`VESSEL_SANDBOX_UID`), never host root: the launcher drops to it, the direct
path's wrapper executes bwrap through `setpriv`. The package folder and data
mounts must be readable by that uid; a call whose are not gets a clear error
(`_unreachable_text`), not bwrap's. A worker that is not root runs calls as
itself, as before.

The staged /etc (`_system_dir`) is one folder per worker process,
`.system/etc-<random>`, marked as that process's by an flock on
`.system/etc-<random>.lock` held for its life: no pid in a name a call can
read in its mount table. A starting worker removes the stages whose lock no
one holds (their worker is gone); `close` removes its own.

`run` never raises for anything a tool does: every outcome is a `ToolResult`;
a launcher lost mid-call is a `[sandbox error: launcher lost ...]` and is
replaced. It is safe from many threads at once (every call has its own
descriptors, process group and launcher; nothing mutable is shared but the
pool and counters under locks) and from prefork children (a child makes a pool
of its own; it never uses its parent's launchers). `close()` stops the launchers
and removes their slot cgroups.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from broker.constants import (
    DEFAULT_CPU_LIMIT,
    DEFAULT_DISK_LIMIT_MB,
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_TOOL_OUTPUT_CHARS,
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    DEFAULT_WORKDIR,
    PACKAGE_PATH,
    SANDBOX_HOME,
)
from broker.model import Agent, AgentSettings, DeclaredTool
from broker.protocol import CANCELLED_TEXT, ToolResult, format_seconds
from workers.arguments import args_flags
from workers.output import cut_output
from workers.sandbox import seccomp
from workers.sandbox.bwrap import (
    COMMAND_PREFIX,
    Layout,
    bwrap_options,
    spawn_env,
    stage_etc,
)
from workers.sandbox.cgroup import CallCgroup, CgroupSettings, CgroupSupport, wrapper_argv
from workers.sandbox.identity import ENV_SANDBOX_UID, unreachable
from workers.sandbox.launcher import (
    ARGS_FD,
    SECCOMP_FD,
    Launcher,
    LauncherPool,
    LauncherUnavailable,
)
from workers.sandbox.limits import MIB, Limits, restrict_worker_msgqueue
from workers.sandbox.outbox import DEFAULT_OUTBOX_CAP_BYTES, collect_outbox, ensure_mount_point
from workers.sandbox.process import Child, Finished, run_child, run_process
from workers.sandbox.watchdog import Usage, WorkspaceWatch
from workers.sandbox.workspace import WorkspaceStore, remove_tree

__all__ = [
    "DEFAULT_OUTPUT_HARD_CAP_BYTES",
    "SandboxRunner",
    "cpu_limit_text",
    "timed_out_text",
    "workspace_limit_text",
]

#: Total output bytes after which a call is killed: 64 MiB. Past
#: tool_output_chars (20,000 by default) the output is only counted; 64 MiB is
#: far beyond any useful result and bounds the CPU a flood can spend decoding.
DEFAULT_OUTPUT_HARD_CAP_BYTES = 64 * 1024 * 1024

_SIGNAL_BASE = 128  # bwrap reports a command killed by signal N as exit status 128+N
#: Set-up errors printed before the tool's command ran (bwrap's, the direct
#: path's wrapper's, a launcher child's): they may name host paths.
_SETUP_ERROR_PREFIXES = ("bwrap: ", "sh: ", "launcher: ")

_log = logging.getLogger(__name__)


def timed_out_text(seconds: float) -> str:
    """Seed 000: `[timed out after N s]`."""
    return f"[timed out after {format_seconds(seconds)} s]"


def workspace_limit_text(usage: Usage, settings: AgentSettings, *, started: bool) -> str:
    """The turn's workspace passed workspace_limit_mb or workspace_files (`watchdog.py`):
    `[the turn's workspace passed its limit of 1024 MB: the tool was stopped]`, `... of
    100000 files ...`; before the call (`started` False) `...: the tool was not run]`."""
    end = "the tool was stopped" if started else "the tool was not run"
    if usage.breach == "size":
        return f"[the turn's workspace passed its limit of {settings.workspace_limit_mb} MB: {end}]"
    if usage.breach == "files":
        return f"[the turn's workspace passed its limit of {settings.workspace_files} files: {end}]"
    return f"[the turn's workspace cannot be measured ({usage.problem}): {end}]"


def cpu_limit_text(seconds: int) -> str:
    """A process used its RLIMIT_CPU (timeout x cpu_limit, `limits.py`):
    `[stopped after N s of CPU time: the tool's CPU limit]`."""
    return f"[stopped after {seconds} s of CPU time: the tool's CPU limit]"


def _signal_name(returncode: int) -> str | None:
    number = returncode - _SIGNAL_BASE
    if not 0 < number < signal.NSIG:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def _default_limits() -> Limits:
    """The rlimits of an agent with the default settings."""
    return Limits.for_agent(
        AgentSettings(
            workdir=DEFAULT_WORKDIR,
            tool_timeout_seconds=DEFAULT_TOOL_TIMEOUT_SECONDS,
            tool_output_chars=DEFAULT_TOOL_OUTPUT_CHARS,
            disk_limit_mb=DEFAULT_DISK_LIMIT_MB,
            memory_limit_mb=DEFAULT_MEMORY_LIMIT_MB,
        )
    )


#: A SIGKILL counts as the CPU limit's (a process that ignored SIGXCPU) when the
#: tree's CPU time is past RLIMIT_CPU's soft limit by this much, half-way to the
#: hard one: the rusage read here runs a few percent under the kernel's precise
#: count (1.95 s for a kill at 2 s), and other processes of the tree add to it.
_CPU_KILL_PAST_SOFT_SECONDS = 0.5


def _hit_cpu_limit(signal_name: str, finished: Finished, limits: Limits) -> int | None:
    """The CPU seconds at which RLIMIT_CPU stopped a process of the call, or None: its
    soft limit's SIGXCPU (nothing else sends it), or the hard limit's SIGKILL once the
    tree's CPU time (launcher path only: its rusage) shows it was that."""
    if signal_name == "SIGXCPU":
        return limits.cpu_seconds
    if (
        signal_name == "SIGKILL"
        and finished.cpu_seconds is not None
        and finished.cpu_seconds >= limits.cpu_seconds + _CPU_KILL_PAST_SOFT_SECONDS
    ):
        return limits.cpu_hard_seconds
    return None


#: Stage entries with no lock file (an older version's `etc-<pid>`, a crash
#: between two steps) are removed only once this old.
_STALE_STAGE_SECONDS = 3600.0
#: A package or data folder found readable by the sandbox uid is checked again
#: after this long (the check stats every folder above it: ~0.1 ms each; a
#: folder made unreadable meanwhile fails its bind, with a scrubbed bwrap error).
_READABLE_SECONDS = 10.0
_STAGE_PREFIX = "etc-"
_LOCK_SUFFIX = ".lock"
_STAGE_RANDOM_BYTES = 8


def _claim_stage(system: Path) -> tuple[Path, int]:
    """A fresh stage path and the flock-ed descriptor that marks it as this process's.

    The lock file is locked under a temporary name and renamed into place, so
    no other worker ever sees it unlocked while its owner lives.
    """
    name = f"{_STAGE_PREFIX}{secrets.token_hex(_STAGE_RANDOM_BYTES)}"
    tmp = system / f".{name}{_LOCK_SUFFIX}.new"
    for attempt in range(3):
        system.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(system, 0o755)  # noqa: S103 (the sandbox uid must reach its stage; umask aside)
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600)
            break
        except FileNotFoundError:  # another worker's close() removed .system just now
            if attempt == 2:
                raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until close(), or the process's end
        os.rename(tmp, system / f"{name}{_LOCK_SUFFIX}")
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return system / name, fd


def _stage_owner(name: str) -> str:
    """`etc-X` for each entry of the stage `etc-X` (`etc-X.lock`, `.etc-X.<build>`)."""
    return name.lstrip(".").split(".", 1)[0]


def _remove_stale_stages(system: Path, *, keep: Path) -> None:
    """Remove the stages of workers that are gone: their lock is free (best effort)."""
    owners: dict[str, list[Path]] = {}
    with contextlib.suppress(OSError):
        for entry in system.iterdir():
            if entry.name.lstrip(".").startswith(_STAGE_PREFIX):
                owners.setdefault(_stage_owner(entry.name), []).append(entry)
    for owner, entries in owners.items():
        if owner == keep.name:
            continue
        lock = system / f"{owner}{_LOCK_SUFFIX}"
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            # No lock: an older version's `etc-<pid>` or a crash's leftover.
            for entry in entries:
                with contextlib.suppress(OSError):
                    if time.time() - entry.lstat().st_mtime >= _STALE_STAGE_SECONDS:
                        remove_tree(entry)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its worker is alive
            for entry in entries:
                if entry != lock:
                    remove_tree(entry)
            with contextlib.suppress(OSError):
                lock.unlink()
        finally:
            os.close(fd)


class SandboxRunner:
    """Runs declared tools in bubblewrap; one per worker process."""

    def __init__(
        self,
        workspaces: WorkspaceStore,
        *,
        output_hard_cap_bytes: int = DEFAULT_OUTPUT_HARD_CAP_BYTES,
        outbox_cap_bytes: int = DEFAULT_OUTBOX_CAP_BYTES,
        cgroups: CgroupSettings | None = None,
        launchers: bool = True,
    ) -> None:
        self.workspaces = workspaces
        self.output_hard_cap_bytes = output_hard_cap_bytes
        self.outbox_cap_bytes = outbox_cap_bytes
        self.cgroup_settings = cgroups if cgroups is not None else CgroupSettings.from_env()
        #: Whose host uid every call runs as (never 0): the workspaces' owner.
        self.identity = workspaces.identity
        self._bwrap = shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
        #: The direct path's drop for a root worker (util-linux, always on Debian).
        self._setpriv = (
            shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
            if self.identity.drop
            else None
        )
        #: The workspace root was found reachable by the sandbox uid (checked once).
        self._root_reachable = False
        #: Host folders found readable by the sandbox uid, and when (monotonic).
        self._readable: dict[Path, float] = {}
        # The sandbox's /usr is the host's: the prefix bwrap executes is there or not.
        self._prefix = COMMAND_PREFIX
        self._prefix_ok = os.access(self._prefix[0], os.X_OK)
        # dash's ulimit cannot set RLIMIT_MSGQUEUE: set it here, every call inherits it.
        self._msgqueue_ok = restrict_worker_msgqueue()
        self._cgroups = (
            CgroupSupport.detect()
            if self.cgroup_settings.mode == "per-call"
            else CgroupSupport(parents={})
        )
        self._system_files: Path | None = None
        #: The flock-ed lock of this process's stage (-1: none yet), and its owner.
        self._stage_lock = -1
        self._stage_pid = os.getpid()
        self._lock = threading.Lock()
        #: The slot launchers of this process; None: the direct path only.
        self._launchers: LauncherPool | None = None
        #: Why the direct path is in force (None: launchers, or not asked for).
        self._direct_because: str | None = None if launchers else "launchers=False"
        self._warned_no_launcher = False
        if launchers and self._bwrap is not None and self._msgqueue_ok:
            self._start_launchers()

    def _start_launchers(self) -> None:
        """Start the first launcher now: it proves the path works and serves the first call."""
        pool = LauncherPool(self._cgroups, self.identity)
        try:
            # The default agent settings' limits: the launcher most calls can reuse.
            first = pool.take(
                DEFAULT_MEMORY_LIMIT_MB * MIB, _default_limits().rlimits(), DEFAULT_CPU_LIMIT
            )
        except OSError as exc:  # LauncherUnavailable, or the slot cgroups refused
            pool.close()
            self._direct_because = str(exc)
            _log.warning("sandbox: slot launchers unavailable (%s): direct path", exc)
            return
        assert first is not None
        pool.give(first)
        self._launchers = pool
        # A runner dropped without close() (a probe's) still stops its launchers.
        weakref.finalize(self, pool.close)

    def close(self) -> None:
        """Stop this process's launchers and remove their slot cgroups (idempotent).

        Calls still running give theirs back to a closed pool, which stops them;
        later calls take the direct path.
        """
        if self._launchers is not None:
            self._launchers.close()
        self._remove_stage()
        self.workspaces.close()

    def _remove_stage(self) -> None:
        """Remove this process's staged /etc and its lock (a forked child leaves its
        parent's alone)."""
        with self._lock:
            folder, self._system_files = self._system_files, None
            lock, self._stage_lock = self._stage_lock, -1
        if lock < 0 or self._stage_pid != os.getpid():
            return
        try:
            if folder is not None:
                remove_tree(folder)
                with contextlib.suppress(OSError):
                    (folder.parent / f"{folder.name}{_LOCK_SUFFIX}").unlink()
                with contextlib.suppress(OSError):
                    folder.parent.rmdir()  # .system, if no other worker's stage is there
        finally:
            os.close(lock)

    @property
    def cgroup_controllers(self) -> tuple[str, ...]:
        """The cgroup controllers each call is placed in (empty: rlimits only)."""
        return self._cgroups.controllers

    @property
    def uses_launchers(self) -> bool:
        """True if calls go through slot launchers (False: the `/bin/sh` wrapper path)."""
        return self._launchers is not None

    @property
    def cgroup_mode(self) -> str:
        """What is in force, for the start-up log, e.g. `per-call (cpu, memory, pids) via slot
        launchers; calls run as uid 65520, gid 65520 (...)`, `off via slot launchers; ...`,
        `per-call (none writable: rlimits only) via the sh wrapper (...); ...`."""
        if self.cgroup_settings.mode == "off":
            mode = "off"
        else:
            controllers = ", ".join(self._cgroups.controllers) or "none writable: rlimits only"
            mode = f"per-call ({controllers})"
        if self._launchers is not None:
            path = "via slot launchers"
        else:
            path = f"via the sh wrapper ({self._direct_because or 'no sandbox'})"
        return f"{mode} {path}; calls run as {self.identity.describe()}"

    def _system_dir(self) -> Path:
        """This process's staged /etc (`bwrap.stage_etc`), built at its first call.

        One folder per worker process (`.system/etc-<random>`, with its held
        lock), rebuilt if it went missing (one stat per call); stages of dead
        workers are removed.
        """
        with self._lock:
            folder = self._system_files
            if folder is None or not folder.is_dir():
                self.workspaces.ensure_root()
                system = self.workspaces.root / ".system"
                if folder is None or self._stage_lock < 0 or self._stage_pid != os.getpid():
                    folder, self._stage_lock = _claim_stage(system)
                    self._stage_pid = os.getpid()
                folder = stage_etc(folder)
                _remove_stale_stages(system, keep=folder)
                self._system_files = folder
            return folder

    # --- the call ------------------------------------------------------------

    def run(
        self,
        *,
        call_id: str,
        agent: Agent,
        tool: DeclaredTool,
        arguments: dict[str, Any],
        turn: str | None = None,
        cancel: threading.Event | None = None,
    ) -> ToolResult:
        started = time.monotonic()

        def result(**fields: Any) -> ToolResult:
            return ToolResult(
                call_id=call_id,
                agent=agent.id,
                tool=tool.name,
                duration_ms=round((time.monotonic() - started) * 1000, 3),
                **fields,
            )

        if cancel is not None and cancel.is_set():
            return result(is_error=True, output=CANCELLED_TEXT, outcome="cancelled")
        if self._bwrap is None or not self._msgqueue_ok:
            missing = (
                "bubblewrap (bwrap) not found"
                if self._bwrap is None
                else "RLIMIT_MSGQUEUE cannot be lowered"
            )
            return result(
                is_error=True, output=f"[sandbox unavailable: {missing}]", outcome="error"
            )

        if not self._prefix_ok:
            return result(is_error=True, output=self._prefix_missing_text(), outcome="error")

        timeout = tool.timeout_seconds or agent.settings.tool_timeout_seconds
        if self.identity.drop:
            refused = self._unreachable_text(agent)
            if refused is not None:
                return result(is_error=True, output=refused, outcome="error")
        try:
            workspace = self.workspaces.for_turn(agent.id, turn)
        except (OSError, ValueError) as exc:
            return result(
                is_error=True, output=f"[sandbox error: workspace: {exc}]", outcome="error"
            )
        settings = agent.settings
        memory_bytes = settings.memory_limit_mb * MIB
        limits = Limits.for_agent(settings, timeout=timeout)
        cgroup: CallCgroup | None = None
        launcher: Launcher | None = None
        outbox_dir: Path | None = None
        try:
            ensure_mount_point(workspace / "outbox")
            outbox_dir = self.workspaces.new_outbox()
            watch = WorkspaceWatch(
                (workspace, outbox_dir),
                max_bytes=settings.workspace_limit_mb * MIB,
                max_files=settings.workspace_files,
            )
            if watch.check():  # already over (an earlier call of the turn): not run
                assert watch.usage is not None
                text = workspace_limit_text(watch.usage, settings, started=False)
                return result(is_error=True, output=text, outcome="refused")
            launcher = self._take_launcher(memory_bytes, limits, settings.cpu_limit)
            if launcher is None and self._cgroups.controllers:
                try:
                    cgroup = self._cgroups.create(
                        memory_bytes=memory_bytes, cpu_limit=settings.cpu_limit
                    )
                except OSError:
                    cgroup = None  # the host changed its mind: rlimits still hold
            finished = self._spawn(
                agent=agent,
                tool=tool,
                arguments=arguments,
                workspace=workspace,
                outbox=outbox_dir,
                timeout=timeout,
                cancel=cancel,
                cgroup=cgroup,
                launcher=launcher,
                limits=limits,
                watch=watch,
            )
            outbox = collect_outbox(outbox_dir, self.outbox_cap_bytes)
        except (OSError, ValueError) as exc:
            return result(is_error=True, output=f"[sandbox error: {exc}]", outcome="error")
        finally:
            if launcher is not None:
                oom = launcher.memory_failures()
                slot = launcher.slot
                assert self._launchers is not None
                self._launchers.give(launcher)  # after the call's processes are gone
            else:
                oom = cgroup.memory_failures() if cgroup is not None else 0
                slot = cgroup
            if cgroup is not None:
                cgroup.remove()
            # Read and done with: removed off the call's path (see `discard_later`).
            if outbox_dir is not None:
                self.workspaces.discard_later(outbox_dir)
            if self.workspaces.is_one_call(workspace):
                self.workspaces.discard_later(workspace)
            else:
                self.workspaces.touch(workspace)

        files = {"files": outbox.files, "skipped_files": outbox.skipped}
        limit = agent.settings.tool_output_chars
        if finished.reason == "timeout":
            return result(is_error=True, output=timed_out_text(timeout), outcome="timeout", **files)
        if finished.reason == "cancelled":
            return result(is_error=True, output=CANCELLED_TEXT, outcome="cancelled", **files)
        text, dropped = cut_output(finished.text, limit, already_dropped=finished.dropped_chars)
        if finished.reason == "overflow":
            cap = format_seconds(self.output_hard_cap_bytes / MIB)
            return result(
                is_error=True,
                output=f"{text}\n[output passed {cap} MiB: the tool was killed]",
                dropped_chars=dropped,
                outcome="killed",
                **files,
            )
        if finished.reason == "limit":
            assert watch.usage is not None
            note = workspace_limit_text(watch.usage, settings, started=True)
            return result(
                is_error=True,
                output=f"{text}\n{note}" if text else note,
                dropped_chars=dropped,
                outcome="killed",
                **files,
            )
        code = finished.returncode
        assert code is not None
        if text.startswith(f"bwrap: execvp {self._prefix[0]}:"):
            # The prefix went missing after start-up: the tool never ran.
            return result(is_error=True, output=self._prefix_missing_text(), outcome="error")
        if text.startswith(_SETUP_ERROR_PREFIXES):
            # bwrap's (or the wrapper's, or the launcher's) own error: the command
            # never ran, and the message may name host paths the model must not see.
            text = self._scrub(text, agent, workspace, slot)
        if not finished.text and not finished.dropped_chars:
            text, dropped = f"[exit code {code}]", 0
        name = _signal_name(code) if code else None
        cpu = _hit_cpu_limit(name, finished, limits) if name is not None and not oom else None
        if cpu is not None:
            said = finished.text or finished.dropped_chars
            return result(
                is_error=True,
                output=f"{text}\n{cpu_limit_text(cpu)}" if said else cpu_limit_text(cpu),
                dropped_chars=dropped,
                outcome="killed",
                **files,
            )
        if name is not None:
            why = f"; memory_limit_mb ({agent.settings.memory_limit_mb}) reached" if oom else ""
            text += f"\n[killed by signal {name}{why}]"
        return result(
            is_error=code != 0,
            output=text,
            dropped_chars=dropped,
            exit_code=code,
            outcome="ok" if code == 0 else "error",
            **files,
        )

    def _unreachable_text(self, agent: Agent) -> str | None:
        """A root worker's check that the sandbox uid can read what a call binds:
        None if it can, else the call's error (sandbox paths only; the host path
        goes to the log for the operator)."""
        uid, gid = self.identity.uid, self.identity.gid
        if not self._root_reachable:
            self.workspaces.ensure_root()
            blocked = unreachable(self.workspaces.root, uid, gid, read=False)
            if blocked is not None:
                _log.warning(
                    "sandbox: %s is not searchable by uid %d (gid %d), so the workspace root "
                    "%s cannot be bound: make every folder above the root searchable by it "
                    "(chmod o+x) or set VESSEL_WORKSPACE_ROOT elsewhere",
                    blocked,
                    uid,
                    gid,
                    self.workspaces.root,
                )
                return (
                    f"[sandbox error: the workspace root is not reachable by the sandbox's "
                    f"uid {uid} (see the worker's log)]"
                )
            self._root_reachable = True
        sources = [(PACKAGE_PATH, "the agent folder", agent.package_dir)]
        sources += [(target, "the data mount", src) for target, src in sorted(agent.mounts.items())]
        now = time.monotonic()
        for shown, what, host in sources:
            if now - self._readable.get(host, -_READABLE_SECONDS) < _READABLE_SECONDS:
                continue
            blocked = unreachable(host, uid, gid)
            if blocked is None:
                self._readable[host] = now
                continue
            _log.warning(
                "sandbox: agent %s: %s %s (%s) is not readable by uid %d (gid %d): %s is "
                "not %s by it",
                agent.id,
                what,
                host,
                shown,
                uid,
                gid,
                blocked,
                "readable" if blocked == host.resolve() else "searchable",
            )
            return (
                f"[sandbox error: {what} {shown} is not readable by the sandbox's uid {uid}: "
                f"its host folder, and every folder above it, must be readable by that uid "
                f"(or set {ENV_SANDBOX_UID} to one that can read it)]"
            )
        return None

    def _prefix_missing_text(self) -> str:
        return (
            f"[sandbox error: {self._prefix[0]} not found: every call starts with it "
            "(it applies the Landlock ruleset, then runs the tool); install perl-base]"
        )

    def _take_launcher(
        self, memory_bytes: int, limits: Limits, cpu_limit: float
    ) -> Launcher | None:
        """A launcher for this call, None for the direct path (none in this process,
        or a new one cannot be started now: this call goes direct, the next tries again)."""
        pool = self._launchers
        if pool is None:
            return None
        if pool.owner != os.getpid():
            with self._lock:  # a forked child (prefork): a pool of its own
                if self._launchers is pool:
                    self._launchers = LauncherPool(self._cgroups, self.identity)
                    weakref.finalize(self, self._launchers.close)
                pool = self._launchers
            assert pool is not None
        try:
            return pool.take(memory_bytes, limits.rlimits(), cpu_limit)
        except (LauncherUnavailable, OSError) as exc:
            if not self._warned_no_launcher:  # once: a broken host would say it per call
                self._warned_no_launcher = True
                _log.warning("sandbox: no launcher for a call (%s): direct path for it", exc)
            return None

    def _scrub(self, text: str, agent: Agent, workspace: Path, cgroup: CallCgroup | None) -> str:
        """Replace host paths in a set-up error by their sandbox names."""
        pairs = [(str(src), target) for target, src in agent.mounts.items()]
        pairs += [(str(agent.package_dir), PACKAGE_PATH), (str(workspace), SANDBOX_HOME)]
        pairs += [(str(d), "<cgroup>") for d in (cgroup.dirs if cgroup is not None else ())]
        pairs.append((str(self.workspaces.root), "<workspaces>"))
        for host, shown in sorted(pairs, key=lambda p: -len(p[0])):
            text = text.replace(host, shown)
        return text

    def _spawn(
        self,
        *,
        agent: Agent,
        tool: DeclaredTool,
        arguments: dict[str, Any],
        workspace: Path,
        outbox: Path,
        timeout: float,
        cancel: threading.Event | None,
        cgroup: CallCgroup | None,
        launcher: Launcher | None,
        limits: Limits,
        watch: WorkspaceWatch,
    ) -> Finished:
        assert self._bwrap is not None
        layout = Layout(
            package_dir=agent.package_dir,
            workspace=workspace,
            outbox=outbox,
            mounts=agent.mounts,
            workdir=agent.settings.workdir,
            system_files=self._system_dir(),
        )
        seccomp_fd = seccomp.filter_fd()
        args_fd = -1
        try:
            # A launcher's child finds the memfds at fixed numbers; Popen keeps ours.
            options = bwrap_options(
                layout, seccomp_fd=SECCOMP_FD if launcher is not None else seccomp_fd
            )
            args_fd = os.memfd_create("vessel-bwrap-args", os.MFD_CLOEXEC)
            os.write(args_fd, b"".join(o.encode() + b"\0" for o in options))
            os.lseek(args_fd, 0, os.SEEK_SET)
            command = list(tool.command)
            stdin: bytes | None
            if tool.input == "args":
                command += args_flags(arguments)
                stdin = None
            else:
                stdin = json.dumps(arguments).encode() + b"\n"
            bwrap_argv = [
                self._bwrap,
                "--args",
                str(ARGS_FD if launcher is not None else args_fd),
                "--",
                *self._prefix,
                *command,
            ]
            if launcher is None:
                drop: list[str] = []
                if self.identity.drop:
                    if self._setpriv is None:
                        raise OSError(
                            "setpriv (util-linux) not found: a root worker starts calls "
                            f"as uid {self.identity.uid} with it (apt-get install util-linux)"
                        )
                    drop = self.identity.setpriv_argv(self._setpriv)
                return run_process(
                    [
                        *wrapper_argv(
                            cgroup.procs_files if cgroup is not None else [],
                            limits.ulimit_script(),
                        ),
                        *drop,
                        *bwrap_argv,
                    ],
                    stdin=stdin,
                    env=spawn_env(),
                    pass_fds=(seccomp_fd, args_fd),
                    timeout=timeout,
                    keep_chars=agent.settings.tool_output_chars,
                    hard_cap_bytes=self.output_hard_cap_bytes,
                    cancel=cancel,
                    watch=watch.poll,
                )

            def launch(stdin_fd: int | None, out_fd: int) -> Child:
                assert launcher is not None
                return launcher.spawn(
                    bwrap_argv,
                    env=spawn_env(),
                    stdin_fd=stdin_fd,
                    out_fd=out_fd,
                    args_fd=args_fd,
                    seccomp_fd=seccomp_fd,
                    cpu_seconds=(limits.cpu_seconds, limits.cpu_hard_seconds),
                )

            return run_child(
                launch,
                stdin=stdin,
                timeout=timeout,
                keep_chars=agent.settings.tool_output_chars,
                hard_cap_bytes=self.output_hard_cap_bytes,
                cancel=cancel,
                watch=watch.poll,
            )
        finally:
            os.close(seccomp_fd)
            if args_fd >= 0:
                os.close(args_fd)
