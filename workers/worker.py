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

`workers.embedded.embedded_client` builds the same pieces in-process for the
embedded default.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.utils.nodenames import default_nodename, host_format

from broker import fast_path
from broker.admission import Admission, RedisAdmission, Subscription
from broker.admission.keys import END_TURN_PREFIX
from broker.admission.publish import publish
from broker.celery_app import longest_timeout, make_app
from broker.config import Settings, hide_password
from broker.connect import redis_client
from broker.constants import ENV_HOST_ID
from broker.errors import BrokerUnavailable, ConfigError, MissingBrokerURL
from broker.model import Deployment
from broker.protocol import (
    RESULT_STATE,
    CallRequest,
    ToolResult,
    store_result,
    worker_stopped_text,
)
from broker.queues import (
    WORKSPACE_KINDS,
    Kind,
    check_host_id,
    dedicated_lane,
    home_lane,
    shared_lane,
)
from workers.banner import startup_lines, worker_class
from workers.execute import Executor
from workers.metrics import start_metrics_server
from workers.outage import OutageExit, consumer_class, wait_for_broker
from workers.tasks import CallRuntime, register_tasks
from workers.workspace_ops import register_workspace_ops

if TYPE_CHECKING:
    import redis

    from workers.plugin.host.workspace import WorkspaceFiles
    from workers.sandbox.workspace import WorkspaceStore

__all__ = [
    "DEFAULT_CONCURRENCY",
    "WorkerOptions",
    "build_executor",
    "build_runtime",
    "check_eviction_policy",
    "check_plugin_locks",
    "close_executor",
    "host_id_from_environ",
    "lanes_for",
    "on_cancel_channel",
    "run_worker",
]

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
#: How often the sandbox workspace TTL sweep runs, in seconds.
_WORKSPACE_SWEEP_SECONDS = 60.0
#: After an outage, the recovery sweep waits this long: calls that finished
#: during it store their held results first (they retry at least every
#: second), instead of racing a redelivery of their expired leases.
_SWEEP_PAUSE_AFTER_OUTAGE_SECONDS = 3.0


def lanes_for(kind: Kind, agents: Sequence[str] | None, host_id: str | None = None) -> list[str]:
    """The shared lane, or the dedicated lanes of `agents`; with `host_id`, each
    followed by its home lane on that host."""
    lanes = [dedicated_lane(kind, agent) for agent in agents] if agents else [shared_lane(kind)]
    if host_id is None:
        return lanes
    return [lane for base in lanes for lane in (base, home_lane(base, host_id))]


def host_id_from_environ(
    environ: Mapping[str, str] | None = None, workspace_root: Path | None = None
) -> str:
    """The host of a sandbox worker: `VESSEL_HOST_ID` (ConfigError if not a valid id).

    Unset: the machine's hostname; followed by `-` and a tag of the workspace
    root (8 hex of its path's sha256) when the root is not the default one, so
    that two roots on one machine are two hosts even when nobody set the id,
    and the processes sharing a root still share it.
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV_HOST_ID, "").strip()
    if value:
        try:
            return check_host_id(value)
        except ValueError as exc:
            raise ConfigError(f"{ENV_HOST_ID}: {exc}.") from None
    from workers.sandbox.workspace import (  # noqa: PLC0415
        DEFAULT_WORKSPACE_ROOT,
        default_workspace_root,
    )

    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-")[:80] or "host"
    root = os.path.realpath(workspace_root or default_workspace_root())
    if root != os.path.realpath(DEFAULT_WORKSPACE_ROOT):
        name = f"{name}-{hashlib.sha256(root.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"
    return check_host_id(name)


def check_plugin_locks(deployment: Deployment) -> None:
    """Run each plugin's sources confined, as `check` does; refuse a lock they no longer match.

    The loader already refused a lock whose sources' sha256 changed; this also
    catches a lock written by hand or by another version of the runtime. Raises
    ConfigError naming the plugin and the command to run.
    """
    from broker.loading.fields import Problems  # noqa: PLC0415
    from broker.loading.plugin import read_plugin_file  # noqa: PLC0415
    from workers.plugin.publish import publish  # noqa: PLC0415
    from workers.plugin.registration import register_sources  # noqa: PLC0415

    command = f"vessel-workers check -d {deployment.path}"
    for slug, plugin in deployment.plugins.items():
        problems = Problems()
        plugin_file = read_plugin_file(plugin.package_dir, shown=slug, problems=problems)
        if plugin_file is None:
            raise ConfigError(f"plugin {slug!r}: plugin.toml has problems; run {command}")
        try:
            registration = register_sources(plugin.package_dir, plugin.sources)
        except OSError as exc:
            raise ConfigError(
                f"plugin {slug!r}: the plugin runtime cannot run here: {exc}"
            ) from exc
        published = publish(plugin_file, registration)
        try:
            recorded = json.loads(plugin.lock_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"plugin {slug!r}: its lock cannot be read ({exc}); run {command}"
            ) from None
        if published.lock is None or published.lock.to_json() != recorded:
            raise ConfigError(
                f"plugin {slug!r}: its sources, run here, do not register what "
                f"{plugin.lock_path.name} records; run {command}"
            )


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
        _log.info("sandbox: VESSEL_SANDBOX_CGROUPS in force: %s", sandbox.cgroup_mode)
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


def check_eviction_policy(client: redis.Redis[Any], what: str) -> None:
    """Refuse a Redis that may evict keys; warn if CONFIG is not allowed."""
    import redis  # noqa: PLC0415 (the embedded default never needs redis-py)

    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        detail = " ".join(str(exc).split())
        raise BrokerUnavailable(
            f"cannot reach the {what} ({detail}): check that Redis runs there and that "
            "the URL names it (host, port, password, database, TLS)"
        ) from None
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
        exit_: OutageExit | None = None,
        *,
        report: Callable[[int], None] | None = None,
    ) -> None:
        self._runtime = runtime
        self._lanes = lanes
        self._workspaces = workspaces
        self._exit = exit_ or OutageExit()
        #: Outages seen ended (`beat` reasserts running calls' claims after each).
        self._seen = 0
        # The longest lease: a reasserted claim outlives any call running here.
        longest = longest_timeout(runtime.deployment) + runtime.settings.lease_grace_seconds
        self._claim_ttl_ms = int(longest * 1000)
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
        admission = rt.admission
        if isinstance(admission, RedisAdmission) and admission.outage.recoveries != self._seen:
            # The first beat after an outage: Redis may have come back empty.
            self._seen = admission.outage.recoveries
            admission.reassert_claims(rt.running_ids(), rt.hostname, self._claim_ttl_ms)

    def sweep(self) -> None:
        rt = self._runtime
        admission = rt.admission
        if isinstance(admission, RedisAdmission):
            recovered = admission.outage.since_recovery()
            if recovered is not None and recovered < _SWEEP_PAUSE_AFTER_OUTAGE_SECONDS:
                return  # held results land first (see the constant)
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
            except BrokerUnavailable as exc:
                # Admission rode out the outage for the whole limit: stop.
                self._exit.stop(exc, settings.broker_outage_seconds)
            except Exception as exc:  # the thread must outlive any one failure
                _log.warning("housekeeping failed, will retry: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        admission = self._runtime.admission
        if isinstance(admission, RedisAdmission):
            if admission.outage.down_for() is not None:
                _log.warning(
                    "could not leave the lanes (the broker is unreachable): this worker's "
                    "capacity expires with its last heartbeat"
                )
                return
            admission.patience = 0.0  # shutting down: no waiting for an outage now
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
    backend = runtime.app.backend
    if backend.get_task_meta(call_id).get("status") == RESULT_STATE or not message:
        return
    request = CallRequest.from_message(json.loads(message))
    _log.warning("call %s: its worker stopped before storing the result", call_id)
    text = worker_stopped_text(request.tool)
    store_result(backend, ToolResult.error(request, text, outcome="killed"))


def on_cancel_channel(
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
        functools.partial(on_cancel_channel, runtime, workspaces)
    )
    if options.metrics_port is not None:
        start_metrics_server(options.metrics_port)
    lines = startup_lines(
        kind=options.kind,
        task_events=settings.task_events,
        cgroup_mode=executor.sandbox.cgroup_mode if executor.sandbox is not None else None,
        host_id=host_id,
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
    housekeeper = _Housekeeper(
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
    fast_path.log_fallback(reason)
    return functools.partial(admission.turn_fast_path_off, reason)


def close_executor(executor: Executor) -> None:
    """Close what the executor's runners hold (connections, launchers, runtimes)."""
    if executor.service is not None:
        executor.service.close()
    if executor.sandbox is not None:
        executor.sandbox.close()  # its slot launchers and their cgroups
    if executor.plugin is not None:
        executor.plugin.close()  # its runtime processes
        bridge = getattr(executor.plugin, "bridge", None)
        if bridge is not None:
            bridge.close()
