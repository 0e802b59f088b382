"""One declared call, confined: the runner the sandbox worker uses.

    slot launcher (in its slot's cgroups; the call's rlimits are its own)
        -> posix_spawn bwrap (namespaces, mounts, --args memfd, --seccomp memfd)
        -> the Landlock prefix (/.vessel/landlock-exec, static; or /usr/bin/perl -e:
           command_prefix.py, landlock.py) -> exec the tool's command

A call takes a launcher from this process's pool (`launcher_pool.py`; the pool grows
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
(`reachable.py`), not bwrap's. A worker that is not root runs calls as
itself, as before.

After a call, its launcher may start the next like call's bwrap at once (a
standby, `standby.py`; `$VESSEL_SANDBOX_STANDBY`): that call then writes its
command to the static prefix waiting in it, and bwrap's set-up is off its path.

What each call binds at /.vessel (the staged /etc, a copy of the static
prefix) is one folder per worker process, built when the runner starts (not on
its first call), renewed when the host's certificates or the prefix change
(`system_stage.py`); `close` removes it. How bwrap is started on either path
is `call_spawn.py`; how what it did becomes the `ToolResult` is
`call_results.py`.

`run` never raises for anything a tool does: every outcome is a `ToolResult`;
a launcher lost mid-call is a `[sandbox error: launcher lost ...]` and is
replaced. It is safe from many threads at once (every call has its own
descriptors, process group and launcher; nothing mutable is shared but the
pool and counters under locks) and from prefork children (a child makes a pool
of its own; it never uses its parent's launchers). `close()` stops the launchers
and removes their slot cgroups.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from broker.constants import (
    DEFAULT_CPU_LIMIT,
    DEFAULT_DISK_LIMIT_MB,
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_TOOL_OUTPUT_CHARS,
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    DEFAULT_WORKDIR,
    SANDBOX_HOME,
)
from broker.model import Agent, AgentSettings, DeclaredTool
from broker.protocol import CANCELLED_TEXT, ToolResult
from workers.sandbox import command_prefix
from workers.sandbox.bwrap import Layout
from workers.sandbox.call_results import (
    cpu_limit_text,
    finished_result,
    scrub_host_paths,
    timed_out_text,
    workspace_limit_text,
)
from workers.sandbox.call_spawn import CallSpawner
from workers.sandbox.cgroup import CallCgroup, CgroupSettings, CgroupSupport
from workers.sandbox.launcher_client import Launcher, LauncherUnavailable
from workers.sandbox.launcher_network import ENV_SANDBOX_NETWORK, network_mode
from workers.sandbox.launcher_pool import LauncherPool
from workers.sandbox.limits import MIB, Limits, restrict_worker_msgqueue
from workers.sandbox.outbox import DEFAULT_OUTBOX_CAP_BYTES, collect_outbox, ensure_mount_point
from workers.sandbox.reachable import ReachabilityCheck
from workers.sandbox.standby import (
    ENV_SANDBOX_STANDBY,
    STANDBY_IDLE_SECONDS,
    Standby,
    StandbyCounts,
    prefix_takes_holes,
    prefix_takes_standby,
    standby_mode,
)
from workers.sandbox.system_stage import SystemStage
from workers.sandbox.watchdog import WorkspaceWatch
from workers.sandbox.workspace import OUTBOX_NAME, WorkspaceStore

__all__ = [
    "DEFAULT_OUTPUT_HARD_CAP_BYTES",
    "SandboxRunner",
    # The outcome texts live in call_results; named here too for their users.
    "cpu_limit_text",
    "timed_out_text",
    "workspace_limit_text",
]

#: Total output bytes after which a call is killed: 64 MiB. Past
#: tool_output_chars (20,000 by default) the output is only counted; 64 MiB is
#: far beyond any useful result and bounds the CPU a flood can spend decoding.
DEFAULT_OUTPUT_HARD_CAP_BYTES = 64 * 1024 * 1024

_log = logging.getLogger(__name__)
#: A standby is started after a call whose key was that of at least `_SEEN_BEFORE` of
#: this process's `_RECENT_KEYS` calls before it: one agent's calls in a row, or two
#: kinds interleaved, get one; calls spread over many turns (where a key seen once
#: among four is chance, and its standby would mostly be killed unused) do not.
_RECENT_KEYS = 4
_SEEN_BEFORE = 2


class _AnyTurn:
    """A standby key's turn for calls of any turn: the standby binds its launcher's
    hole and the call's turn workspace is mounted there when the call starts. An
    object of its own, equal to nothing else: no turn id can stand for it."""

    def __repr__(self) -> str:
        return "<any turn: at the launcher's hole>"


_AT_HOLE = _AnyTurn()


def _fits_hole(agent: Agent) -> bool:
    """True if nothing of the agent's layout is inside the workspace's place but the
    working directory at its root: the workspace mounted at the hole after bwrap's
    start covers everything bwrap put there (a data mount, a working directory
    made inside it), so such an agent's turns keep standbys of their own turn."""

    def inside(path: str) -> bool:
        return path.startswith(SANDBOX_HOME + "/")

    workdir = agent.settings.workdir.rstrip("/") or "/"
    return not inside(workdir) and not any(
        target == SANDBOX_HOME or inside(target) for target in agent.mounts
    )


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
        network: str | None = None,
        standby: str | None = None,
    ) -> None:
        self.workspaces = workspaces
        self.output_hard_cap_bytes = output_hard_cap_bytes
        self.outbox_cap_bytes = outbox_cap_bytes
        self.cgroup_settings = cgroups if cgroups is not None else CgroupSettings.from_env()
        #: `slot` or `per-call` (`$VESSEL_SANDBOX_NETWORK`, `launcher_network.py`).
        self.network_setting = network_mode(
            os.environ if network is None else {ENV_SANDBOX_NETWORK: network}
        )
        #: Whose host uid every call runs as (never 0): the workspaces' owner.
        self.identity = workspaces.identity
        self._bwrap = shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
        #: What bwrap executes first: the static Landlock prefix, or Perl's
        #: (`command_prefix.py`; ValueError if VESSEL_LANDLOCK_EXEC names no executable).
        self._prefix = command_prefix.choose()
        #: `on` or `off` (`$VESSEL_SANDBOX_STANDBY`, `standby.py`).
        self.standby_setting = standby_mode(
            os.environ if standby is None else {ENV_SANDBOX_STANDBY: standby}
        )
        #: Calls may find their sandbox started ahead (`standby.py`): asked for, and the
        #: static prefix knows how (Perl's does not).
        self._standbys = self.standby_setting == "on" and prefix_takes_standby(self._prefix.binary)
        #: Starts each call's bwrap (None: no bwrap here, every call says so).
        self._spawner = (
            CallSpawner(
                bwrap=self._bwrap,
                prefix=self._prefix.argv,
                identity=self.identity,
                # The direct path's drop for a root worker (util-linux, always on Debian).
                setpriv=shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
                if self.identity.drop
                else None,
                hard_cap_bytes=output_hard_cap_bytes,
            )
            if self._bwrap is not None
            else None
        )
        self._reachable = ReachabilityCheck(workspaces, self.identity)
        # dash's ulimit cannot set RLIMIT_MSGQUEUE: set it here, every call inherits it.
        self._msgqueue_ok = restrict_worker_msgqueue()
        self._cgroups = (
            CgroupSupport.detect()
            if self.cgroup_settings.mode == "per-call"
            else CgroupSupport(parents={})
        )
        self._stage = SystemStage(workspaces, prefix=self._prefix.binary)
        if self._spawner is not None:
            self._stage_now()
        self._lock = threading.Lock()
        #: Standbys (`standby.py`) of this process: started, taken by a call (also the
        #: calls that found their sandbox started ahead), killed unused.
        self.standbys_started = 0
        self.standby_calls = 0
        self.standbys_unused = 0
        #: The standby keys of this process's last calls: a standby is started only for
        #: a key seen again, not for every agent of a mix.
        self._recent_keys: collections.deque[tuple[Hashable, ...]] = collections.deque(
            maxlen=_RECENT_KEYS
        )
        #: The slot launchers of this process; None: the direct path only.
        self._launchers: LauncherPool | None = None
        #: Why the direct path is in force (None: launchers, or not asked for).
        self._direct_because: str | None = None if launchers else "launchers=False"
        self._warned_no_launcher = False
        #: Calls run in their launcher's network namespace (False: bwrap's, per call).
        self._shared_network = False
        #: Standbys for a turn's calls bind their launcher's hole, any turn's call of
        #: the agent taking one (`launcher_holes.py`); False: the turn's workspace.
        self._at_hole = False
        if launchers and self._bwrap is not None and self._msgqueue_ok:
            self._start_launchers()

    def _start_launchers(self) -> None:
        """Start the first launcher now: it proves the path works and serves the first call."""
        share = self.network_setting == "slot"
        holes_root: Path | None = None
        if share and self._standbys and prefix_takes_holes(self._prefix.binary):
            try:
                holes_root = self.workspaces.holes_folder()
            except OSError as exc:
                _log.warning("sandbox: no folder for the launchers' holes (%s)", exc)
        pool = LauncherPool(
            self._cgroups, self.identity, share_network=share, holes_root=holes_root
        )
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
        if first is None:  # a new pool of this process serves unless closed
            pool.close()
            self._direct_because = "the launcher pool refused its first call"
            return
        if first.network_refused:
            _log.warning(
                "sandbox: slot launchers cannot make a network namespace (%s): "
                "bwrap makes one per call",
                first.network_refused,
            )
        self._shared_network = first.shared_network
        if holes_root is not None and first.hole is None:
            _log.info(
                "sandbox: slot launchers have no hole (%s): a turn's standby binds "
                "its workspace, so it serves that turn's next call only",
                first.holes_refused or "no network namespace of their own",
            )
        self._at_hole = first.hole is not None
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
        self._stage.remove()
        self.workspaces.close()

    @property
    def cgroup_controllers(self) -> tuple[str, ...]:
        """The cgroup controllers each call is placed in (empty: rlimits only)."""
        return self._cgroups.controllers

    @property
    def prefix(self) -> command_prefix.CommandPrefix:
        """The command every call starts with (the static Landlock prefix, or Perl's)."""
        return self._prefix

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

    @property
    def network_mode(self) -> str:
        """What is in force, for the start-up log."""
        if self._launchers is not None and self._shared_network:
            return "slot: one empty namespace per slot launcher, its calls one after another"
        if self.network_setting == "slot":
            return "per-call (bwrap's, loopback up): the slot launchers could not make one"
        return "per-call (bwrap's, loopback up)"

    @property
    def standbys_at_hole(self) -> bool:
        """True if a turn's standby binds its launcher's hole, so that any turn's call
        of the agent takes it (`launcher_holes.py`); False: it binds the turn's
        workspace and serves that turn's next call only."""
        return self._standbys and self._launchers is not None and self._at_hole

    @property
    def standby_mode(self) -> str:
        """What is in force, for the start-up log."""
        if self._standbys and self._launchers is not None:
            return (
                "on: after three like calls close together (an agent's, or a turn's), the "
                "next one's sandbox is started ahead"
                + (
                    " (for a turn's call, any turn's: its workspace mounted at the call)"
                    if self._at_hole
                    else ""
                )
            )
        if self.standby_setting == "off":
            return "off"
        if self._launchers is None:
            return "off: no slot launchers (the direct path starts every sandbox at its call)"
        return f"off: {self._prefix.describe or self._prefix.program} cannot wait for a command"

    def _stage_now(self) -> None:
        """Build the stage at start-up: copying the certificates takes ~60 ms, which
        the worker's first call would otherwise wait for."""
        try:
            self._stage.folder()
        except OSError as exc:  # each call tries again, and fails with the reason
            _log.warning("sandbox: cannot stage /etc and the prefix (%s)", exc)

    def _system_dir(self) -> Path:
        """This process's stage (`system_stage.py`), built when the runner started."""
        return self._stage.folder()

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
        spawner = self._spawner
        if spawner is None or not self._msgqueue_ok:
            missing = (
                "bubblewrap (bwrap) not found"
                if spawner is None
                else "RLIMIT_MSGQUEUE cannot be lowered"
            )
            return result(
                is_error=True, output=f"[sandbox unavailable: {missing}]", outcome="error"
            )

        # Per call (~1 us): a prefix removed after start-up is said so, not as
        # bwrap's bind or exec error.
        if not os.access(self._prefix.host_file, os.X_OK):
            return result(is_error=True, output=self._prefix.missing_text(), outcome="error")

        timeout = tool.timeout_seconds or agent.settings.tool_timeout_seconds
        if self.identity.drop:
            refused = self._reachable.refusal(agent)
            if refused is not None:
                return result(is_error=True, output=refused, outcome="error")
        settings = agent.settings
        memory_bytes = settings.memory_limit_mb * MIB
        limits = Limits.for_agent(settings, timeout=timeout)
        cgroup: CallCgroup | None = None
        pool: LauncherPool | None = None
        launcher: Launcher | None = None
        outbox_dir: Path | None = None
        # Taken once, here: its certificates' check is per call, and the standby key
        # holds its path (it changes with its contents: `system_stage.py`).
        try:
            call_stage = self._stage.take()
        except OSError as exc:
            return result(is_error=True, output=f"[sandbox error: {exc}]", outcome="error")
        # What the call holds of it (None once a standby let go unused took it along).
        stage: Path | None = call_stage
        # The call may find its sandbox started already (`standby.py`).
        key = self._standby_key(agent, tool, limits, turn, call_stage)
        standby: Standby | None = None
        taken = False
        if key is not None:
            pool, launcher = self._take_launcher(
                memory_bytes, limits, settings.cpu_limit, standby_key=key
            )
            taken = True
            standby = self._standby_of(launcher, key)
            if standby is not None:  # its stage (the same: in its key) is the call's now
                self._stage.give(call_stage)
                stage = standby.stage
        try:
            if standby is not None and not standby.hole:
                workspace = standby.workspace
            else:  # at the hole, the turn's workspace is mounted when the call starts
                workspace = self.workspaces.for_turn(agent.id, turn)
                if standby is not None:
                    ensure_mount_point(workspace / OUTBOX_NAME)
                    standby.at_call(workspace)  # mounted while the call is readied
        except (OSError, ValueError) as exc:
            if standby is not None:  # at the hole: its stage is the call's, let go with it
                standby.discard()
            else:
                self._stage.give(call_stage)  # no standby here: the call's own
            if pool is not None and launcher is not None:
                pool.give(launcher)
            return result(
                is_error=True, output=f"[sandbox error: workspace: {exc}]", outcome="error"
            )
        # A one-call workspace holds its own outbox/ (`for_turn`); the calls of a
        # turn share its workspace, so each gets an outbox folder bound over it.
        own_outbox = self.workspaces.is_one_call(workspace)
        try:
            if own_outbox:
                outbox_dir = workspace / OUTBOX_NAME
            elif standby is not None and standby.outbox is not None:
                outbox_dir = standby.outbox  # the mount point was made with it
            else:
                ensure_mount_point(workspace / OUTBOX_NAME)
                outbox_dir = self.workspaces.new_outbox()
            watch = WorkspaceWatch(
                (workspace,) if own_outbox else (workspace, outbox_dir),
                max_bytes=settings.workspace_limit_mb * MIB,
                max_files=settings.workspace_files,
            )
            if watch.check():  # already over (an earlier call of the turn): not run
                text = workspace_limit_text(watch.usage, settings, started=False)
                return result(is_error=True, output=text, outcome="refused")
            if not taken:
                pool, launcher = self._take_launcher(memory_bytes, limits, settings.cpu_limit)
            if launcher is None and self._cgroups.controllers:
                try:
                    cgroup = self._cgroups.create(
                        memory_bytes=memory_bytes, cpu_limit=settings.cpu_limit
                    )
                except OSError:
                    cgroup = None  # the host changed its mind: rlimits still hold
            layout = Layout(
                package_dir=agent.package_dir,
                workspace=workspace,
                outbox=None if own_outbox else outbox_dir,
                mounts=agent.mounts,
                workdir=settings.workdir,
                stage=call_stage if standby is None else standby.stage,
                prefix=self._prefix,
            )
            # The spawner's from here: used, or killed and the call started the usual way.
            given, standby = standby, None
            finished = spawner.run(
                layout=layout,
                tool=tool,
                arguments=arguments,
                timeout=timeout,
                cancel=cancel,
                cgroup=cgroup,
                launcher=launcher,
                limits=limits,
                watch=watch,
                keep_chars=settings.tool_output_chars,
                standby=given,
            )
            if given is not None:
                with self._lock:
                    if given.released:
                        self.standby_calls += 1
                    else:  # it could not take the command: the call started anew
                        self.standbys_unused += 1
            outbox = collect_outbox(outbox_dir, self.outbox_cap_bytes)
        except (OSError, ValueError) as exc:
            return result(is_error=True, output=f"[sandbox error: {exc}]", outcome="error")
        finally:
            let_go: Path | None = None  # a folder the standby let go with itself
            if standby is not None:  # not run (refused, or an error before): not wanted
                standby.discard()
                stage = None  # the standby's, let go with it
                let_go = standby.outbox if standby.outbox is not None else standby.workspace
            if pool is not None and launcher is not None:
                oom = launcher.memory_failures()
                slot = launcher.slot
                self._stand_by(
                    launcher,
                    key,
                    agent=agent,
                    limits=limits,
                    tool=tool,
                    used=workspace,
                    stage=stage,
                )
                pool.give(launcher)  # after the call's processes are gone
            else:
                oom = cgroup.memory_failures() if cgroup is not None else 0
                slot = cgroup
            if cgroup is not None:
                cgroup.remove()
            if stage is not None:
                self._stage.give(stage)  # the call's mounts are gone with its processes
            # Read and done with: removed off the call's path (see `discard_later`).
            # Once each: a folder discarded twice would go back to the spares twice.
            if outbox_dir is not None and not own_outbox and outbox_dir != let_go:
                self.workspaces.discard_later(outbox_dir)
            if own_outbox:
                if workspace != let_go:
                    self.workspaces.discard_later(workspace)
            else:
                self.workspaces.touch(workspace)

        return finished_result(
            result,
            finished,
            settings=settings,
            timeout=timeout,
            limits=limits,
            usage=watch.usage,
            files={"files": outbox.files, "skipped_files": outbox.skipped},
            oom=oom,
            hard_cap_bytes=self.output_hard_cap_bytes,
            prefix_program=self._prefix.program,
            prefix_missing=self._prefix.missing_text(),
            scrub=lambda text: scrub_host_paths(text, agent, workspace, slot, self.workspaces.root),
        )

    # --- standby sandboxes (`standby.py`) ------------------------------------

    def _standby_key(
        self, agent: Agent, tool: DeclaredTool, limits: Limits, turn: str | None, stage: Path
    ) -> tuple[Hashable, ...] | None:
        """What this call's sandbox is made of (None: no standby for it): the agent's
        layout, the stage, the limits, how the arguments come and the turn (None: a
        one-call workspace; `_AT_HOLE` for any turn's, when the workspace is mounted
        at the launcher's hole at the call), not the tool's command (the standby
        takes any command). The stage's path changes with its contents
        (`system_stage.py`)."""
        if not self._standbys or self._launchers is None:
            return None
        settings = agent.settings
        return (
            agent.id,
            agent.package_dir,
            tuple(sorted(agent.mounts.items())),
            settings.workdir,
            stage,
            settings.memory_limit_mb,
            settings.cpu_limit,
            limits.rlimits(),
            (limits.cpu_seconds, limits.cpu_hard_seconds),
            tool.input == "args",
            _AT_HOLE if turn is not None and self._at_hole and _fits_hole(agent) else turn,
        )

    def _standby_of(self, launcher: Launcher | None, key: Hashable) -> Standby | None:
        """The launcher's standby if it was made for `key` and is still waiting; one
        that is not (old, or gone) is killed."""
        standby = launcher.standby if launcher is not None else None
        if standby is None or standby.key != key:
            return None
        if standby.usable(self.workspaces.ttl_seconds / 2):
            return standby
        standby.discard()
        return None

    def _stand_by(
        self,
        launcher: Launcher,
        key: tuple[Hashable, ...] | None,
        *,
        agent: Agent,
        limits: Limits,
        tool: DeclaredTool,
        used: Path,
        stage: Path | None,
    ) -> None:
        """After a call on `launcher` (in `used`, its workspace): start the next call's
        sandbox if this call's key was that of two of this process's last four calls
        (`_SEEN_BEFORE`: an agent's calls in a row, or a turn's) and the slot is empty.
        A one-call standby gets a fresh workspace; a turn's binds the turn's, if it is
        still there (never made again here: the turn may have ended), and an outbox of
        its own.
        Never raises: a standby that cannot start is only not there."""
        if key is None or stage is None:  # stage None: the call's standby let go unused
            return
        with self._lock:
            seen = self._recent_keys.count(key)
            self._recent_keys.append(key)
        if seen < _SEEN_BEFORE or launcher.standby is not None:
            return
        if not launcher.alive() or launcher.busy:
            return
        turn = key[-1]
        workspace: Path | None = None
        outbox: Path | None = None
        held: Path | None = None
        try:
            if turn is _AT_HOLE:
                if launcher.hole is None:
                    return  # this launcher could not make one (the first one could)
                workspace = Path(launcher.hole)
                outbox = self.workspaces.new_outbox()
            elif turn is None:
                workspace = self.workspaces.for_turn(agent.id, None)
            elif used.is_dir():
                workspace = used
                ensure_mount_point(workspace / OUTBOX_NAME)
                outbox = self.workspaces.new_outbox()
            else:
                return
            # The call's stage, as its key says (restaged since: the next call's key
            # differs, and this standby is killed unused).
            held = self._stage.hold(stage)
            at_hole = turn is _AT_HOLE
            layout = Layout(
                package_dir=agent.package_dir,
                workspace=workspace,
                # At the hole, the launcher mounts the outbox with the workspace.
                outbox=None if at_hole else outbox,
                mounts=agent.mounts,
                workdir=agent.settings.workdir,
                stage=stage,
                prefix=self._prefix,
            )
            assert self._spawner is not None  # a key is made only with a spawner
            launcher.standby = self._spawner.start_standby(
                key=key,
                layout=layout,
                launcher=launcher,
                limits=limits,
                with_stdin=tool.input != "args",
                on_discard=self._let_go,
                hole_outbox=outbox if at_hole else None,
            )
            with self._lock:
                self.standbys_started += 1
        except (OSError, ValueError) as exc:
            _log.debug("sandbox: no standby after a call (%s)", exc)
            if outbox is not None:
                self.workspaces.discard_later(outbox)
            elif workspace is not None and turn is None:
                self.workspaces.discard_later(workspace)
            if held is not None:
                self._stage.give(held)

    def standby_counts(self) -> StandbyCounts:
        """This process's standbys so far, and how many wait now (metrics)."""
        pool = self._launchers
        waiting = pool.standbys_waiting() if pool is not None else 0
        with self._lock:
            return StandbyCounts(
                started=self.standbys_started,
                used=self.standby_calls,
                unused=self.standbys_unused,
                waiting=waiting,
            )

    def drop_idle_standbys(self, idle_seconds: float | None = None) -> int:
        """Kill the standbys no call took within `idle_seconds` (default
        STANDBY_IDLE_SECONDS) of their start (the sandbox worker's housekeeping, every
        minute); return how many."""
        pool = self._launchers
        if pool is None:
            return 0
        # The constant read at each call, not bound as a default (tests shorten it).
        older_than = STANDBY_IDLE_SECONDS if idle_seconds is None else idle_seconds
        return pool.drop_idle_standbys(older_than)

    def _let_go(self, standby: Standby) -> None:
        """A standby killed unused: its own folder removed (the one-call workspace, or a
        turn's call's outbox: never the turn's workspace), its stage given back."""
        with self._lock:
            self.standbys_unused += 1
        if standby.outbox is not None:
            self.workspaces.discard_later(standby.outbox)
        else:
            self.workspaces.discard_later(standby.workspace)
        self._stage.give(standby.stage)

    def _take_launcher(
        self,
        memory_bytes: int,
        limits: Limits,
        cpu_limit: float,
        *,
        standby_key: Hashable | None = None,
    ) -> tuple[LauncherPool | None, Launcher | None]:
        """A launcher for this call and the pool to give it back to; (None, None) for the
        direct path (no pool in this process, or a new launcher cannot be started now:
        this call goes direct, the next tries again)."""
        pool = self._launchers
        if pool is None:
            return None, None
        if pool.owner != os.getpid():
            with self._lock:  # a forked child (prefork): a pool of its own
                if self._launchers is pool:
                    self._launchers = LauncherPool(
                        self._cgroups,
                        self.identity,
                        share_network=pool.share_network,
                        holes_root=pool.holes_root,
                    )
                    weakref.finalize(self, self._launchers.close)
                pool = self._launchers or pool
        try:
            return pool, pool.take(
                memory_bytes, limits.rlimits(), cpu_limit, standby_key=standby_key
            )
        except (LauncherUnavailable, OSError) as exc:
            if not self._warned_no_launcher:  # once: a broken host would say it per call
                self._warned_no_launcher = True
                _log.warning("sandbox: no launcher for a call (%s): direct path for it", exc)
            return None, None
