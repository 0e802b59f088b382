"""One declared call, confined: the runner the sandbox worker uses.

    /bin/sh (ulimit: rlimits; cgroup join where cgroups are on and writable) -> bwrap
        (namespaces, mounts, --args memfd, --seccomp memfd) -> the tool's command

Cgroups: `SandboxRunner(..., cgroups=CgroupSettings(mode=...))`, by default
`$VESSEL_SANDBOX_CGROUPS` read once here: `per-call` (default; a pids and a
memory cgroup per call where a v1 hierarchy is writable) or `off` (none: the
rlimits, RLIMIT_NPROC for a non-root worker, the pid namespace and the timeout
hold; see `limits.py` and `cgroup.py`). `cgroup_mode` says which is in force.

`run` never raises for anything a tool does: every outcome is a `ToolResult`.
It is safe from many threads at once (every call has its own descriptors,
process group and cgroup; nothing mutable is shared but counters under locks)
and from prefork children (nothing is inherited but the immutable filter bytes).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from broker.constants import PACKAGE_PATH, SANDBOX_HOME
from broker.model import Agent, DeclaredTool
from workers.arguments import args_flags
from workers.output import cut_output
from workers.result import ToolResult
from workers.sandbox import seccomp
from workers.sandbox.bwrap import (
    COMMAND_PREFIX,
    Layout,
    bwrap_options,
    spawn_env,
    stage_etc,
)
from workers.sandbox.cgroup import CallCgroup, CgroupSettings, CgroupSupport, wrapper_argv
from workers.sandbox.limits import MIB, Limits, restrict_worker_msgqueue
from workers.sandbox.outbox import DEFAULT_OUTBOX_CAP_BYTES, collect_outbox, ensure_mount_point
from workers.sandbox.process import Finished, run_process
from workers.sandbox.workspace import WorkspaceStore

__all__ = [
    "DEFAULT_OUTPUT_HARD_CAP_BYTES",
    "SandboxRunner",
    "format_seconds",
    "timed_out_text",
]

#: Total output bytes after which a call is killed: 64 MiB. Past
#: tool_output_chars (20,000 by default) the output is only counted; 64 MiB is
#: far beyond any useful result and bounds the CPU a flood can spend decoding.
DEFAULT_OUTPUT_HARD_CAP_BYTES = 64 * 1024 * 1024

_SIGNAL_BASE = 128  # bwrap reports a command killed by signal N as exit status 128+N


def format_seconds(seconds: float) -> str:
    """Seed 000's N: an integer when whole (`2`), else as written (`1.5`)."""
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds}"


def timed_out_text(seconds: float) -> str:
    """Seed 000: `[timed out after N s]`."""
    return f"[timed out after {format_seconds(seconds)} s]"


def _signal_name(returncode: int) -> str | None:
    number = returncode - _SIGNAL_BASE
    if not 0 < number < signal.NSIG:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


#: A stage of a dead pid is removed only once this old: a pid may be another
#: pid namespace's (workers in containers sharing one workspace root).
_STALE_STAGE_SECONDS = 3600.0


def _remove_stale_stages(system: Path, *, keep: Path) -> None:
    """Remove `etc-<pid>` stages of processes gone for a while (best effort)."""
    with contextlib.suppress(OSError):
        for d in system.iterdir():
            owner = d.name.removeprefix("etc-")
            if d == keep or not d.name.startswith("etc-") or not owner.isdigit():
                continue
            with contextlib.suppress(OSError):
                if Path(f"/proc/{owner}").exists():
                    continue
                if time.time() - d.lstat().st_mtime < _STALE_STAGE_SECONDS:
                    continue
                shutil.rmtree(d, ignore_errors=True)


class SandboxRunner:
    """Runs declared tools in bubblewrap; one per worker process."""

    def __init__(
        self,
        workspaces: WorkspaceStore,
        *,
        output_hard_cap_bytes: int = DEFAULT_OUTPUT_HARD_CAP_BYTES,
        outbox_cap_bytes: int = DEFAULT_OUTBOX_CAP_BYTES,
        cgroups: CgroupSettings | None = None,
    ) -> None:
        self.workspaces = workspaces
        self.output_hard_cap_bytes = output_hard_cap_bytes
        self.outbox_cap_bytes = outbox_cap_bytes
        self.cgroup_settings = cgroups if cgroups is not None else CgroupSettings.from_env()
        self._bwrap = shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
        # dash's ulimit cannot set RLIMIT_MSGQUEUE: set it here, every call inherits it.
        self._msgqueue_ok = restrict_worker_msgqueue()
        self._cgroups = (
            CgroupSupport.detect()
            if self.cgroup_settings.mode == "per-call"
            else CgroupSupport(parents={})
        )
        self._system_files: Path | None = None
        self._lock = threading.Lock()

    @property
    def cgroup_controllers(self) -> tuple[str, ...]:
        """The cgroup controllers each call is placed in (empty: rlimits only)."""
        return self._cgroups.controllers

    @property
    def cgroup_mode(self) -> str:
        """What is in force, for the start-up log: `off`, `per-call (memory, pids)`,
        or `per-call (none writable: rlimits only)`."""
        if self.cgroup_settings.mode == "off":
            return "off"
        return f"per-call ({', '.join(self._cgroups.controllers) or 'none writable: rlimits only'})"

    def _system_dir(self) -> Path:
        """This process's staged /etc (`bwrap.stage_etc`), built at its first call.

        One folder per worker process (`.system/etc-<pid>`), rebuilt if it went
        missing (one stat per call); stages of dead workers are removed.
        """
        with self._lock:
            folder = self._system_files
            if folder is None or not folder.is_dir():
                system = self.workspaces.root / ".system"
                folder = stage_etc(system / f"etc-{os.getpid()}")
                os.chmod(self.workspaces.root, 0o700)
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
            return result(is_error=True, output="[cancelled]", outcome="cancelled")
        if self._bwrap is None or not self._msgqueue_ok:
            missing = (
                "bubblewrap (bwrap) not found"
                if self._bwrap is None
                else "RLIMIT_MSGQUEUE cannot be lowered"
            )
            return result(
                is_error=True, output=f"[sandbox unavailable: {missing}]", outcome="error"
            )

        timeout = tool.timeout_seconds or agent.settings.tool_timeout_seconds
        try:
            workspace = self.workspaces.for_turn(agent.id, turn)
        except (OSError, ValueError) as exc:
            return result(
                is_error=True, output=f"[sandbox error: workspace: {exc}]", outcome="error"
            )
        cgroup: CallCgroup | None = None
        outbox_dir: Path | None = None
        try:
            ensure_mount_point(workspace / "outbox")
            outbox_dir = self.workspaces.new_outbox()
            if self._cgroups.controllers:
                try:
                    cgroup = self._cgroups.create(memory_bytes=agent.settings.memory_limit_mb * MIB)
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
            )
            outbox = collect_outbox(outbox_dir, self.outbox_cap_bytes)
        except (OSError, ValueError) as exc:
            return result(is_error=True, output=f"[sandbox error: {exc}]", outcome="error")
        finally:
            oom = cgroup.memory_failures() if cgroup is not None else 0
            if cgroup is not None:
                cgroup.remove()
            if outbox_dir is not None:
                self.workspaces.discard(outbox_dir)
            if self.workspaces.is_one_call(workspace):
                self.workspaces.discard(workspace)
            else:
                self.workspaces.touch(workspace)

        files = {"files": outbox.files, "skipped_files": outbox.skipped}
        limit = agent.settings.tool_output_chars
        if finished.reason == "timeout":
            return result(is_error=True, output=timed_out_text(timeout), outcome="timeout", **files)
        if finished.reason == "cancelled":
            return result(is_error=True, output="[cancelled]", outcome="cancelled", **files)
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
        code = finished.returncode
        assert code is not None
        if text.startswith(("bwrap: ", "sh: ")):
            # bwrap's (or the cgroup wrapper's) own error: the command never ran,
            # and the message may name host paths the model must not see.
            text = self._scrub(text, agent, workspace, cgroup)
        if not finished.text and not finished.dropped_chars:
            text, dropped = f"[exit code {code}]", 0
        name = _signal_name(code) if code else None
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
            options = bwrap_options(layout, seccomp_fd=seccomp_fd)
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
            limits = Limits.for_agent(agent.settings).ulimit_script()
            argv = [
                *wrapper_argv(cgroup.procs_files if cgroup is not None else [], limits),
                self._bwrap,
                "--args",
                str(args_fd),
                "--",
                *COMMAND_PREFIX,
                *command,
            ]
            return run_process(
                argv,
                stdin=stdin,
                env=spawn_env(),
                pass_fds=(seccomp_fd, args_fd),
                timeout=timeout,
                keep_chars=agent.settings.tool_output_chars,
                hard_cap_bytes=self.output_hard_cap_bytes,
                cancel=cancel,
            )
        finally:
            os.close(seccomp_fd)
            if args_fd >= 0:
                os.close(args_fd)
