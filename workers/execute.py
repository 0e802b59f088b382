"""The plain function behind every task: look the call up, check it, run it.

Celery tasks stay thin (decode, call `Executor.run`, store); everything here is
testable without Celery. Nothing a caller sends can make this raise: an unknown
agent or tool, bad arguments, or a tool of the other worker kind all end as an
error `ToolResult` the model can read.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from broker.errors import RefusedCall, UnknownAgent, UnknownTool
from broker.model import Agent, DeclaredTool, Deployment, PluginTool
from broker.protocol import CallRequest, Initiator, ToolResult
from workers.arguments import parse_arguments

if TYPE_CHECKING:
    from workers.sandbox.runner import SandboxRunner
    from workers.service.caller import ServiceCaller

__all__ = ["Executor", "PluginRuns", "refused_result"]


class PluginRuns(Protocol):
    """What runs plugin tools (`workers.plugin.PluginRunner`)."""

    def run(
        self,
        *,
        call_id: str,
        agent: Agent,
        tool: PluginTool,
        arguments: dict[str, Any],
        owner: str,
        turn: str | None,
        initiator: Initiator,
        cancel: threading.Event | None = None,
    ) -> ToolResult: ...

    def close(self) -> None: ...


def refused_result(request: CallRequest, text: str, *, started: float | None = None) -> ToolResult:
    """A call that never ran: the model is told why."""
    elapsed = 0.0 if started is None else (time.monotonic() - started) * 1000
    return ToolResult.error(request, text, outcome="refused", duration_ms=elapsed)


class Executor:
    """Runs calls for one worker kind; the other kind's runner is None."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        sandbox: SandboxRunner | None = None,
        service: ServiceCaller | None = None,
        plugin: PluginRuns | None = None,
    ) -> None:
        self.deployment = deployment
        self.sandbox = sandbox
        self.service = service
        self.plugin = plugin

    def run(self, request: CallRequest, cancel: threading.Event | None = None) -> ToolResult:
        started = time.monotonic()
        try:
            agent = self.deployment.agent(request.agent)
            tool = agent.tool(request.tool)
            arguments = parse_arguments(
                tool, request.arguments, max_bytes=agent.settings.max_argument_bytes
            )
        except (UnknownAgent, UnknownTool) as exc:
            return refused_result(request, str(exc), started=started)
        except RefusedCall as exc:
            return refused_result(request, exc.model_text, started=started)

        if isinstance(tool, DeclaredTool):
            if self.sandbox is None:
                return refused_result(
                    request, f"{tool.name}: this worker runs no declared tools", started=started
                )
            return self.sandbox.run(
                call_id=request.call_id,
                agent=agent,
                tool=tool,
                arguments=arguments,
                turn=request.turn,
                cancel=cancel,
            )
        if isinstance(tool, PluginTool):
            if self.plugin is None:
                return refused_result(
                    request, f"{tool.name}: this worker runs no plugin tools", started=started
                )
            return self.plugin.run(
                call_id=request.call_id,
                agent=agent,
                tool=tool,
                arguments=arguments,
                owner=request.owner,
                turn=request.turn,
                initiator=request.initiator,
                cancel=cancel,
            )
        if self.service is None:
            return refused_result(
                request, f"{tool.name}: this worker calls no services", started=started
            )
        return self.service.call(
            call_id=request.call_id,
            agent=agent,
            tool=tool,
            arguments=arguments,
            owner=request.owner,
            cancel=cancel,
        )
