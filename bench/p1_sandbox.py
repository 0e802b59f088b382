"""P1 sandbox: one call through the full runner vs raw bwrap vs bare subprocess.

Four contenders per tool, in turns in this process: `subprocess.run` of the
command (no confinement, the floor), raw `bwrap` with the runner's namespaces
and mounts (`bench.baselines.raw_bwrap_argv`), the same raw bwrap with the
seccomp filter and the environment rule the seeds require of every call
(`bench.baselines.raw_bwrap_seeded_run`: the main goal's baseline), and
`workers.sandbox.runner.SandboxRunner.run` (seccomp, rlimits, workspace,
output shaping included), with per-call cgroups (the default) and with
`VESSEL_SANDBOX_CGROUPS=off`. Tools: `/bin/true` (the sandbox's own cost) and a
small Python tool reading JSON on stdin (a typical tool's start-up).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.baselines import SandboxLayout, bare_run, raw_bwrap_run, raw_bwrap_seeded_run
from bench.context import Context
from bench.deployment import TOOL_ECHO, TOOL_TRUE, write_package
from bench.report import Goal, Row
from bench.turns import PAUSE_SECONDS, WrongResult, in_turns

__all__ = ["GOAL", "run"]

#: Issue 20: against raw bwrap with the same seccomp filter and environment rule.
GOAL = Goal(median_max=1.1, p99_max=1.3)
#: Against plain raw bwrap (no filter, PWD left in the environment): the older goal.
GOAL_PLAIN = Goal(median_max=1.3, p99_max=1.5)
_ECHO_ARGUMENTS = {"greeting": "hello"}


def _build(folder: Path, cgroups: str | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """The runner, the agent and its two tools, built from the model dataclasses.

    `cgroups`: the runner's VESSEL_SANDBOX_CGROUPS (None: the environment's).
    """
    from broker.model import Agent, AgentSettings, DeclaredTool
    from workers.sandbox.cgroup import CgroupSettings, parse_mode
    from workers.sandbox.runner import SandboxRunner
    from workers.sandbox.workspace import WorkspaceStore

    package = write_package(folder)
    data = folder / "data"
    data.mkdir(exist_ok=True)
    settings = AgentSettings(
        workdir="/data",
        tool_timeout_seconds=30,
        tool_output_chars=20_000,
        disk_limit_mb=256,
        memory_limit_mb=512,
    )
    tools = {
        TOOL_TRUE: DeclaredTool(
            name=TOOL_TRUE,
            description="does nothing",
            parameters={"type": "object", "properties": {}},
            scope="tools:read",
            timeout_seconds=30,
            source=package / "tools" / "noop.toml",
            command=("/bin/true",),
            input="args",
        ),
        TOOL_ECHO: DeclaredTool(
            name=TOOL_ECHO,
            description="echoes",
            parameters={"type": "object", "properties": {}},
            scope="tools:read",
            timeout_seconds=30,
            source=package / "tools" / "echo.toml",
            command=("python3", "/agent/tools/echo.py"),
            input="json-stdin",
        ),
    }
    agent = Agent(
        id="bench-p1",
        package_dir=package,
        settings=settings,
        tools=tools,
        mounts={"/data": data},
        grants={},
        max_concurrent_calls=16,
    )
    workspaces = folder / "workspaces"
    workspaces.mkdir(exist_ok=True)
    chosen = None if cgroups is None else CgroupSettings(mode=parse_mode(cgroups))
    runner = SandboxRunner(WorkspaceStore(workspaces), cgroups=chosen)
    return runner, agent, tools


def _expect_exit_zero(done: Any) -> None:
    if done.returncode != 0:
        raise WrongResult(f"exit {done.returncode}: {done.stderr[-300:]!r}")


def _expect_echo(done: Any) -> None:
    _expect_exit_zero(done)
    if json.loads(done.stdout) != {"echo": _ECHO_ARGUMENTS}:
        raise WrongResult(f"unexpected output {done.stdout[:200]!r}")


def run(ctx: Context) -> list[Row]:
    iterations_true, iterations_echo, warmup = (5, 3, 2) if ctx.quick else (400, 80, 30)
    folder = ctx.folder / "p1"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        runner, agent, tools = _build(folder, "per-call")
        runner_off = _build(folder, "off")[0]
        missing = None
    except ImportError as exc:
        runner = runner_off = agent = tools = None
        missing = f"not measured: the sandbox runner is not importable ({exc})"
    layout = SandboxLayout(
        package=folder / "agents" / "bench", data=folder / "data", workspace=folder / "raw-ws"
    )
    layout.workspace.mkdir(exist_ok=True)
    if not (layout.package / "tools" / "echo.py").exists():
        write_package(folder)
        layout.data.mkdir(exist_ok=True)
    echo_host = ["/usr/bin/python3", str(layout.package / "tools" / "echo.py")]
    stdin = json.dumps(_ECHO_ARGUMENTS).encode()
    expected = {"echo": _ECHO_ARGUMENTS}

    def ours(tool_name: str, arguments: dict[str, Any], expect: Any, which: Any = None) -> None:
        assert runner is not None and tools is not None
        result = (which or runner).run(
            call_id=uuid.uuid4().hex,
            agent=agent,
            tool=tools[tool_name],
            arguments=arguments,
            turn=None,
        )
        if result.is_error or result.exit_code != 0:
            raise WrongResult(f"error result: {result.output[:300]!r}")
        if expect is not None and json.loads(result.output) != expect:
            raise WrongResult(f"unexpected output {result.output[:200]!r}")

    true_contenders: dict[str, Callable[[], object]] = {
        "bare": lambda: _expect_exit_zero(bare_run(["/bin/true"])),
        "raw_bwrap": lambda: _expect_exit_zero(raw_bwrap_run(["/bin/true"], layout)),
        "raw_seeded": lambda: _expect_exit_zero(raw_bwrap_seeded_run(["/bin/true"], layout)),
    }
    echo_contenders: dict[str, Callable[[], object]] = {
        "bare": lambda: _expect_echo(bare_run(echo_host, stdin)),
        "raw_bwrap": lambda: _expect_echo(
            raw_bwrap_run(["python3", "/agent/tools/echo.py"], layout, stdin)
        ),
        "raw_seeded": lambda: _expect_echo(
            raw_bwrap_seeded_run(["python3", "/agent/tools/echo.py"], layout, stdin)
        ),
    }
    if missing is None:
        true_contenders["runner"] = lambda: ours(TOOL_TRUE, {}, None)
        echo_contenders["runner"] = lambda: ours(TOOL_ECHO, _ECHO_ARGUMENTS, expected)
        true_contenders["runner_off"] = lambda: ours(TOOL_TRUE, {}, None, runner_off)
        echo_contenders["runner_off"] = lambda: ours(
            TOOL_ECHO, _ECHO_ARGUMENTS, expected, runner_off
        )
    true_turns = in_turns(
        true_contenders, iterations=iterations_true, warmup=warmup, pause_seconds=PAUSE_SECONDS
    )
    echo_turns = in_turns(
        echo_contenders,
        iterations=iterations_echo,
        warmup=max(3, warmup // 3),
        pause_seconds=PAUSE_SECONDS,
    )

    rows = []
    for label, turns in (("/bin/true", true_turns), ("python tool", echo_turns)):
        rows.append(
            Row(
                mode="P1",
                name=f"{label}: runner vs raw bwrap + seccomp + env rule",
                unit="ms",
                baseline_name="raw bwrap, the runner's seccomp filter, env -u PWD",
                baseline_samples=turns.samples["raw_seeded"],
                ours_samples=turns.samples.get("runner", []),
                goal=GOAL,
                skipped=missing,
                errors=turns.errors_of("raw_seeded", "runner"),
            )
        )
        rows.append(
            Row(
                mode="P1",
                name=f"{label}: runner vs raw bwrap",
                unit="ms",
                baseline_name="raw bwrap",
                baseline_samples=turns.samples["raw_bwrap"],
                ours_samples=turns.samples.get("runner", []),
                goal=GOAL_PLAIN,
                skipped=missing,
                errors=turns.errors_of("raw_bwrap"),
            )
        )
        rows.append(
            Row(
                mode="P1",
                name=f"{label}: runner (cgroups off) vs raw bwrap",
                unit="ms",
                baseline_name="raw bwrap",
                ours_name="runner, VESSEL_SANDBOX_CGROUPS=off",
                baseline_samples=turns.samples["raw_bwrap"],
                ours_samples=turns.samples.get("runner_off", []),
                goal=GOAL_PLAIN,
                skipped=missing,
                errors=turns.errors_of("runner_off"),
            )
        )
        rows.append(
            Row(
                mode="P1",
                name=f"{label}: runner vs subprocess.run",
                unit="ms",
                baseline_name="subprocess.run",
                baseline_samples=turns.samples["bare"],
                ours_samples=turns.samples.get("runner", []),
                skipped=missing,
                errors=turns.errors_of("bare"),
                notes="no goal: what confinement costs over no confinement",
            )
        )
        rows.append(
            Row(
                mode="P1",
                name=f"{label}: raw bwrap vs subprocess.run",
                unit="ms",
                baseline_name="subprocess.run",
                ours_name="raw bwrap",
                baseline_samples=turns.samples["bare"],
                ours_samples=turns.samples["raw_bwrap"],
                notes="no goal: bubblewrap's own cost, for reference (DESIGN.md: 3.3 ms)",
            )
        )
    return rows
