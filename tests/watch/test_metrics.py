"""The Prometheus endpoint: real ToolResults counted, then scraped over HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from broker.errors import ConfigError
from broker.result import ToolResult
from workers import metrics
from workers.metrics import (
    DURATION_BUCKETS,
    OVERFLOW_LABEL,
    CallMetrics,
    MetricsServer,
    start_metrics_server,
)

from .conftest import AGENT, OWNER, Cluster, wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def result(
    agent: str,
    tool: str,
    outcome: str = "ok",
    *,
    is_error: bool | None = None,
    duration_ms: float = 12.0,
) -> ToolResult:
    return ToolResult(
        call_id=f"call-{agent}-{tool}-{outcome}",
        agent=agent,
        tool=tool,
        is_error=outcome != "ok" if is_error is None else is_error,
        output="out",
        duration_ms=duration_ms,
        outcome=outcome,
    )


def scrape(server: MetricsServer | int) -> Samples:
    port = server if isinstance(server, int) else server.port
    answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def served(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    server = start_metrics_server(0, "127.0.0.1", registry=registry)
    try:
        yield server
    finally:
        server.close()


def test_counts_per_agent_calls_errors_timeouts_refusals(
    registry: CollectorRegistry, served: MetricsServer
) -> None:
    calls = CallMetrics(registry)
    for r in [
        result("field-guide", "species"),
        result("field-guide", "species"),
        result("field-guide", "species", "error"),
        result("field-guide", "species", "timeout", duration_ms=1000.0),
        result("field-guide", "lookup", "refused", duration_ms=0.0),
    ]:
        calls.observe(r, "sandbox")
    calls.observe(result("records-agent", "lookup"), "service")
    calls.observe(result("records-agent", "lookup", "error"), "service")
    calls.observe(result("records-agent", "lookup", "cancelled", duration_ms=40.0), "service")

    s = scrape(served)
    fg = {"agent": "field-guide", "kind": "sandbox"}
    ra = {"agent": "records-agent", "kind": "service"}
    assert value(s, "vessel_calls_total", tool="species", outcome="ok", **fg) == 2
    assert value(s, "vessel_calls_total", tool="species", outcome="error", **fg) == 1
    assert value(s, "vessel_calls_total", tool="species", outcome="timeout", **fg) == 1
    assert value(s, "vessel_calls_total", tool="lookup", outcome="refused", **fg) == 1
    assert value(s, "vessel_calls_total", tool="lookup", outcome="ok", **ra) == 1
    # An error is any result the model is shown as one.
    assert value(s, "vessel_call_errors_total", tool="species", **fg) == 2
    assert value(s, "vessel_call_errors_total", tool="lookup", **fg) == 1
    assert value(s, "vessel_call_errors_total", tool="lookup", **ra) == 2
    assert value(s, "vessel_call_timeouts_total", **fg) == 1
    assert value(s, "vessel_call_timeouts_total", **ra) == 0
    assert value(s, "vessel_call_refusals_total", **fg) == 1
    assert value(s, "vessel_call_cancellations_total", **ra) == 1
    assert value(s, "vessel_call_cancellations_total", **fg) == 0


def test_duration_histogram(registry: CollectorRegistry, served: MetricsServer) -> None:
    calls = CallMetrics(registry)
    for ms in (2.0, 4.0, 40.0, 900.0, 100_000.0, 500_000.0):
        calls.observe(result("field-guide", "species", duration_ms=ms), "sandbox")
    calls.observe(result("field-guide", "species", "refused", duration_ms=0.0), "sandbox")
    # Cancelled before it started: not timed. Cancelled while running: timed.
    calls.observe(result("field-guide", "species", "cancelled", duration_ms=0.0), "sandbox")
    calls.observe(result("field-guide", "species", "cancelled", duration_ms=300.0), "sandbox")

    s = scrape(served)
    fg = {"agent": "field-guide", "kind": "sandbox"}
    name = "vessel_call_duration_seconds"
    assert value(s, f"{name}_count", **fg) == 7
    assert value(s, f"{name}_sum", **fg) == pytest.approx(601.246)
    assert value(s, f"{name}_bucket", le="0.003", **fg) == 1
    assert value(s, f"{name}_bucket", le="0.005", **fg) == 2
    assert value(s, f"{name}_bucket", le="0.05", **fg) == 3
    assert value(s, f"{name}_bucket", le="1.0", **fg) == 5
    assert value(s, f"{name}_bucket", le="120.0", **fg) == 6
    assert value(s, f"{name}_bucket", le="+Inf", **fg) == 7
    buckets = {
        dict(labels)["le"]
        for (sample, labels) in s
        if sample == f"{name}_bucket" and dict(labels).get("agent") == "field-guide"
    }
    assert buckets == {str(b) for b in DURATION_BUCKETS} | {"+Inf"}


def test_buckets_span_3_ms_to_120_s() -> None:
    assert DURATION_BUCKETS[0] == 0.003
    assert DURATION_BUCKETS[-1] == 120.0
    assert list(DURATION_BUCKETS) == sorted(set(DURATION_BUCKETS))


def test_metric_names_and_help_are_served_before_any_call(
    registry: CollectorRegistry, served: MetricsServer
) -> None:
    CallMetrics(registry)
    text = httpx.get(f"http://127.0.0.1:{served.port}/metrics", timeout=5).text
    for name, kind in [
        ("vessel_calls_total", "counter"),
        ("vessel_call_errors_total", "counter"),
        ("vessel_call_timeouts_total", "counter"),
        ("vessel_call_refusals_total", "counter"),
        ("vessel_call_cancellations_total", "counter"),
        ("vessel_call_duration_seconds", "histogram"),
    ]:
        assert f"# HELP {name} " in text
        assert f"# TYPE {name} {kind}" in text


def test_label_pairs_are_capped(registry: CollectorRegistry, served: MetricsServer) -> None:
    """A queue full of made-up tool names cannot grow the scrape without bound."""
    calls = CallMetrics(registry, max_label_sets=3)
    for i in range(10):
        calls.observe(result("field-guide", f"made_up_{i}"), "sandbox")
    calls.observe(result("field-guide", "made_up_1"), "sandbox")  # known: still its own
    s = scrape(served)
    tools = {
        dict(labels)["tool"] for (sample, labels) in s if sample == "vessel_calls_total" and labels
    }
    assert tools == {"made_up_0", "made_up_1", "made_up_2", OVERFLOW_LABEL}
    other = {"agent": OVERFLOW_LABEL, "tool": OVERFLOW_LABEL, "kind": "sandbox", "outcome": "ok"}
    assert value(s, "vessel_calls_total", **other) == 7
    known = {"agent": "field-guide", "tool": "made_up_1", "kind": "sandbox", "outcome": "ok"}
    assert value(s, "vessel_calls_total", **known) == 2


def test_module_observe_counts_on_the_default_registry() -> None:
    """What the task calls: `workers.metrics.observe`, served by `start_metrics_server(port)`."""
    server = start_metrics_server(0)
    try:
        assert server.address == "127.0.0.1"  # loopback unless told otherwise
        before = scrape(server)
        metrics.observe(result("default-registry", "species"), "sandbox")
        metrics.observe(result("default-registry", "species", "timeout"), "sandbox")
        after = scrape(server)
    finally:
        server.close()
    labels = {"agent": "default-registry", "tool": "species", "kind": "sandbox"}
    for outcome in ("ok", "timeout"):
        key = ("vessel_calls_total", frozenset({**labels, "outcome": outcome}.items()))
        assert after[key] - before.get(key, 0.0) == 1
    # The default registry also carries prometheus_client's process metrics.
    assert any(name.startswith("process_") for name, _ in after)


def test_address_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(metrics.ENV_METRICS_ADDR, "127.0.0.2")
    server = start_metrics_server(0, registry=CollectorRegistry())
    try:
        assert server.address == "127.0.0.2"
        assert httpx.get(f"http://127.0.0.2:{server.port}/metrics", timeout=5).status_code == 200
    finally:
        server.close()


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            start_metrics_server(port, "127.0.0.1", registry=CollectorRegistry())


def test_exports_are_complete() -> None:
    public = {n for n in vars(metrics) if not n.startswith("_")}
    imported = {"annotations", "functools", "os", "threading", "weakref", "dataclass"}
    imported |= {"HTTPServer", "Iterator", "TYPE_CHECKING", "Protocol"}
    imported |= {"REGISTRY", "CollectorRegistry", "Counter", "Histogram", "start_http_server"}
    imported |= {"CounterMetricFamily", "GaugeMetricFamily", "Metric", "Collector"}
    imported |= {"ConfigError", "ToolResult"}
    assert set(metrics.__all__) == public - imported


# --- a real worker's endpoint ---------------------------------------------------


@pytest.mark.cluster
def test_workers_serve_metrics_of_real_calls(
    cluster: Cluster, deployment: Path, client: Any
) -> None:
    """`vessel-workers worker … --metrics-port P` counts the calls it finished."""
    sandbox_port, service_port = free_port(), free_port()
    cluster.worker("sandbox", deployment, metrics_port=sandbox_port)
    cluster.worker("service", deployment, metrics_port=service_port)
    for port in (sandbox_port, service_port):
        wait_for(
            lambda port=port: bool(scrape(port)),
            timeout=30,
            what=f"the metrics endpoint on port {port}",
            explain=cluster.logs,
        )

    calls = [
        ("echo", {"say": "hi"}, "ok"),
        ("echo", {"say": "again"}, "ok"),
        ("fail", {}, "error"),
        ("slow", {}, "timeout"),
        ("echo", ["not", "an", "object"], "refused"),
        ("lookup", {"id": "A-1042"}, "ok"),
        ("lookup", {"id": "Z-0000"}, "error"),
    ]
    handles = [client.submit(AGENT, tool, args, owner=OWNER) for tool, args, _ in calls]
    for handle, (tool, _, outcome) in zip(handles, calls, strict=True):
        got = handle.result(timeout=60)
        assert (got.tool, got.outcome) == (tool, outcome), (got, cluster.logs())

    sandbox = {"agent": AGENT, "kind": "sandbox"}
    service = {"agent": AGENT, "kind": "service"}

    def settled() -> Samples | None:
        s = scrape(sandbox_port)
        done = value(s, "vessel_call_duration_seconds_count", **sandbox)
        return s if done == 4 and value(s, "vessel_call_refusals_total", **sandbox) == 1 else None

    s = wait_for(settled, timeout=10, what="the sandbox worker's counts", explain=cluster.logs)
    assert value(s, "vessel_calls_total", tool="echo", outcome="ok", **sandbox) == 2
    assert value(s, "vessel_calls_total", tool="fail", outcome="error", **sandbox) == 1
    assert value(s, "vessel_calls_total", tool="slow", outcome="timeout", **sandbox) == 1
    assert value(s, "vessel_calls_total", tool="echo", outcome="refused", **sandbox) == 1
    assert value(s, "vessel_call_errors_total", tool="fail", **sandbox) == 1
    assert value(s, "vessel_call_errors_total", tool="slow", **sandbox) == 1
    assert value(s, "vessel_call_timeouts_total", **sandbox) == 1
    # The timed-out call ran for its whole 1 s limit, so it is never in a bucket
    # below that; how long the quick ones took depends on the machine's load, so
    # only their count is checked, not their buckets.
    assert value(s, "vessel_call_duration_seconds_bucket", le="0.5", **sandbox) <= 3
    assert value(s, "vessel_call_duration_seconds_bucket", le="+Inf", **sandbox) == 4
    assert value(s, "vessel_call_duration_seconds_sum", **sandbox) >= 1.0
    # A sandbox worker never counts service calls, and the other way round.
    assert value(s, "vessel_calls_total", tool="lookup", outcome="ok", **service) == 0
    # Its standbys: how many it started depends on how the calls met, but each one
    # started was used, killed, or is waiting.
    standbys = {o: value(s, "vessel_sandbox_standbys_total", outcome=o) for o in ("used", "unused")}
    waiting = value(s, "vessel_sandbox_standbys_waiting")
    started = s[("vessel_sandbox_standbys_total", frozenset({("outcome", "started")}))]
    assert standbys["used"] + standbys["unused"] + waiting == started, (standbys, waiting)

    def service_settled() -> Samples | None:
        s = scrape(service_port)
        return s if value(s, "vessel_call_duration_seconds_count", **service) == 2 else None

    s = wait_for(service_settled, timeout=10, what="the service worker's counts")
    assert value(s, "vessel_calls_total", tool="lookup", outcome="ok", **service) == 1
    assert value(s, "vessel_calls_total", tool="lookup", outcome="error", **service) == 1
    assert value(s, "vessel_call_errors_total", tool="lookup", **service) == 1
    assert value(s, "vessel_call_timeouts_total", **service) == 0
    assert ("vessel_sandbox_standbys_waiting", frozenset()) not in s  # no sandboxes here
    assert value(s, "vessel_calls_total", tool="echo", outcome="ok", **sandbox) == 0
