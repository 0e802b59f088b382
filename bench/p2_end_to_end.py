"""P2 end to end: one call at a time through Redis and real worker processes.

Ours: `VesselClient.call` (admission, publish, worker claim, run, store,
release, poll for the result) of the solo deployment's `/bin/true` declared
tool and its service tool. Baselines: a raw Celery task round trip
(`send_task(...).get()`) on a worker with the same pool and concurrency, whose
task is a no-op (for the service call: the goal) or runs raw bwrap `/bin/true`
(for the declared call); and, with no goal, a raw Celery task making the same
HTTP POST by hand (what seed 001's rules and admission cost over the call
itself). Each contender makes one call, waits for it, and the next goes.

Turn affinity: the same declared call made with a turn (one turn for the
whole run, so every call after the first goes to the turn's home lane),
against ours without a turn: what following a turn's home costs (goal ≤ 1.05x).
Plugin calls, in turns of their own: `VesselClient.call` of the trivial plugin
tool (`return 1`) on a warm plugin worker, against a raw Celery task that
starts `bwrap ... node handler.js` for each call (bench/raw_handler.js) on a
worker with the same pool and concurrency. Goal: p50 at most a quarter of it.
"""

from __future__ import annotations

from bench.baselines import (
    RAW_QUEUE_PLUGIN,
    RAW_QUEUE_SANDBOX,
    RAW_QUEUE_SERVICE,
    TASK_BWRAP_NODE,
    TASK_BWRAP_TRUE,
    TASK_HTTP_POST,
    TASK_NOOP,
)
from bench.context import Context
from bench.deployment import TOOL_ONE, TOOL_PING, TOOL_TRUE
from bench.ours import NotAvailable, require_parts
from bench.report import Goal, Row
from bench.stack import WORKER_SPECS, cluster_of
from bench.turns import PAUSE_SECONDS, WrongResult, in_turns

__all__ = ["GOAL", "GOAL_PLUGIN", "plugin_row", "run"]

GOAL = Goal(median_max=1.25)
#: Issue 20: a declared call end to end no slower than raw Celery + raw bwrap.
GOAL_DECLARED = Goal(median_max=1.0)
#: Turn affinity (docs/turns.md) may cost at most 5%.
GOAL_TURN = Goal(median_max=1.05)
_TURN = "bench-p2-turn"
#: Issue 16: a warm plugin call at most a quarter of a fresh bwrap + node per call.
GOAL_PLUGIN = Goal(median_max=0.25)
_TIMEOUT = 30.0
_NAMES = (
    "declared call: ours vs raw Celery + raw bwrap",
    "service call: ours vs raw Celery no-op",
    "service call: ours vs raw Celery + httpx POST",
    "declared call with a turn: ours vs ours without",
    "plugin call: ours vs raw Celery + bwrap node",
)


def run(ctx: Context) -> list[Row]:
    try:
        require_parts()
    except NotAvailable as exc:
        return [
            Row(mode="P2", name=n, unit="ms", goal=GOAL, skipped=f"not measured: {exc}")
            for n in _NAMES
        ]
    rows = _declared_and_service(ctx)
    return [*rows, plugin_row(ctx)]


def plugin_row(ctx: Context) -> Row:
    iterations, warmup = (5, 2) if ctx.quick else (100, 10)
    bench = cluster_of(ctx)
    raw = bench.raw()
    try:
        deployment, ours = bench.plugin()
    except Exception as exc:  # the plugin runtime is not there: say so, measure the rest
        return Row(mode="P2", name=_NAMES[4], unit="ms", errors=[f"{type(exc).__name__}: {exc}"])
    agent = deployment.agents[0]

    def raw_node() -> None:
        value = raw.send_task(TASK_BWRAP_NODE, queue=RAW_QUEUE_PLUGIN).get(timeout=_TIMEOUT)
        if value != 1:
            raise WrongResult(f"{TASK_BWRAP_NODE} returned {value!r}")

    turns = in_turns(
        {"raw_node": raw_node, "ours_plugin": lambda: ours.call(agent, TOOL_ONE, {}, _TIMEOUT)},
        iterations=iterations,
        warmup=warmup,
    )
    spec = WORKER_SPECS["plugin"]
    return Row(
        mode="P2",
        name=_NAMES[4],
        unit="ms",
        baseline_name="raw Celery + bwrap node",
        baseline_samples=turns.samples["raw_node"],
        ours_samples=turns.samples["ours_plugin"],
        goal=GOAL_PLUGIN,
        errors=turns.errors_of("raw_node", "ours_plugin"),
        notes=f"one worker process each, pool {spec.pool} x{spec.concurrency}; a trivial "
        "handler (return 1), every call in its own vm context",
    )


def _declared_and_service(ctx: Context) -> list[Row]:
    iterations, warmup = (5, 2) if ctx.quick else (150, 15)
    bench = cluster_of(ctx)
    raw = bench.raw()
    deployment, ours = bench.solo()
    agent = deployment.agents[0]

    def raw_call(task: str, queue: str, expected: object) -> None:
        value = raw.send_task(task, queue=queue).get(timeout=_TIMEOUT)
        if value != expected:
            raise WrongResult(f"{task} returned {value!r}")

    turns = in_turns(
        {
            "raw_noop": lambda: raw_call(TASK_NOOP, RAW_QUEUE_SERVICE, None),
            "raw_bwrap": lambda: raw_call(TASK_BWRAP_TRUE, RAW_QUEUE_SANDBOX, 0),
            "raw_http": lambda: raw_call(TASK_HTTP_POST, RAW_QUEUE_SERVICE, 200),
            "ours_sandbox": lambda: ours.call(agent, TOOL_TRUE, {}, _TIMEOUT),
            "ours_sandbox_turn": lambda: ours.call(agent, TOOL_TRUE, {}, _TIMEOUT, turn=_TURN),
            "ours_service": lambda: ours.call(agent, TOOL_PING, {}, _TIMEOUT),
        },
        iterations=iterations,
        warmup=warmup,
        pause_seconds=PAUSE_SECONDS,
    )
    specs = {k: f"{s.pool} x{s.concurrency}" for k, s in WORKER_SPECS.items()}

    def row(
        name: str, *, base_key: str, ours_key: str, base_name: str, goal: Goal | None, notes: str
    ) -> Row:
        return Row(
            mode="P2",
            name=name,
            unit="ms",
            baseline_name=base_name,
            baseline_samples=turns.samples[base_key],
            ours_samples=turns.samples[ours_key],
            goal=goal,
            errors=turns.errors_of(base_key, ours_key),
            notes=notes,
        )

    service_setup = f"one worker process each, pool {specs['service']}"
    return [
        row(
            _NAMES[0],
            base_key="raw_bwrap",
            ours_key="ours_sandbox",
            base_name="raw Celery + raw bwrap",
            goal=GOAL_DECLARED,
            notes=f"one worker process each, pool {specs['sandbox']}",
        ),
        row(
            _NAMES[1],
            base_key="raw_noop",
            ours_key="ours_service",
            base_name="raw Celery no-op",
            goal=GOAL,
            notes=service_setup,
        ),
        row(
            _NAMES[2],
            base_key="raw_http",
            ours_key="ours_service",
            base_name="raw Celery + httpx POST",
            goal=None,
            notes=f"{service_setup}; no goal: what seed 001's rules, the claim and the "
            "result's one-script store cost over the HTTP call itself",
        ),
        row(
            _NAMES[3],
            base_key="ours_sandbox",
            ours_key="ours_sandbox_turn",
            base_name="ours, no turn",
            goal=GOAL_TURN,
            notes=f"one worker process, pool {specs['sandbox']}; one turn for every call: "
            "its home lane, its home's record read at submit and claim, its workspace kept",
        ),
    ]
