"""P3 burst: 2,000 calls submitted at once and collected, ours vs raw Celery.

Contenders, in turns (`bench.burst.run_bursts`):
- raw Celery no-op tasks on the raw-service worker;
- raw Celery tasks making the same HTTP POST by hand, on the raw-service worker;
- raw Celery tasks running raw bwrap `/bin/true` on the raw-sandbox worker;
- ours: the solo agent's service tool (POST to bench.httpd) on the service worker;
- ours: the solo agent's `/bin/true` declared tool on the sandbox worker;
- ours: the same declared calls with turns (`TURNS_PER_BURST` turns, round-robin),
  against ours without: what turn affinity costs at volume (goal ≥ 0.95x).
- plugin calls, a group of their own: the trivial plugin tool (`return 1`) on a
  plugin worker against raw Celery tasks each starting `bwrap ... node
  handler.js` on the raw-plugin worker (goal: at least 4x its throughput).
Each raw worker has the pool and concurrency of the vessel worker it is compared
with (`bench.stack.WORKER_SPECS`, one process each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.baselines import (
    RAW_QUEUE_PLUGIN,
    RAW_QUEUE_SANDBOX,
    RAW_QUEUE_SERVICE,
    TASK_BWRAP_NODE,
    TASK_BWRAP_TRUE,
    TASK_HTTP_POST,
    TASK_NOOP,
)
from bench.burst import Burst, BurstSeries, raw_burst, run_bursts
from bench.context import Context
from bench.deployment import TOOL_ONE, TOOL_PING, TOOL_TRUE
from bench.ours import NotAvailable, OursClient, require_parts
from bench.report import Goal, Row
from bench.stack import WORKER_SPECS, cluster_of

__all__ = [
    "GOAL_PLUGIN",
    "GOAL_SANDBOX",
    "GOAL_SERVICE",
    "GOAL_TURNS",
    "TURNS_PER_BURST",
    "BurstPlan",
    "burst_plan",
    "ours_burst",
    "plugin_row",
    "run",
]

GOAL_SERVICE = Goal(median_min=0.7)
GOAL_SANDBOX = Goal(median_min=0.5)
#: Issue 20: a sandbox burst at least as fast as raw Celery tasks running raw bwrap.
GOAL_SANDBOX_RAW = Goal(median_min=1.0)
#: Turn affinity (docs/turns.md) may cost at most 5% of the throughput.
GOAL_TURNS = Goal(median_min=0.95)
#: Turns a burst with turns spreads its calls over (a platform's calls come
#: from many conversations at once).
TURNS_PER_BURST = 50
#: Issue 16: plugin calls on a warm worker at least 4x a fresh bwrap + node per call.
GOAL_PLUGIN = Goal(median_min=4.0)
_NAMES = (
    "service burst: ours vs raw Celery no-op",
    "service burst: ours vs raw Celery + httpx POST",
    "sandbox burst: ours vs raw Celery no-op",
    "sandbox burst: ours vs raw Celery + raw bwrap",
    "sandbox burst with turns: ours vs ours without",
    "plugin burst: ours vs raw Celery + bwrap node",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class BurstPlan:
    calls: int
    rounds: int
    warmup_calls: int
    #: Cut the burst so the slowest contender's takes about this long (None: never).
    max_burst_seconds: float | None


def burst_plan(ctx: Context, kind: str) -> BurstPlan:
    """How big and how many bursts: 2,000 calls, cut to a time budget on slow machines."""
    if ctx.quick:
        return BurstPlan(calls=20, rounds=1, warmup_calls=5, max_burst_seconds=None)
    if kind in ("sandbox", "plugin"):
        # A sandbox call is a process tree: tens of calls/s on 2 cores, so a
        # 2,000-call burst would take minutes per round.
        return BurstPlan(calls=2000, rounds=2, warmup_calls=50, max_burst_seconds=20)
    return BurstPlan(calls=2000, rounds=3, warmup_calls=200, max_burst_seconds=20)


def ours_burst(
    client: OursClient,
    agents: tuple[str, ...],
    tool: str,
    watch: dict[str, int] | None = None,
    *,
    turns: int = 0,
) -> Burst:
    """Calls spread round-robin over `agents` (and over `turns` turns, if any)."""
    kind = client.kind_of(agents[0], tool)

    def submit(i: int) -> Any:
        turn = f"bench-p3-turn-{i % turns}" if turns else None
        return client.submit(agents[i % len(agents)], tool, {}, turn=turn)

    return Burst(
        submit=submit,
        collect=lambda h, timeout: client.collect(h, kind, timeout=timeout),
        watch=watch or {},
    )


def _row(
    name: str,
    *,
    base: BurstSeries,
    ours: BurstSeries,
    base_name: str,
    goal: Goal | None,
    base_label: str,
    ours_label: str,
    notes: str,
) -> Row:
    return Row(
        mode="P3",
        name=name,
        unit="calls/s",
        baseline_name=base_name,
        baseline_samples=base.throughputs,
        ours_samples=ours.throughputs,
        baseline_latency_ms=base.latencies_ms,
        ours_latency_ms=ours.latencies_ms,
        goal=goal,
        errors=base.error_texts(base_label) + ours.error_texts(ours_label),
        notes=f"{notes}; CPU ms per call: ours {ours.cpu_text()} | baseline {base.cpu_text()}",
        details={
            "calls_per_burst": ours.calls // max(1, len(ours.throughputs)),
            "cpu_ms_per_call": {
                "ours": ours.cpu_ms_per_call(),
                "baseline": base.cpu_ms_per_call(),
            },
        },
    )


def run(ctx: Context) -> list[Row]:
    try:
        require_parts()
    except NotAvailable as exc:
        return [
            Row(mode="P3", name=n, unit="calls/s", skipped=f"not measured: {exc}") for n in _NAMES
        ]
    return [*_declared_and_service(ctx), plugin_row(ctx)]


def plugin_row(ctx: Context) -> Row:
    bench = cluster_of(ctx)
    raw = bench.raw()
    try:
        deployment, ours = bench.plugin()
    except Exception as exc:  # the plugin runtime is not there: say so, measure the rest
        return Row(
            mode="P3", name=_NAMES[5], unit="calls/s", errors=[f"{type(exc).__name__}: {exc}"]
        )
    plan = burst_plan(ctx, "plugin")
    series, calls = run_bursts(
        {
            "raw_node": raw_burst(
                raw, TASK_BWRAP_NODE, RAW_QUEUE_PLUGIN, 1, bench.watch("raw-plugin")
            ),
            "ours_plugin": ours_burst(
                ours, deployment.agents, TOOL_ONE, bench.watch("ours-plugin-plugin")
            ),
        },
        calls=plan.calls,
        rounds=plan.rounds,
        warmup_calls=plan.warmup_calls,
        max_burst_seconds=plan.max_burst_seconds,
    )
    spec = WORKER_SPECS["plugin"]
    return _row(
        _NAMES[5],
        base=series["raw_node"],
        ours=series["ours_plugin"],
        base_name="raw Celery + bwrap node",
        goal=GOAL_PLUGIN,
        base_label="raw_node",
        ours_label="ours_plugin",
        notes=f"{calls} calls x {plan.rounds} rounds; one worker each, pool {spec.pool} "
        f"x{spec.concurrency} (baseline: the same); every call in its own vm context",
    )


def _declared_and_service(ctx: Context) -> list[Row]:
    bench = cluster_of(ctx)
    raw = bench.raw()
    deployment, ours = bench.solo()
    service_plan, sandbox_plan = burst_plan(ctx, "service"), burst_plan(ctx, "sandbox")
    # Two groups, each in turns: the no-op baseline bursts in both, at the
    # group's burst size, so each ratio compares bursts of one size run in turns.
    service_series, service_calls = run_bursts(
        {
            "raw_noop": raw_burst(
                raw, TASK_NOOP, RAW_QUEUE_SERVICE, None, bench.watch("raw-service")
            ),
            "raw_http": raw_burst(
                raw, TASK_HTTP_POST, RAW_QUEUE_SERVICE, 200, bench.watch("raw-service")
            ),
            "ours_service": ours_burst(
                ours, deployment.agents, TOOL_PING, bench.watch("ours-solo-service")
            ),
        },
        calls=service_plan.calls,
        rounds=service_plan.rounds,
        warmup_calls=service_plan.warmup_calls,
        max_burst_seconds=service_plan.max_burst_seconds,
    )
    sandbox_series, sandbox_calls = run_bursts(
        {
            "raw_noop": raw_burst(
                raw, TASK_NOOP, RAW_QUEUE_SERVICE, None, bench.watch("raw-service")
            ),
            "raw_bwrap": raw_burst(
                raw, TASK_BWRAP_TRUE, RAW_QUEUE_SANDBOX, 0, bench.watch("raw-sandbox")
            ),
            "ours_sandbox": ours_burst(
                ours, deployment.agents, TOOL_TRUE, bench.watch("ours-solo-sandbox")
            ),
            "ours_sandbox_turns": ours_burst(
                ours,
                deployment.agents,
                TOOL_TRUE,
                bench.watch("ours-solo-sandbox"),
                turns=TURNS_PER_BURST,
            ),
        },
        calls=sandbox_plan.calls,
        rounds=sandbox_plan.rounds,
        warmup_calls=sandbox_plan.warmup_calls,
        max_burst_seconds=sandbox_plan.max_burst_seconds,
    )
    service, sandbox = WORKER_SPECS["service"], WORKER_SPECS["sandbox"]
    service_setup = f"{service_calls} calls x {service_plan.rounds} rounds; one worker each"
    sandbox_setup = f"{sandbox_calls} calls x {sandbox_plan.rounds} rounds; one worker each"
    return [
        _row(
            _NAMES[0],
            base=service_series["raw_noop"],
            ours=service_series["ours_service"],
            base_name="raw Celery no-op",
            goal=GOAL_SERVICE,
            base_label="raw_noop",
            ours_label="ours_service",
            notes=f"{service_setup}, pool {service.pool} x{service.concurrency} "
            "(baseline: the same)",
        ),
        _row(
            _NAMES[1],
            base=service_series["raw_http"],
            ours=service_series["ours_service"],
            base_name="raw Celery + httpx POST",
            goal=None,
            base_label="raw_http",
            ours_label="ours_service",
            notes=f"{service_setup}, pool {service.pool} x{service.concurrency} "
            "(baseline: the same); no goal: what seed 001's rules and admission cost at volume "
            "over the HTTP call itself",
        ),
        _row(
            _NAMES[2],
            base=sandbox_series["raw_noop"],
            ours=sandbox_series["ours_sandbox"],
            base_name="raw Celery no-op",
            goal=GOAL_SANDBOX,
            base_label="raw_noop",
            ours_label="ours_sandbox",
            notes=f"{sandbox_setup}; ours pool {sandbox.pool} x{sandbox.concurrency}, baseline "
            f"{service.pool} x{service.concurrency}",
        ),
        _row(
            _NAMES[3],
            base=sandbox_series["raw_bwrap"],
            ours=sandbox_series["ours_sandbox"],
            base_name="raw Celery + raw bwrap",
            goal=GOAL_SANDBOX_RAW,
            base_label="raw_bwrap",
            ours_label="ours_sandbox",
            notes=f"{sandbox_setup}, pool {sandbox.pool} x{sandbox.concurrency} "
            "(baseline: the same); goal also: the worker's CPU per call <= the raw task's + 1 ms",
        ),
        _row(
            _NAMES[4],
            base=sandbox_series["ours_sandbox"],
            ours=sandbox_series["ours_sandbox_turns"],
            base_name="ours, no turn",
            goal=GOAL_TURNS,
            base_label="ours_sandbox",
            ours_label="ours_sandbox_turns",
            notes=f"{sandbox_setup}, pool {sandbox.pool} x{sandbox.concurrency}; calls spread "
            f"over {TURNS_PER_BURST} turns, each pinned to its home lane",
        ),
    ]
