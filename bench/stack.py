"""The shared cluster of P2, P3, P4 and MEM, started once per run, part by part.

    redis-server (private, free port)
      db 1  ours, "solo" deployment (1 agent):   sandbox worker + service worker
      db 2  ours, "many" deployment (1,000 agents): service worker (P4 only)
      db 3  raw Celery baseline: raw-sandbox, raw-service and raw-plugin workers
      db 4  ours, "plugin" deployment (1 agent, the trivial plugin): plugin worker
    bench.httpd (the local service every service call posts to)

Each raw baseline worker runs with the pool and concurrency of the vessel
worker it is compared with (`WORKER_SPECS`), so a ratio compares software, not
process counts. Separate databases keep the clusters from seeing each other's
queues and admission state while they take turns.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.baselines import (
    RAW_QUEUE_PLUGIN,
    RAW_QUEUE_SANDBOX,
    RAW_QUEUE_SERVICE,
    TASK_BWRAP_NODE,
    TASK_BWRAP_TRUE,
    TASK_HTTP_POST,
    TASK_NOOP,
    make_raw_app,
)
from bench.cluster import Cluster, Proc
from bench.context import Context
from bench.deployment import (
    TOOL_ONE,
    TOOL_PING,
    TOOL_TRUE,
    BenchDeployment,
    write_deployment,
    write_plugin_deployment,
)
from bench.ours import OursClient

__all__ = ["WORKER_SPECS", "BenchCluster", "WorkerSpec", "cluster_of"]

DB_SOLO = 1
DB_MANY = 2
DB_RAW = 3
DB_PLUGIN = 4
MANY_AGENTS = 1000


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec:
    pool: str
    concurrency: int


#: Pool and concurrency per worker kind, the same for ours and its baseline:
#: the defaults of `vessel-workers worker` (workers/commands/worker.py), i.e.
#: threads, one slot per core for sandbox calls (a call is a bwrap child its
#: thread waits on) and 32 for service calls (mostly waiting on HTTP), and
#: for plugin calls `DEFAULT_CONCURRENCY["plugin"]`.
WORKER_SPECS: dict[str, WorkerSpec] = {
    "sandbox": WorkerSpec(pool="threads", concurrency=os.cpu_count() or 2),
    "service": WorkerSpec(pool="threads", concurrency=32),
    "plugin": WorkerSpec(pool="threads", concurrency=2 * (os.cpu_count() or 2)),
}


class BenchCluster:
    """Starts what a mode asks for (`raw()`, `solo()`, `many()`) on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.cluster = Cluster(folder / "procs")
        self.workers: dict[str, Proc] = {}
        self.service_url: str | None = None
        self._raw_app: Any = None
        self._solo: tuple[BenchDeployment, OursClient] | None = None
        self._many: tuple[BenchDeployment, OursClient] | None = None
        self._plugin: tuple[BenchDeployment, OursClient] | None = None

    def close(self) -> None:
        for _, client in filter(None, (self._solo, self._many, self._plugin)):
            client.close()
        self.cluster.close()

    def describe(self) -> dict[str, Any]:
        return {
            "worker_specs": {kind: asdict(spec) for kind, spec in WORKER_SPECS.items()},
            "workers": {name: proc.argv for name, proc in self.workers.items()},
            "many_agents": MANY_AGENTS,
        }

    def watch(self, worker: str) -> dict[str, int]:
        """Label -> pid of a worker and of redis-server, for CPU accounting."""
        return {"worker": self.workers[worker].pid, "redis": self.cluster.pid_of("redis")}

    def _base(self) -> None:
        if self.cluster.redis_port is None:
            self.cluster.start_redis()
        if self.service_url is None:
            self.service_url = self.cluster.start_httpd()

    def _options(self, name: str, kind: str) -> list[str]:
        spec = WORKER_SPECS[kind]
        return [
            "--pool",
            spec.pool,
            "--concurrency",
            str(spec.concurrency),
            "--hostname",
            f"{name}@%h",
            "--loglevel",
            "WARNING",
        ]

    # --- the raw Celery baseline ---------------------------------------------

    def raw(self) -> Any:
        """The baseline app (client side), its two workers up and answering."""
        if self._raw_app is not None:
            return self._raw_app
        self._base()
        url = self.cluster.redis_url(DB_RAW)
        for kind, queue in (
            ("service", RAW_QUEUE_SERVICE),
            ("sandbox", RAW_QUEUE_SANDBOX),
            ("plugin", RAW_QUEUE_PLUGIN),
        ):
            spec = WORKER_SPECS[kind]
            name = f"raw-{kind}"
            self.workers[name] = self.cluster.start_raw_worker(
                name,
                broker_url=url,
                queue=queue,
                pool=spec.pool,
                concurrency=spec.concurrency,
                service_url=self.service_url or "",
            )
        app = make_raw_app(url)
        for task, queue, name, expected in (
            (TASK_NOOP, RAW_QUEUE_SERVICE, "raw-service", None),
            (TASK_HTTP_POST, RAW_QUEUE_SERVICE, "raw-service", 200),
            (TASK_BWRAP_TRUE, RAW_QUEUE_SANDBOX, "raw-sandbox", 0),
            (TASK_BWRAP_NODE, RAW_QUEUE_PLUGIN, "raw-plugin", 1),
        ):
            self.cluster.wait_ready(
                lambda t=task, q=queue, e=expected: app.send_task(t, queue=q).get(timeout=2) == e,
                [self.workers[name]],
                name,
            )
        self._raw_app = app
        return app

    # --- ours ----------------------------------------------------------------

    def _ours(
        self, label: str, db: int, agents: int, kinds: tuple[str, ...]
    ) -> tuple[BenchDeployment, OursClient]:
        self._base()
        assert self.service_url is not None
        folder = self.folder / f"deployment-{label}"
        if kinds == ("plugin",):
            deployment = write_plugin_deployment(folder)
        else:
            deployment = write_deployment(folder, agents=agents, service_url=self.service_url)
        url = self.cluster.redis_url(db)
        procs = []
        for kind in kinds:
            name = f"ours-{label}-{kind}"
            proc = self.cluster.start_vessel_worker(
                name,
                kind,
                deployment=deployment.path,
                broker_url=url,
                options=self._options(name, kind),
            )
            self.workers[name] = proc
            procs.append(proc)
        client = OursClient(deployment.path, url)
        for kind in kinds:
            tool = {"sandbox": TOOL_TRUE, "service": TOOL_PING, "plugin": TOOL_ONE}[kind]
            for agent in (deployment.agents[0], deployment.agents[-1]):
                self.cluster.wait_ready(
                    lambda a=agent, t=tool: client.call_ok(a, t, {}, timeout=2),
                    procs,
                    f"ours-{label}-{kind}",
                )
        return deployment, client

    def solo(self) -> tuple[BenchDeployment, OursClient]:
        """One agent; a sandbox and a service worker."""
        if self._solo is None:
            self._solo = self._ours("solo", DB_SOLO, 1, ("sandbox", "service"))
        return self._solo

    def many(self) -> tuple[BenchDeployment, OursClient]:
        """1,000 agents; a service worker."""
        if self._many is None:
            self._many = self._ours("many", DB_MANY, MANY_AGENTS, ("service",))
        return self._many

    def plugin(self) -> tuple[BenchDeployment, OursClient]:
        """One agent with the trivial plugin; a plugin worker."""
        if self._plugin is None:
            self._plugin = self._ours("plugin", DB_PLUGIN, 1, ("plugin",))
        return self._plugin


def cluster_of(ctx: Context) -> BenchCluster:
    if ctx.cluster is None:
        ctx.cluster = BenchCluster(ctx.folder / "cluster")
    return ctx.cluster
