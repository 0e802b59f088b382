"""Worker start-up: everything a worker process needs before and beside Celery.

`run_worker` checks, in this order, and refuses to start (ConfigError and
friends, exit 2 in the command) when one fails:

1. the deployment loads, and `--agents` names agents it has;
2. sandbox workers: confinement works here (`check_confinement`);
   service workers: every grant's `env:` value is set (`ServiceCaller`);
3. Redis runs with `maxmemory-policy noeviction` (an evicting Redis drops
   queued calls and results silently); if the provider disables CONFIG, a
   warning is logged and the worker starts.

Then it starts, beside the Celery worker: the heartbeat that registers this
worker's capacity on its lanes (admission sizes each lane's window from it), the
recovery sweep (calls of dead workers), the workspace sweep (sandbox), the
cancel listener, and the metrics endpoint if asked. On SIGTERM Celery shuts down
warm: running calls finish and store their results; then the worker leaves its
lanes.

`embedded_client` builds the same pieces in-process for the embedded default.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.utils.nodenames import default_nodename, host_format

from broker import fast_path
from broker.admission import Admission, RedisAdmission, Subscription
from broker.celery_app import make_app
from broker.client import VesselClient, longest_tool_seconds, publish
from broker.config import Settings, hide_password
from broker.embedded import LocalAdmission, embedded_worker
from broker.errors import ConfigError, MissingBrokerURL
from broker.model import Deployment
from broker.queues import END_TURN_PREFIX, Kind, dedicated_lane, shared_lane
from broker.request import CallRequest
from workers.execute import Executor
from workers.metrics import start_metrics_server
from workers.result import ToolResult
from workers.tasks import CallRuntime, register_tasks

if TYPE_CHECKING:
    import redis

    from workers.sandbox.workspace import WorkspaceStore

__all__ = [
    "DEFAULT_CONCURRENCY",
    "WorkerOptions",
    "build_executor",
    "build_runtime",
    "check_eviction_policy",
    "embedded_client",
    "lanes_for",
    "run_worker",
]

_log = logging.getLogger(__name__)

#: Sandbox calls are processes on this host: one per core keeps them from
#: starving each other. Service calls wait on the network: many per process.
DEFAULT_CONCURRENCY: dict[Kind, int] = {"sandbox": os.cpu_count() or 2, "service": 32}
#: How often the sandbox workspace TTL sweep runs, in seconds.
_WORKSPACE_SWEEP_SECONDS = 60.0


def lanes_for(kind: Kind, agents: Sequence[str] | None) -> list[str]:
    """The shared lane, or the dedicated lanes of `agents`."""
    if not agents:
        return [shared_lane(kind)]
    return [dedicated_lane(kind, agent) for agent in agents]


def build_executor(
    deployment: Deployment, kind: Kind, agents: Sequence[str] | None = None
) -> tuple[Executor, WorkspaceStore | None]:
    """The executor of one worker kind, and its workspaces (sandbox).

    Raises ConfinementUnavailable (sandbox) or MissingSecret (service).
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
        _log.info("sandbox: VESSEL_SANDBOX_CGROUPS in force: %s", sandbox.cgroup_mode)
        return Executor(deployment, sandbox=sandbox), workspaces
    from workers.service.caller import ServiceCaller  # noqa: PLC0415

    caller = ServiceCaller(deployment, agents=agents or None)
    return Executor(deployment, service=caller), None


def check_eviction_policy(client: redis.Redis[Any], what: str) -> None:
    """Refuse a Redis that may evict keys; warn if CONFIG is not allowed."""
    import redis  # noqa: PLC0415 (the embedded default never needs redis-py)

    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.ResponseError as exc:
        _log.warning(
            "cannot read maxmemory-policy of the %s (%s): make sure it is noeviction", what, exc
        )
        return
    if policy != "noeviction":
        raise ConfigError(
            f"the {what} runs with maxmemory-policy {policy}: it may evict queued calls and "
            "results. Set `maxmemory-policy noeviction` in redis.conf (or run "
            "`redis-cli CONFIG SET maxmemory-policy noeviction`) and start the worker again."
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerOptions:
    kind: Kind
    agents: tuple[str, ...] = ()
    concurrency: int | None = None
    pool: str = "threads"
    hostname: str | None = None
    loglevel: str = "INFO"
    metrics_port: int | None = None


class _Housekeeper:
    """One thread: heartbeat, recovery sweep and workspace sweep, on their periods."""

    def __init__(
        self,
        runtime: CallRuntime,
        lanes: dict[str, int],
        workspaces: WorkspaceStore | None,
        *,
        report: Callable[[int], None] | None = None,
    ) -> None:
        self._runtime = runtime
        self._lanes = lanes
        self._workspaces = workspaces
        #: Called with the heartbeat TTL at each beat (the failed self-test's report).
        self._report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vessel-housekeeper", daemon=True)

    def _ttl_ms(self) -> int:
        return int(self._runtime.settings.heartbeat_seconds * 3000)

    def beat(self, lanes: dict[str, int] | None = None) -> None:
        rt = self._runtime
        if self._report is not None and lanes is None:
            self._report(self._ttl_ms())
        dispatched = rt.admission.heartbeat(
            rt.kind, rt.hostname, lanes or self._lanes, self._ttl_ms()
        )
        publish(rt.app, dispatched)

    def sweep(self) -> None:
        rt = self._runtime
        dispatched, finished = rt.admission.recover(rt.kind)
        for call_id, message in finished:
            _answer_lost(rt, call_id, message)
        publish(rt.app, dispatched)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def _loop(self) -> None:
        settings = self._runtime.settings
        tick = min(settings.heartbeat_seconds, settings.sweep_seconds)
        clock = {"beat": 0.0, "sweep": 0.0, "workspaces": 0.0}
        while not self._stop.wait(tick):
            clock = {k: v + tick for k, v in clock.items()}
            try:
                if clock["beat"] >= settings.heartbeat_seconds:
                    clock["beat"] = 0.0
                    self.beat()
                if clock["sweep"] >= settings.sweep_seconds:
                    clock["sweep"] = 0.0
                    self.sweep()
                if clock["workspaces"] >= _WORKSPACE_SWEEP_SECONDS and self._workspaces:
                    clock["workspaces"] = 0.0
                    self._workspaces.sweep()
            except Exception as exc:  # the thread must outlive any one failure
                _log.warning("housekeeping failed, will retry: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        try:
            self.beat({lane: 0 for lane in self._lanes})
        except Exception as exc:  # shutting down: say so and go on
            _log.warning("could not leave the lanes: %s", exc)


def _answer_lost(runtime: CallRuntime, call_id: str, message: str) -> None:
    """A call was marked done but its worker died before releasing it.

    Nearly always its result was stored just before; if not (the worker died
    between the two writes), the call is not run again, since it may have had
    its effect, and the platform gets an error result saying so.
    """
    meta = runtime.app.backend.get_task_meta(call_id)
    if meta.get("status") == "SUCCESS" or not message:
        return
    request = CallRequest.from_message(json.loads(message))
    _log.warning("call %s: its worker stopped before storing the result", call_id)
    lost = ToolResult(
        call_id=call_id,
        agent=request.agent,
        tool=request.tool,
        is_error=True,
        output=f"{request.tool}: the worker running this call stopped before it returned",
        outcome="killed",
    )
    runtime.app.backend.store_result(call_id, lost.to_dict(), "SUCCESS")


def _on_message(runtime: CallRuntime, workspaces: WorkspaceStore | None, message: str) -> None:
    """A message on the cancel channel: a call id to stop, or a turn that ended."""
    if not message.startswith(END_TURN_PREFIX):
        runtime.on_cancel(message)
        return
    if workspaces is not None:
        turn = message.removeprefix(END_TURN_PREFIX)
        for agent in runtime.deployment.agents:
            workspaces.end_turn(agent, turn)


def _hostname(options: WorkerOptions) -> str:
    if options.hostname:
        return str(host_format(options.hostname))
    return str(default_nodename(f"{options.kind}-{os.getpid()}"))


def build_runtime(
    deployment: Deployment,
    settings: Settings,
    kind: Kind,
    *,
    admission: Admission,
    executor: Executor,
    hostname: str,
) -> CallRuntime:
    """The Celery app of `deployment` with its task of `kind` registered on `runtime.app`."""
    app: Celery = make_app(settings, longest_tool_seconds=longest_tool_seconds(deployment))
    runtime = CallRuntime(
        app=app,
        admission=admission,
        executor=executor,
        deployment=deployment,
        kind=kind,
        hostname=hostname,
        settings=settings,
    )
    register_tasks(app, runtime)
    return runtime


def run_worker(deployment: Deployment, settings: Settings, options: WorkerOptions) -> int:
    """Start a worker and block until it stops; returns its exit code.

    Raises ConfigError, ConfinementUnavailable, MissingSecret or UnknownAgent
    before anything starts.
    """
    import redis  # noqa: PLC0415 (the embedded default never needs redis-py)

    if settings.broker_url is None:
        raise MissingBrokerURL(
            "VESSEL_BROKER_URL is not set: a worker needs the broker's Redis "
            "(redis://host:6379/0). `vessel-workers call` runs without one."
        )
    for agent in options.agents:
        deployment.agent(agent)
    executor, workspaces = build_executor(deployment, options.kind, options.agents)
    admission = RedisAdmission.from_url(settings.broker_url)
    check_eviction_policy(admission.redis, f"broker Redis {hide_password(settings.broker_url)}")
    backend = settings.backend_url
    if backend is not None and backend != settings.broker_url:
        with redis.Redis.from_url(backend) as client:
            check_eviction_policy(client, f"result backend {hide_password(backend)}")

    hostname = _hostname(options)
    concurrency = options.concurrency or DEFAULT_CONCURRENCY[options.kind]
    runtime = build_runtime(
        deployment,
        settings,
        options.kind,
        admission=admission,
        executor=executor,
        hostname=hostname,
    )
    app = runtime.app
    lanes = {lane: concurrency for lane in lanes_for(options.kind, options.agents)}
    subscription: Subscription = admission.listen_cancels(
        functools.partial(_on_message, runtime, workspaces)
    )
    if options.metrics_port is not None:
        start_metrics_server(options.metrics_port)
    worker = app.Worker(
        hostname=hostname,
        pool=options.pool,
        concurrency=concurrency,
        loglevel=options.loglevel,
        queues=list(lanes),
        # Mingle and gossip make every worker talk to every other at start and
        # on each event; admission already coordinates through Redis.
        without_mingle=True,
        without_gossip=True,
    )
    # After app.Worker set up logging; before it consumes anything.
    housekeeper = _Housekeeper(
        runtime, lanes, workspaces, report=_fast_path_report(runtime, settings, admission)
    )
    housekeeper.start()
    try:
        worker.start()
    finally:
        housekeeper.stop()
        subscription.close()
        _close(executor)
        admission.close()
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
    fast_path.log_fallback(reason)
    return functools.partial(admission.turn_fast_path_off, reason)


def _close(executor: Executor) -> None:
    if executor.service is not None:
        executor.service.close()
    if executor.sandbox is not None:
        executor.sandbox.close()  # its slot launchers and their cgroups


@contextmanager
def embedded_client(
    deployment: Deployment, settings: Settings, kind: Kind, agents: Sequence[str] | None = None
) -> Iterator[VesselClient]:
    """A client with an in-process broker, admission and worker of `kind`.

    `agents` limits whose secrets a service worker resolves (default: all).
    Raises ConfinementUnavailable (sandbox) or MissingSecret (service) before
    anything starts.
    """
    executor, _workspaces = build_executor(deployment, kind, agents)
    admission: Admission = LocalAdmission()
    hostname = f"embedded-{os.getpid()}@{socket.gethostname()}"
    runtime = build_runtime(
        deployment, settings, kind, admission=admission, executor=executor, hostname=hostname
    )
    app = runtime.app
    lane = shared_lane(kind)
    subscription = admission.listen_cancels(functools.partial(_on_message, runtime, _workspaces))
    try:
        with embedded_worker(app, queues=[lane], concurrency=2):
            publish(app, admission.heartbeat(kind, hostname, {lane: 2}, 0))
            yield VesselClient(deployment, settings, app=app, admission=admission)
    finally:
        subscription.close()
        _close(executor)
