"""The embedded default: a client with an in-process broker, admission and worker.

With `VESSEL_BROKER_URL` unset, `vessel-workers call` and `vessel-workers mcp`
run the call the whole way it goes in production, in this process
(`broker.embedded`): the client submits through admission (`LocalAdmission`),
a Celery worker thread built as a worker builds one (`workers.assembly`) runs it, and the
result comes back through the in-memory result backend. Its housekeeping is a
worker's (`workers.housekeeping`): a long-lived embedded MCP server sweeps
expired workspaces and kills idle standbys as a sandbox worker does, and every
embedded client, a one-off call's too, sweeps expired workspaces once as it starts.

It is where the two sides meet, like the command line: the worker modules
themselves never import the client (tests/test_layering.py).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from broker.admission import Admission, LocalAdmission
from broker.client import VesselClient
from broker.config import Settings
from broker.embedded import embedded_worker
from broker.model import Deployment
from broker.queues import Kind, shared_lane
from workers.assembly import build_executor, build_runtime, close_executor, on_cancel_message
from workers.housekeeping import Housekeeper

__all__ = ["embedded_client"]

_log = logging.getLogger(__name__)


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
    housekeeper = Housekeeper(runtime, {lane: 2}, _workspaces)
    if _workspaces is not None:
        # The housekeeper's first workspace sweep comes a minute in, which a one-off
        # `vessel-workers call --turn …` never reaches: without this, the turns of
        # one-off calls would keep their workspaces for ever. Before any call, so no
        # call of this process races the sweep for its turn's folder.
        try:
            _workspaces.sweep()
        except OSError as exc:
            _log.warning("embedded: could not sweep expired workspaces: %s", exc)
    try:
        with embedded_worker(app, queues=[lane], concurrency=2):
            housekeeper.start()  # its first beat opens the lane
            try:
                yield VesselClient(deployment, settings, app=app, admission=admission)
            finally:
                housekeeper.stop()
    finally:
        subscription.close()
        close_executor(executor)
