"""PLUGIN: only the plugin rows (P2 plugin call, P3 plugin burst, MEM plugin worker).

    .venv/bin/python bench/run.py --only PLUGIN

The same rows, measured the same way, as in a full run (`bench/p2_end_to_end.py`,
`bench/p3_burst.py`, `bench/memory_mode.py`), without the other modes: for
repeating the plugin figures several times in one sitting.
"""

from __future__ import annotations

from bench import memory_mode, p2_end_to_end, p3_burst
from bench.context import Context
from bench.ours import NotAvailable, require_parts
from bench.report import Row

__all__ = ["run"]


def run(ctx: Context) -> list[Row]:
    try:
        require_parts()
    except NotAvailable as exc:
        return [Row(mode="PLUGIN", name="plugin rows", unit="-", skipped=f"not measured: {exc}")]
    rows = [p2_end_to_end.plugin_row(ctx), p3_burst.plugin_row(ctx)]
    ctx.ran.append("PLUGIN")
    return [*rows, *memory_mode.run(ctx, only=("ours-plugin-plugin",))]
