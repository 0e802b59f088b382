"""P4 agents: the P3 service burst with 1 agent vs with 1,000 agents active.

Baseline: the solo deployment (1 agent) on its service worker. Ours: the
"many" deployment (1,000 agents, written to the run's temp folder) on its own
service worker of the same pool and concurrency, the burst's calls spread
round-robin over all 1,000 agents, so every agent has calls queued at once.
"""

from __future__ import annotations

from bench.burst import run_bursts
from bench.context import Context
from bench.deployment import TOOL_PING
from bench.ours import NotAvailable, require_parts
from bench.p3_burst import burst_plan, ours_burst
from bench.report import Goal, Row
from bench.stack import MANY_AGENTS, WORKER_SPECS, cluster_of

__all__ = ["GOAL", "run"]

GOAL = Goal(median_min=0.8)
_NAME = f"service burst: {MANY_AGENTS} agents vs 1 agent"


def run(ctx: Context) -> list[Row]:
    try:
        require_parts()
    except NotAvailable as exc:
        return [Row(mode="P4", name=_NAME, unit="calls/s", skipped=f"not measured: {exc}")]
    plan = burst_plan(ctx, "service")
    bench = cluster_of(ctx)
    solo, solo_client = bench.solo()
    many, many_client = bench.many()
    series, calls = run_bursts(
        {
            "one_agent": ours_burst(
                solo_client, solo.agents, TOOL_PING, bench.watch("ours-solo-service")
            ),
            "many_agents": ours_burst(
                many_client, many.agents, TOOL_PING, bench.watch("ours-many-service")
            ),
        },
        calls=plan.calls,
        rounds=plan.rounds,
        warmup_calls=plan.warmup_calls,
        max_burst_seconds=plan.max_burst_seconds,
    )
    spec = WORKER_SPECS["service"]
    one, many_series = series["one_agent"], series["many_agents"]
    return [
        Row(
            mode="P4",
            name=_NAME,
            unit="calls/s",
            baseline_name="1 agent",
            ours_name=f"{MANY_AGENTS} agents",
            baseline_samples=one.throughputs,
            ours_samples=many_series.throughputs,
            baseline_latency_ms=one.latencies_ms,
            ours_latency_ms=many_series.latencies_ms,
            goal=GOAL,
            errors=one.error_texts("one_agent") + many_series.error_texts("many_agents"),
            notes=f"{calls} calls x {plan.rounds} rounds; one service worker each, "
            f"pool {spec.pool} x{spec.concurrency}; CPU ms per call: 1000 agents "
            f"{many_series.cpu_text()} | 1 agent {one.cpu_text()}",
            details={
                "calls_per_burst": calls,
                "cpu_ms_per_call": {
                    "ours": many_series.cpu_ms_per_call(),
                    "baseline": one.cpu_ms_per_call(),
                },
            },
        )
    ]
