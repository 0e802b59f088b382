"""A PNG of latency distributions: one panel per row, ours against its baseline.

Each panel is an empirical CDF of per-call latency (ms, log scale), so the
median (0.5) and the tail (0.99) read straight off the curves. Throughput rows
plot the latency of every call of every burst (submit to result).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on CI or servers

import matplotlib.pyplot as plt

from bench.report import Row

__all__ = ["plot_latency"]


def _series(row: Row) -> tuple[list[float], list[float]]:
    if row.unit == "ms":
        return row.baseline_samples, row.ours_samples
    return row.baseline_latency_ms, row.ours_latency_ms


def _panels(rows: list[Row]) -> dict[str, dict[str, tuple[list[float], bool]]]:
    """Panel title -> curve label -> (samples, is ours).

    Rows of one mode that share what they measure ("/bin/true: runner vs raw
    bwrap", "/bin/true: runner vs subprocess.run") share a panel, each contender
    drawn once.
    """
    panels: dict[str, dict[str, tuple[list[float], bool]]] = {}
    baselines: dict[str, set[str]] = {}
    for row in rows:
        baseline, ours = _series(row)
        if row.skipped is not None or not baseline or not ours:
            continue
        title = f"{row.mode}: {row.name.split(':')[0]}"
        curves = panels.setdefault(title, {})
        base_label = row.baseline_name or "baseline"
        baselines.setdefault(title, set()).add(base_label)
        curves.setdefault(base_label, (baseline, False))
        curves.setdefault(row.ours_name, (ours, False))
    # Solid lines for what is measured and never a baseline in its panel.
    return {
        title: {
            label: (values, label not in baselines[title]) for label, (values, _) in curves.items()
        }
        for title, curves in panels.items()
    }


def plot_latency(rows: list[Row], path: Path, *, title: str) -> bool:
    """Writes the plot; False when no row has latency samples to draw."""
    panels = _panels(rows)
    if not panels:
        return False
    columns = 2
    lines = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(6.5 * columns, 3.2 * lines), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (panel, curves) in zip(axes.flat, panels.items(), strict=False):
        for label, (values, is_ours) in curves.items():
            ordered = sorted(values)
            fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
            style = "-" if is_ours else "--"
            ax.step(ordered, fractions, style, where="post", label=f"{label} (n={len(values)})")
        ax.set_xscale("log")
        ax.axhline(0.5, color="grey", linewidth=0.5)
        ax.axhline(0.99, color="grey", linewidth=0.5)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("latency per call, ms (log)")
        ax.set_ylabel("fraction of calls")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(True, which="both", alpha=0.3)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
