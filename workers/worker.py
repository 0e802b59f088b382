"""Worker start-up: everything a worker process needs before and beside Celery.

`run_worker` checks, in this order, and refuses to start (ConfigError and
friends, exit 2 in the command) when one fails:

1. the deployment loads, and `--agents` names agents it has;
2. sandbox workers: confinement works here (`check_confinement`);
   service workers: every grant's `env:` value is set (`ServiceCaller`);
   plugin workers: every plugin setting's and `[platform]`'s `env:` value is
   set (`PluginHost`), and each plugin's sources, run confined here, still
   register what its `plugin.lock.json` records (`check_plugin_locks`);
3. the broker's Redis answers: a worker started before its Redis waits for
   it, one log line per attempt, up to VESSEL_BROKER_OUTAGE_SECONDS
   (`workers.outage`), then refuses with one line;
4. Redis runs with `maxmemory-policy noeviction` (an evicting Redis drops
   queued calls and results silently); if the provider disables CONFIG, a
   warning is logged and the worker starts.

A sandbox worker belongs to a host, `VESSEL_HOST_ID` (default: the machine's
hostname), which names its workspace root: it consumes its lane (shared or
dedicated) and that lane's home lane `<lane>@<host>`, where the calls of turns
homed on its host come (`broker.admission`, "Turns and homes"), and it runs the
workspace operations of `client.files` (`workers.workspace_ops`). On SIGTERM its
running calls finish first; when a host's last worker has left, its turns are
homed again at their next call, with the lost-workspace note.

Then it starts, beside the Celery worker: the heartbeat that registers this
worker's capacity on its lanes (admission sizes each lane's window from it), the
recovery sweep (calls of dead workers), the workspace sweep (sandbox), the
cancel listener, and the metrics endpoint if asked. On SIGTERM Celery shuts down
warm: running calls finish and store their results; then the worker leaves its
lanes. A broker outage is ridden out (`workers.outage`, docs/broker-outages.md);
one longer than VESSEL_BROKER_OUTAGE_SECONDS stops the worker with one line.

Its parts: `workers.preflight` (the checks before start-up), `workers.assembly`
(the executor and the Celery app with its task), `workers.housekeeping` (the
heartbeat and sweeps); `workers.embedded.embedded_client` builds the same pieces
in-process for the embedded default.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery.utils.nodenames import default_nodename, host_format

from broker import fast_path
from broker.admission import RedisAdmission, Subscription
from broker.config import Settings, hide_password
from broker.connect import redis_client
from broker.errors import MissingBrokerURL
from broker.model import Deployment
from broker.queues import WORKSPACE_KINDS, Kind, dedicated_lane, home_lane, shared_lane
from workers.assembly import build_executor, build_runtime, close_executor, on_cancel_message
from workers.banner import startup_lines, worker_class
from workers.housekeeping import Housekeeper
from workers.metrics import start_metrics_server
from workers.outage import OutageExit, consumer_class, wait_for_broker
from workers.preflight import check_eviction_policy, check_plugin_locks, host_id_from_environ
from workers.tasks import CallRuntime

if TYPE_CHECKING:
    import redis

__all__ = ["DEFAULT_CONCURRENCY", "WorkerOptions", "lanes_for", "run_worker"]

_log = logging.getLogger(__name__)

#: Sandbox calls are processes on this host: one per core keeps them from
#: starving each other. Service calls wait on the network: many per process.
#: Plugin calls run in warm runtime processes, one call each at a time, and
#: often wait on host.fetch: two per core.
DEFAULT_CONCURRENCY: dict[Kind, int] = {
    "sandbox": os.cpu_count() or 2,
    "service": 32,
    "plugin": 2 * (os.cpu_count() or 2),
}


def lanes_for(kind: Kind, agents: Sequence[str] | None, host_id: str | None = None) -> list[str]:
    """The shared lane, or the dedicated lanes of `agents`; with `host_id`, each
    followed by its home lane on that host."""
    lanes = [dedicated_lane(kind, agent) for agent in agents] if agents else [shared_lane(kind)]
    if host_id is None:
        return lanes
    return [lane for base in lanes for lane in (base, home_lane(base, host_id))]


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerOptions:
    kind: Kind
    agents: tuple[str, ...] = ()
    concurrency: int | None = None
    pool: str = "threads"
    hostname: str | None = None
    loglevel: str = "INFO"
    metrics_port: int | None = None


def _hostname(options: WorkerOptions) -> str:
    if options.hostname:
        return str(host_format(options.hostname))
    return str(default_nodename(f"{options.kind}-{os.getpid()}"))


def run_worker(deployment: Deployment, settings: Settings, options: WorkerOptions) -> int:
    """Start a worker and block until it stops; returns its exit code.

    Raises ConfigError, ConfinementUnavailable, MissingSecret or UnknownAgent
    before anything starts.
    """

    if settings.broker_url is None:
        raise MissingBrokerURL(
            "VESSEL_BROKER_URL is not set: a worker needs the broker's Redis "
            "(redis://host:6379/0). `vessel-workers call` runs without one."
        )
    for agent in options.agents:
        deployment.agent(agent)
    host_id = host_id_from_environ() if options.kind in WORKSPACE_KINDS else None
    routed = None
    if options.kind == "plugin":
        check_plugin_locks(deployment)
        from workers.plugin.host.routed import RoutedFiles  # noqa: PLC0415

        # host.workspace runs on the turn's home host, through a client of this
        # worker's own (connected at the first operation, after the checks below).
        routed = RoutedFiles.of(deployment, settings)
    executor, workspaces = build_executor(
        deployment, options.kind, options.agents, workspace_files=routed
    )
    limit = settings.broker_outage_seconds
    admission = RedisAdmission.from_url(
        settings.broker_url, sentinel_master=settings.sentinel_master, patience=limit
    )
    broker_name = f"broker Redis {hide_password(settings.broker_url)}"
    wait_for_broker(admission.redis, broker_name, limit)
    check_eviction_policy(admission.redis, broker_name)
    backend = settings.backend_url
    if backend is not None and backend != settings.broker_url:
        backend_name = f"result backend {hide_password(backend)}"
        client: redis.Redis[Any]
        with redis_client(backend, sentinel_master=settings.sentinel_master) as client:
            wait_for_broker(client, backend_name, limit)
            check_eviction_policy(client, backend_name)

    hostname = _hostname(options)
    concurrency = options.concurrency or DEFAULT_CONCURRENCY[options.kind]
    runtime = build_runtime(
        deployment,
        settings,
        options.kind,
        admission=admission,
        executor=executor,
        hostname=hostname,
        host_id=host_id,
        workspaces=workspaces,
    )
    app = runtime.app
    lanes = {lane: concurrency for lane in lanes_for(options.kind, options.agents, host_id)}
    outage_exit = OutageExit(f"vessel-workers worker {options.kind}")
    subscription: Subscription = admission.listen_cancels(
        functools.partial(on_cancel_message, runtime, workspaces)
    )
    if options.metrics_port is not None:
        start_metrics_server(options.metrics_port)
    lines = startup_lines(
        kind=options.kind,
        task_events=settings.task_events,
        cgroup_mode=executor.sandbox.cgroup_mode if executor.sandbox is not None else None,
        host_id=host_id,
        network_mode=executor.sandbox.network_mode if executor.sandbox is not None else None,
        standby_mode=executor.sandbox.standby_mode if executor.sandbox is not None else None,
    )
    worker = worker_class(app, lines)(
        hostname=hostname,
        pool=options.pool,
        concurrency=concurrency,
        loglevel=options.loglevel,
        queues=list(lanes),
        # Mingle and gossip make every worker talk to every other at start and
        # on each event; admission already coordinates through Redis.
        without_mingle=True,
        without_gossip=True,
        # Reconnects at least every second, logged once per outage (workers.outage).
        consumer_cls=consumer_class(admission.outage),
    )
    # After app.Worker set up logging; before it consumes anything.
    housekeeper = Housekeeper(
        runtime,
        lanes,
        workspaces,
        outage_exit,
        report=_fast_path_report(runtime, settings, admission),
    )
    housekeeper.start()
    try:
        worker.start()
    finally:
        housekeeper.stop()
        subscription.close()
        close_executor(executor)
        admission.close()
    outage_exit.report()
    return int(worker.exitcode or 0)


def _fast_path_report(
    runtime: CallRuntime, settings: Settings, admission: RedisAdmission
) -> Callable[[int], None] | None:
    """The start-up self-test: does this worker consume an envelope it pushed itself?

    If not, the one log line says why, and while this worker runs it keeps
    the fast path off on the broker (`broker.fast_path.FAST_PATH_OFF_KEY`,
    refreshed at each heartbeat): clients build no envelopes, admission pushes
    none, every call is published with `send_task`.
    """
    reason = fast_path.self_test(runtime.app, settings, admission, runtime.kind)
    if reason is None:
        _log.info("fast path: this worker consumes the envelopes admission pushes")
        return None
    fast_path.log_fallback(reason, worker=True)
    return functools.partial(admission.turn_fast_path_off, reason)
