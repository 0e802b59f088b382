"""MEM: peak resident memory of each worker kind, read after the bursts.

Reads `VmHWM` of every process of each worker's tree (`bench.memory`) once
the modes before it have run, so with P3/P4 in the run it is the peak under a
2,000-call burst. Ours against the raw Celery worker of the same pool and
concurrency; no goal.
"""

from __future__ import annotations

from bench.context import Context
from bench.memory import tree_memory
from bench.ours import NotAvailable, require_parts
from bench.report import Row
from bench.stack import cluster_of

__all__ = ["run"]

#: (row name, baseline worker, our worker)
_PAIRS = (
    ("sandbox worker peak RSS", "raw-sandbox", "ours-solo-sandbox"),
    ("service worker peak RSS", "raw-service", "ours-solo-service"),
    ("service worker peak RSS, 1000 agents", "raw-service", "ours-many-service"),
    ("plugin worker peak RSS", "raw-plugin", "ours-plugin-plugin"),
)


def run(ctx: Context, *, only: tuple[str, ...] = ()) -> list[Row]:
    """Every pair's row, or only those whose our worker is in `only`."""
    pairs = [p for p in _PAIRS if not only or p[2] in only]
    try:
        require_parts()
    except NotAvailable as exc:
        return [
            Row(mode="MEM", name=n, unit="MiB", skipped=f"not measured: {exc}") for n, _, _ in pairs
        ]
    bench = cluster_of(ctx)
    if not any(m in ctx.ran for m in ("P3", "P4", "PLUGIN")):
        # Start the workers so there is something to read; the figure is then
        # the peak of start-up and a few calls, and the note says so.
        bench.raw()
        bench.solo()
    bursts = any(m in ctx.ran for m in ("P3", "P4", "PLUGIN"))
    under = "under P3/P4 bursts" if bursts else "idle"
    rows = []
    for name, base_name, ours_name in pairs:
        base = bench.workers.get(base_name)
        ours = bench.workers.get(ours_name)
        if base is None or ours is None:
            rows.append(
                Row(
                    mode="MEM",
                    name=name,
                    unit="MiB",
                    skipped="not measured: that worker did not run in this run",
                )
            )
            continue
        base_mem, ours_mem = tree_memory(base.pid), tree_memory(ours.pid)
        rows.append(
            Row(
                mode="MEM",
                name=name,
                unit="MiB",
                baseline_name=base_name,
                baseline_samples=[base_mem.total_mib],
                ours_samples=[ours_mem.total_mib],
                notes=f"{under}; sum of VmHWM over the tree: ours {ours_mem.processes} "
                f"processes (largest {ours_mem.largest_mib:.0f} MiB), baseline "
                f"{base_mem.processes} (largest {base_mem.largest_mib:.0f} MiB)",
            )
        )
    return rows
