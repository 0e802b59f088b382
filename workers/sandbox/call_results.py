"""The texts a call's outcome is told with, and the `ToolResult` of a finished call.

`finished_result` turns what `process.run_process` / `run_child` saw (exit
status, output, why it stopped) into the model-facing result: the seeds' texts
for a timeout, a cancel, an output flood, a workspace past its limit, the CPU
limit, a signal (and the memory cap behind a SIGKILL), bwrap's own set-up
errors with host paths replaced by their sandbox names.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.constants import PACKAGE_PATH, SANDBOX_HOME
from broker.model import Agent, AgentSettings
from broker.protocol import CANCELLED_TEXT, ToolResult, format_seconds
from workers.output import cut_output
from workers.sandbox.cgroup import CallCgroup
from workers.sandbox.limits import MIB, Limits
from workers.sandbox.process import Finished
from workers.sandbox.watchdog import Usage

__all__ = [
    "cpu_limit_text",
    "finished_result",
    "scrub_host_paths",
    "timed_out_text",
    "workspace_limit_text",
]

_SIGNAL_BASE = 128  # bwrap reports a command killed by signal N as exit status 128+N
#: Set-up errors printed before the tool's command ran (bwrap's, the direct
#: path's wrapper's, a launcher child's): they may name host paths.
_SETUP_ERROR_PREFIXES = ("bwrap: ", "sh: ", "launcher: ")


def timed_out_text(seconds: float) -> str:
    """Seed 000: `[timed out after N s]`."""
    return f"[timed out after {format_seconds(seconds)} s]"


def workspace_limit_text(usage: Usage | None, settings: AgentSettings, *, started: bool) -> str:
    """The turn's workspace passed workspace_limit_mb or workspace_files (`watchdog.py`):
    `[the turn's workspace passed its limit of 1024 MB: the tool was stopped]`, `... of
    100000 files ...`; before the call (`started` False) `...: the tool was not run]`.
    `usage` None (the watch stopped the call without a reading) counts as unmeasurable."""
    end = "the tool was stopped" if started else "the tool was not run"
    if usage is None:
        return f"[the turn's workspace cannot be measured (no reading): {end}]"
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


def finished_result(
    result: Callable[..., ToolResult],
    finished: Finished,
    *,
    settings: AgentSettings,
    timeout: float,
    limits: Limits,
    usage: Usage | None,
    files: dict[str, Any],
    oom: int,
    hard_cap_bytes: int,
    prefix_program: str,
    prefix_missing: str,
    scrub: Callable[[str], str],
) -> ToolResult:
    """The result of a call that ran: `result(**fields)` makes it (with the call's ids
    and duration), `files` the outbox's fields, `usage` the watch's reading (a workspace
    past its limit), `oom` the memory cap's hits during the call, `prefix_program` the
    command prefix bwrap executes (its absence: `prefix_missing`), `scrub` the host
    paths of a set-up error replaced."""
    if finished.reason == "timeout":
        return result(is_error=True, output=timed_out_text(timeout), outcome="timeout", **files)
    if finished.reason == "cancelled":
        return result(is_error=True, output=CANCELLED_TEXT, outcome="cancelled", **files)
    text, dropped = cut_output(
        finished.text, settings.tool_output_chars, already_dropped=finished.dropped_chars
    )
    if finished.reason == "overflow":
        cap = format_seconds(hard_cap_bytes / MIB)
        return result(
            is_error=True,
            output=f"{text}\n[output passed {cap} MiB: the tool was killed]",
            dropped_chars=dropped,
            outcome="killed",
            **files,
        )
    if finished.reason == "limit":
        note = workspace_limit_text(usage, settings, started=True)
        return result(
            is_error=True,
            output=f"{text}\n{note}" if text else note,
            dropped_chars=dropped,
            outcome="killed",
            **files,
        )
    code = finished.returncode
    if code is None:  # "exited" always has a status (`process.Finished`)
        return result(
            is_error=True,
            output="[sandbox error: the tool's exit status is unknown]",
            outcome="error",
            **files,
        )
    if text.startswith(f"bwrap: execvp {prefix_program}:"):
        # The prefix went missing after start-up: the tool never ran.
        return result(is_error=True, output=prefix_missing, outcome="error")
    if text.startswith(_SETUP_ERROR_PREFIXES):
        # bwrap's (or the wrapper's, or the launcher's) own error: the command
        # never ran, and the message may name host paths the model must not see.
        text = scrub(text)
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
        why = f"; memory_limit_mb ({settings.memory_limit_mb}) reached" if oom else ""
        text += f"\n[killed by signal {name}{why}]"
    return result(
        is_error=code != 0,
        output=text,
        dropped_chars=dropped,
        exit_code=code,
        outcome="ok" if code == 0 else "error",
        **files,
    )


def scrub_host_paths(
    text: str, agent: Agent, workspace: Path, cgroup: CallCgroup | None, workspaces_root: Path
) -> str:
    """Replace host paths in a set-up error by their sandbox names (longest first)."""
    pairs = [(str(src), target) for target, src in agent.mounts.items()]
    pairs += [(str(agent.package_dir), PACKAGE_PATH), (str(workspace), SANDBOX_HOME)]
    pairs += [(str(d), "<cgroup>") for d in (cgroup.dirs if cgroup is not None else ())]
    pairs.append((str(workspaces_root), "<workspaces>"))
    for host, shown in sorted(pairs, key=lambda p: -len(p[0])):
        text = text.replace(host, shown)
    return text
