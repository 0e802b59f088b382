"""Fixtures for the sandbox tests: agents and tools built straight from the
broker.model dataclasses (no loader), scripts written into tmp_path, and one real
SandboxRunner per test over a workspace root in tmp_path."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker.constants import DEFAULT_CPU_LIMIT, DEFAULT_WORKSPACE_FILES, DEFAULT_WORKSPACE_LIMIT_MB
from broker.model import Agent, AgentSettings, DeclaredTool
from broker.result import ToolResult
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.workspace import WorkspaceStore


@dataclass
class Sandbox:
    """A package folder, a data folder mounted at /data, and a runner."""

    root: Path
    package: Path
    data: Path
    runner: SandboxRunner
    calls: list[float] = field(default_factory=list)

    def agent_and_tool(
        self,
        script: str | None = None,
        *,
        shell: str | None = None,
        command: tuple[str, ...] | None = None,
        name: str = "probe",
        input: str = "json-stdin",
        timeout: float = 2.0,
        output_chars: int = 2000,
        disk_mb: int = 16,
        memory_mb: int = 256,
        workspace_mb: int = DEFAULT_WORKSPACE_LIMIT_MB,
        workspace_files: int = DEFAULT_WORKSPACE_FILES,
        cpu_limit: float = DEFAULT_CPU_LIMIT,
        workdir: str = "/data",
        mounts: Mapping[str, Path] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> tuple[Agent, DeclaredTool]:
        if script is not None:
            (self.package / "tools").mkdir(exist_ok=True)
            path = self.package / "tools" / f"{name}.py"
            path.write_text(script)
            command = ("python3", f"/agent/tools/{name}.py")
        elif shell is not None:
            command = ("/bin/sh", "-c", shell)
        assert command is not None
        tool = DeclaredTool(
            name=name,
            description="a test tool",
            parameters=parameters or {"type": "object", "properties": {}},
            scope="tools:read",
            timeout_seconds=timeout,
            source=self.package / "tools" / f"{name}.toml",
            command=command,
            input=input,  # type: ignore[arg-type]
        )
        agent = Agent(
            id="test-agent",
            package_dir=self.package,
            settings=AgentSettings(
                workdir=workdir,
                tool_timeout_seconds=timeout,
                tool_output_chars=output_chars,
                disk_limit_mb=disk_mb,
                memory_limit_mb=memory_mb,
                workspace_limit_mb=workspace_mb,
                workspace_files=workspace_files,
                cpu_limit=cpu_limit,
            ),
            tools={name: tool},
            mounts=dict(mounts) if mounts is not None else {"/data": self.data},
            grants={},
            max_concurrent_calls=4,
        )
        return agent, tool

    def call(
        self,
        script: str | None = None,
        arguments: dict[str, Any] | None = None,
        *,
        turn: str | None = None,
        cancel: Any = None,
        **options: Any,
    ) -> ToolResult:
        agent, tool = self.agent_and_tool(script, **options)
        started = time.monotonic()
        try:
            return self.runner.run(
                call_id="call-1",
                agent=agent,
                tool=tool,
                arguments=arguments or {},
                turn=turn,
                cancel=cancel,
            )
        finally:
            self.calls.append(time.monotonic() - started)

    def workspace(self, turn: str) -> Path:
        """The host folder of a turn's workspace (/tmp/vessel inside)."""
        return self.runner.workspaces.for_turn("test-agent", turn)


def make_sandbox(root: Path) -> Sandbox:
    """A runner with its package, data and workspaces under `root`; close its runner."""
    package = root / "package"
    data = root / "data"
    package.mkdir()
    data.mkdir()
    runner = SandboxRunner(WorkspaceStore(root / "workspaces"))
    return Sandbox(root=root, package=package, data=data, runner=runner)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    made = make_sandbox(tmp_path)
    runner = made.runner
    yield made
    runner.close()
    made.runner.close()  # a test may have put its own runner in


class Marked:
    """Processes a test starts inside the sandbox, found on the host by a tag.

    `loop` is a shell loop that appends to /tmp/vessel/marker with the tag in its
    command line; `gone()` is True once no process on the host has the tag in
    its command line (a zombie has none): a proof by process, not by a file
    that stopped growing while its writer may only have been descheduled.
    """

    def __init__(self) -> None:
        self.tag = f"vessel-test-{uuid.uuid4().hex}"
        self.loop = f"while :; do echo x >> /tmp/vessel/marker; sleep 0.05; done # {self.tag}"

    def pids(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:  # it ended while we looked
                    continue
                if self.tag.encode() in cmdline:
                    found.append(int(entry))
        return found

    def gone(self, seconds: float = 10.0) -> bool:
        """True once every tagged process has ended (waits up to `seconds` for it)."""
        deadline = time.monotonic() + seconds
        while self.pids():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


@pytest.fixture
def marked() -> Marked:
    """A tag for the processes a test starts, and the proof they are gone (`Marked`)."""
    return Marked()


#: A Python fork bomb that reports how many forks it got before one was refused.
FORK_BOMB = (
    "import os, time\n"
    "n = 0\n"
    "for _ in range(100000):\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30); os._exit(0)\n"
    "        n += 1\n"
    "    except OSError as exc:\n"
    "        print('fork refused after', n, exc); break\n"
)
