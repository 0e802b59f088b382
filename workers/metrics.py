"""Prometheus metrics of one worker process: calls, errors, timeouts, refusals, time.

    vessel_calls_total{agent,tool,kind,outcome}   every finished call, by outcome
    vessel_call_errors_total{agent,tool,kind}     calls whose result is an error (`is_error`):
                                                  a failing command or HTTP status, and
                                                  also timeouts, refusals, cancels, kills
    vessel_call_timeouts_total{agent,kind}        calls stopped at their time limit
    vessel_call_refusals_total{agent,kind}        calls refused before anything ran
    vessel_call_cancellations_total{agent,kind}   calls the platform cancelled
    vessel_call_duration_seconds{agent,kind}      how long calls ran (histogram, 3 ms … 120 s)

A sandbox worker adds its standby sandboxes (the next call's sandbox started ahead):

    vessel_sandbox_standbys_total{outcome}        started, used (a call took it),
                                                  unused (killed: it did not fit the
                                                  call, grew old or idle, or the
                                                  worker stopped)
    vessel_sandbox_standbys_waiting               standbys waiting for a call now

`kind` is "sandbox", "service" or "plugin" (the worker kind that ran the call);
`outcome` is the result's (`ok`, `error`, `timeout`, `refused`, `cancelled`,
`killed`). A worker task calls `observe(result,
kind)` once per call it finished (a duplicate delivery is not counted again), and
`vessel-workers worker … --metrics-port PORT` calls `start_metrics_server(PORT)`.

Label cardinality: `agent` x `tool` is bounded by the deployment, since a client
refuses an agent or a tool the deployment does not have. A message written to
Redis by hand could still name anything, so a process keeps at most
`MAX_LABEL_SETS` distinct (agent, tool) pairs and counts any further one as
`_other`: a hostile queue cannot blow up the scrape.

One worker process, one registry. Workers run the threads pool (the default of
`vessel-workers worker`): every call of a worker runs in the one process that
serves `/metrics`, so prometheus_client's default registry holds them all (with
its process_* and python_* collectors beside ours). A prefork pool would count
each call in a child process the endpoint never sees; it would need
prometheus_client's multiprocess mode (`PROMETHEUS_MULTIPROC_DIR` set before start,
a `MultiProcessCollector` registry, `mark_process_dead` on child exit), which this
module does not set up.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import HTTPServer
from typing import TYPE_CHECKING, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.errors import ConfigError
from broker.result import ToolResult

if TYPE_CHECKING:
    from workers.sandbox.standby import StandbyCounts

__all__ = [
    "DEFAULT_METRICS_ADDR",
    "DURATION_BUCKETS",
    "ENV_METRICS_ADDR",
    "MAX_LABEL_SETS",
    "OVERFLOW_LABEL",
    "CallMetrics",
    "MetricsServer",
    "StandbySource",
    "default_metrics",
    "observe",
    "start_metrics_server",
    "watch_standbys",
]

#: Seconds. The fastest confined call is ~3 ms (bwrap starting /bin/true), a
#: service call a few ms on a LAN; the longest a tool may take is minutes, and
#: 120 s is where a tool limit beyond the 30 s default usually stops. Finer
#: below 100 ms, where sandbox start-up and the broker round trip show.
DURATION_BUCKETS: tuple[float, ...] = (
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)

#: Distinct (agent, tool) pairs one process labels before counting new ones as
#: `OVERFLOW_LABEL`: far above any deployment (1,000 agents x 10 tools), far below
#: what would make a scrape slow.
MAX_LABEL_SETS = 10_000
OVERFLOW_LABEL = "_other"

#: Where `start_metrics_server` listens unless told: loopback, so a worker never
#: exposes its metrics by accident. Containers set VESSEL_METRICS_ADDR=0.0.0.0.
ENV_METRICS_ADDR = "VESSEL_METRICS_ADDR"
DEFAULT_METRICS_ADDR = "127.0.0.1"


class CallMetrics:
    """The call metrics, registered on one registry (the default one unless given)."""

    def __init__(
        self,
        registry: CollectorRegistry = REGISTRY,
        *,
        max_label_sets: int = MAX_LABEL_SETS,
    ) -> None:
        self.registry = registry
        self._max_label_sets = max_label_sets
        self._pairs: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.calls = Counter(
            "vessel_calls",
            "Calls finished by this worker, by agent, tool, worker kind and outcome.",
            ["agent", "tool", "kind", "outcome"],
            registry=registry,
        )
        self.errors = Counter(
            "vessel_call_errors",
            "Calls whose result the model is shown as an error (timeouts, refusals, "
            "cancels and kills included).",
            ["agent", "tool", "kind"],
            registry=registry,
        )
        self.timeouts = Counter(
            "vessel_call_timeouts",
            "Calls stopped at their time limit.",
            ["agent", "kind"],
            registry=registry,
        )
        self.refusals = Counter(
            "vessel_call_refusals",
            "Calls refused before anything ran (bad arguments, unknown tool).",
            ["agent", "kind"],
            registry=registry,
        )
        self.cancellations = Counter(
            "vessel_call_cancellations",
            "Calls cancelled by the platform, queued or running.",
            ["agent", "kind"],
            registry=registry,
        )
        self.duration = Histogram(
            "vessel_call_duration_seconds",
            "How long calls ran, from start to result (refusals are not timed).",
            ["agent", "kind"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )

    def _labels(self, agent: str, tool: str) -> tuple[str, str]:
        pair = (agent, tool)
        with self._lock:
            if pair in self._pairs:
                return pair
            if len(self._pairs) >= self._max_label_sets:
                return (OVERFLOW_LABEL, OVERFLOW_LABEL)
            self._pairs.add(pair)
            return pair

    def observe(self, result: ToolResult, kind: str) -> None:
        """Count one finished call of a `kind` ("sandbox", "service" or "plugin") worker."""
        agent, tool = self._labels(result.agent, result.tool)
        outcome = result.outcome
        self.calls.labels(agent=agent, tool=tool, kind=kind, outcome=outcome).inc()
        if result.is_error:
            self.errors.labels(agent=agent, tool=tool, kind=kind).inc()
        if outcome == "timeout":
            self.timeouts.labels(agent=agent, kind=kind).inc()
        elif outcome == "refused":
            self.refusals.labels(agent=agent, kind=kind).inc()
        elif outcome == "cancelled":
            self.cancellations.labels(agent=agent, kind=kind).inc()
        # A refusal never ran, nor did a call cancelled before it started (0 ms):
        # timing them would drag every percentile towards zero.
        ran = outcome != "refused" and not (outcome == "cancelled" and result.duration_ms <= 0)
        if ran:
            self.duration.labels(agent=agent, kind=kind).observe(
                max(result.duration_ms, 0.0) / 1000.0
            )


@functools.cache
def default_metrics() -> CallMetrics:
    """The process's metrics, on prometheus_client's default registry (built once)."""
    return CallMetrics()


def observe(result: ToolResult, kind: str) -> None:
    """Count one finished call in this process's metrics (`default_metrics`)."""
    default_metrics().observe(result, kind)


class StandbySource(Protocol):
    """What has standby sandboxes to count (`SandboxRunner`)."""

    def standby_counts(self) -> StandbyCounts: ...


class _StandbyCollector(Collector):
    """The standbys of this process's sandbox runners, summed at each scrape."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[StandbySource] = weakref.WeakSet()

    def collect(self) -> Iterator[Metric]:
        counts = [each.standby_counts() for each in list(self.sources)]
        total = CounterMetricFamily(
            "vessel_sandbox_standbys",
            "Sandboxes started ahead for a next call: started, used by a call, killed unused.",
            labels=["outcome"],
        )
        for outcome in ("started", "used", "unused"):
            total.add_metric([outcome], sum(getattr(each, outcome) for each in counts))
        yield total
        yield GaugeMetricFamily(
            "vessel_sandbox_standbys_waiting",
            "Sandboxes started ahead and waiting for a call now.",
            value=sum(each.waiting for each in counts),
        )


_STANDBY_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, _StandbyCollector] = (
    weakref.WeakKeyDictionary()
)
_STANDBY_LOCK = threading.Lock()


def watch_standbys(source: StandbySource, registry: CollectorRegistry = REGISTRY) -> None:
    """Count `source`'s standby sandboxes in `registry` (default: this process's): the
    `vessel_sandbox_standbys` series, one set for all of a process's sources."""
    with _STANDBY_LOCK:
        collector = _STANDBY_COLLECTORS.get(registry)
        if collector is None:
            collector = _STANDBY_COLLECTORS[registry] = _StandbyCollector()
            registry.register(collector)
        collector.sources.add(source)


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running `/metrics` endpoint (a daemon thread); `close` stops it."""

    server: HTTPServer
    thread: threading.Thread

    @property
    def address(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def start_metrics_server(
    port: int,
    addr: str | None = None,
    *,
    registry: CollectorRegistry | None = None,
) -> MetricsServer:
    """Serve `registry` (default: this process's) on http://ADDR:PORT/metrics.

    `addr` defaults to $VESSEL_METRICS_ADDR, then 127.0.0.1; port 0 picks a free
    port (see `.port`). Raises ConfigError when the address cannot be bound.
    """
    if registry is None:
        default_metrics()  # the series exist (with HELP and TYPE) before the first call
        registry = REGISTRY
    host = addr or os.environ.get(ENV_METRICS_ADDR, "").strip() or DEFAULT_METRICS_ADDR
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}): "
            "choose another --metrics-port, or free that one."
        ) from exc
    return MetricsServer(server=server, thread=thread)
