"""The pieces of one worker process, shared by `run_worker` and `embedded_client`.

`build_executor` makes the runner of one kind (each kind imports only its own),
`build_runtime` the Celery app with that kind's task registered, `on_cancel_message`
handles the cancel channel and `close_executor` releases what the runners hold.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from celery import Celery

from broker.admission import Admission
from broker.admission.keys import END_TURN_PREFIX
from broker.celery_app import longest_timeout, make_app
from broker.config import Settings
from broker.model import Deployment
from broker.queues import Kind
from workers.execute import Executor
from workers.metrics import watch_standbys
from workers.tasks import CallRuntime, register_tasks
from workers.workspace_ops import register_workspace_ops

if TYPE_CHECKING:
    from workers.plugin.host.workspace import WorkspaceFiles
    from workers.sandbox.workspace import WorkspaceStore

__all__ = ["build_executor", "build_runtime", "close_executor", "on_cancel_message"]

_log = logging.getLogger(__name__)


def build_executor(
    deployment: Deployment,
    kind: Kind,
    agents: Sequence[str] | None = None,
    *,
    plugins: Sequence[str] | None = None,
    workspace_files: WorkspaceFiles | None = None,
) -> tuple[Executor, WorkspaceStore | None]:
    """The executor of one worker kind, and its workspaces (sandbox).

    `plugins` limits whose settings a plugin worker resolves (default: all);
    `workspace_files` is where its `host.workspace` works (default: this
    host's workspace root, as the embedded default's declared tools use it).
    Raises ConfinementUnavailable (sandbox), MissingSecret (service, plugin).
    """
    # Each kind imports only its own runner: a sandbox worker never loads the
    # service caller (nor its secrets), and `call` starts faster.
    if kind == "sandbox":
        from workers.sandbox.probe import check_confinement  # noqa: PLC0415
        from workers.sandbox.runner import SandboxRunner  # noqa: PLC0415
        from workers.sandbox.workspace import (  # noqa: PLC0415
            WorkspaceStore,
            default_workspace_root,
        )

        check_confinement()
        workspaces = WorkspaceStore(default_workspace_root())
        sandbox = SandboxRunner(workspaces)
        watch_standbys(sandbox)
        _log.info("sandbox: VESSEL_SANDBOX_CGROUPS in force: %s", sandbox.cgroup_mode)
        _log.info("sandbox: VESSEL_SANDBOX_NETWORK in force: %s", sandbox.network_mode)
        _log.info("sandbox: VESSEL_SANDBOX_STANDBY in force: %s", sandbox.standby_mode)
        return Executor(deployment, sandbox=sandbox), workspaces
    if kind == "plugin":
        from workers.plugin.host import PluginHost  # noqa: PLC0415
        from workers.plugin.runner import PluginRunner  # noqa: PLC0415
        from workers.sandbox.workspace import (  # noqa: PLC0415
            WorkspaceStore,
            default_workspace_root,
        )

        # Plugin workers hold the plugins' settings secrets. None is returned:
        # removing a turn's workspaces is the sandbox workers' job.
        bridge = PluginHost(
            deployment,
            workspaces=workspace_files or WorkspaceStore(default_workspace_root()),
            plugins=plugins,
        )
        try:
            runner = PluginRunner(deployment, bridge)
        except BaseException:
            bridge.close()
            raise
        return Executor(deployment, plugin=runner), None
    from workers.service.caller import ServiceCaller  # noqa: PLC0415

    caller = ServiceCaller(deployment, agents=agents or None)
    return Executor(deployment, service=caller), None


def build_runtime(
    deployment: Deployment,
    settings: Settings,
    kind: Kind,
    *,
    admission: Admission,
    executor: Executor,
    hostname: str,
    host_id: str | None = None,
    workspaces: WorkspaceStore | None = None,
) -> CallRuntime:
    """The Celery app of `deployment` with its task of `kind` registered on `runtime.app`.

    With `workspaces` (sandbox), the workspace operations' task too; with
    `host_id`, calls of a turn run at the turn's home only.
    """
    app: Celery = make_app(settings, longest_tool_seconds=longest_timeout(deployment))
    runtime = CallRuntime(
        app=app,
        admission=admission,
        executor=executor,
        deployment=deployment,
        kind=kind,
        hostname=hostname,
        settings=settings,
        host_id=host_id,
        workspaces=workspaces,
    )
    register_tasks(app, runtime)
    if workspaces is not None:
        register_workspace_ops(app, runtime)
    return runtime


def on_cancel_message(
    runtime: CallRuntime, workspaces: WorkspaceStore | None, message: str
) -> None:
    """A message on the cancel channel: a call id to stop, or a turn that ended."""
    if not message.startswith(END_TURN_PREFIX):
        runtime.on_cancel(message)
        return
    if workspaces is not None:
        turn = message.removeprefix(END_TURN_PREFIX)
        for agent in runtime.deployment.agents:
            workspaces.end_turn(agent, turn)


def close_executor(executor: Executor) -> None:
    """Stop what the runners hold: HTTP clients, slot launchers, runtime processes."""
    if executor.service is not None:
        executor.service.close()
    if executor.sandbox is not None:
        executor.sandbox.close()  # its slot launchers and their cgroups
    if executor.plugin is not None:
        executor.plugin.close()  # its runtime processes
        bridge = getattr(executor.plugin, "bridge", None)
        if bridge is not None:
            bridge.close()
