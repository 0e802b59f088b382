"""The embedded default: a client with an in-process broker, admission and worker.

`vessel-workers call`, `files` and `mcp` use it when no broker URL is set; it
runs calls with the same executor and task as a worker (`workers.assembly`).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from broker.admission import Admission
from broker.client import VesselClient, publish
from broker.config import Settings
from broker.embedded import LocalAdmission, embedded_worker
from broker.model import Deployment
from broker.queues import Kind, shared_lane
from workers.assembly import build_executor, build_runtime, close_executor, on_cancel_message

__all__ = ["embedded_client"]


@contextmanager
def embedded_client(
    deployment: Deployment,
    settings: Settings,
    kind: Kind,
    agents: Sequence[str] | None = None,
    *,
    plugins: Sequence[str] | None = None,
) -> Iterator[VesselClient]:
    """A client with an in-process broker, admission and worker of `kind`.

    `agents` limits whose secrets a service worker resolves, `plugins` whose
    settings a plugin worker resolves (default: all). Raises
    ConfinementUnavailable (sandbox) or MissingSecret (service, plugin) before
    anything starts.
    """
    executor, _workspaces = build_executor(deployment, kind, agents, plugins=plugins)
    admission: Admission = LocalAdmission()
    hostname = f"embedded-{os.getpid()}@{socket.gethostname()}"
    # One host: every turn's home, so no home lane (LocalAdmission never moves a call).
    runtime = build_runtime(
        deployment,
        settings,
        kind,
        admission=admission,
        executor=executor,
        hostname=hostname,
        workspaces=_workspaces,
    )
    app = runtime.app
    lane = shared_lane(kind)
    subscription = admission.listen_cancels(
        functools.partial(on_cancel_message, runtime, _workspaces)
    )
    try:
        with embedded_worker(app, queues=[lane], concurrency=2):
            publish(app, admission.heartbeat(kind, hostname, {lane: 2}, 0))
            yield VesselClient(deployment, settings, app=app, admission=admission)
    finally:
        subscription.close()
        close_executor(executor)
