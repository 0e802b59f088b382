"""The rows a mode produces, the printed table, and the JSON document.

A row compares one of ours with one baseline. For latency rows (unit "ms")
lower is better and the goal bounds ours/baseline from above; for throughput
rows (unit "calls/s") higher is better and the goal bounds it from below. A
mode that could not run gives a row with `skipped` set ("not measured: …"),
and one whose calls came back wrong lists them in `errors`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.stats import Summary, ratio, summarize

__all__ = ["Goal", "Row", "machine_info", "render_table", "write_json"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Goal:
    """`median_max`/`p99_max` for latency, `median_min` for throughput (ours/baseline)."""

    median_max: float | None = None
    p99_max: float | None = None
    median_min: float | None = None

    def text(self) -> str:
        parts = []
        if self.median_max is not None:
            parts.append(f"med<={self.median_max:g}x")
        if self.p99_max is not None:
            parts.append(f"p99<={self.p99_max:g}x")
        if self.median_min is not None:
            parts.append(f">={self.median_min:g}x")
        return ", ".join(parts)

    def met(self, median_ratio: float, p99_ratio: float) -> bool:
        return (
            (self.median_max is None or median_ratio <= self.median_max)
            and (self.p99_max is None or p99_ratio <= self.p99_max)
            and (self.median_min is None or median_ratio >= self.median_min)
        )


@dataclass(kw_only=True)
class Row:
    mode: str
    name: str
    unit: str
    baseline_name: str = ""
    ours_name: str = "vessel-workers"
    #: Raw measurements (ms per call, or calls/s per round), kept for the plot.
    baseline_samples: list[float] = field(default_factory=list)
    ours_samples: list[float] = field(default_factory=list)
    #: For throughput rows: per-call latency (ms) of every call of every round, for
    #: the plot and the p99 the table shows next to the throughput.
    baseline_latency_ms: list[float] = field(default_factory=list)
    ours_latency_ms: list[float] = field(default_factory=list)
    goal: Goal | None = None
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)
    notes: str = ""
    #: Anything else a mode measured, carried into the JSON as is.
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return self.skipped is None and bool(self.baseline_samples) and bool(self.ours_samples)

    def summaries(self) -> tuple[Summary, Summary] | None:
        if not self.measured:
            return None
        return summarize(self.baseline_samples), summarize(self.ours_samples)

    def ratios(self) -> tuple[float, float] | None:
        pair = self.summaries()
        if pair is None:
            return None
        base, ours = pair
        return ratio(ours.median, base.median), ratio(ours.p99, base.p99)

    def met(self) -> bool | None:
        ratios = self.ratios()
        if self.goal is None or ratios is None:
            return None
        return self.goal.met(*ratios) and not self.errors

    def as_dict(self) -> dict[str, Any]:
        pair = self.summaries()
        ratios = self.ratios()
        out: dict[str, Any] = {
            "mode": self.mode,
            "name": self.name,
            "unit": self.unit,
            "baseline_name": self.baseline_name,
            "ours_name": self.ours_name,
            "skipped": self.skipped,
            "errors": self.errors,
            "notes": self.notes,
            "details": self.details,
            "goal": None if self.goal is None else self.goal.text(),
            "met": self.met(),
        }
        if pair is not None and ratios is not None:
            out["baseline"] = pair[0].as_dict()
            out["ours"] = pair[1].as_dict()
            out["ratio_median"] = ratios[0]
            out["ratio_p99"] = ratios[1]
        for key, sample in (
            ("baseline_latency_ms", self.baseline_latency_ms),
            ("ours_latency_ms", self.ours_latency_ms),
        ):
            if sample:
                out[key] = summarize(sample).as_dict()
        out["samples"] = {"baseline": self.baseline_samples, "ours": self.ours_samples}
        return out


#: Characters of a "not measured" reason the table shows.
_REASON_WIDTH = 90


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def render_table(rows: list[Row]) -> str:
    header = ["mode", "what", "unit", "base med", "base p99", "ours med", "ours p99", "ratio"]
    header += ["goal", "met?"]
    lines: list[list[str]] = []
    for row in rows:
        pair = row.summaries()
        ratios = row.ratios()
        if pair is None or ratios is None:
            if row.skipped is not None:
                verdict = row.skipped
            else:
                verdict = "not measured: " + ("; ".join(row.errors) or "no samples")
            goal = row.goal.text() if row.goal else ""
            if len(verdict) > _REASON_WIDTH:  # the JSON has it whole
                verdict = verdict[: _REASON_WIDTH - 3] + "..."
            lines.append([row.mode, row.name, row.unit, "-", "-", "-", "-", "-", goal, verdict])
            continue
        base, ours = pair
        met = row.met()
        verdict = "" if met is None else ("yes" if met else "NO")
        if row.errors:
            verdict = f"WRONG ({len(row.errors)} errors)"
        base_tail, ours_tail = _fmt(base.p99), _fmt(ours.p99)
        unit = row.unit
        if row.unit == "calls/s":
            # The p99 of 3 rounds' throughput says little; the tail a user cares
            # about is per-call latency, so that is what this column shows.
            unit = "calls/s | p99 ms"
            base_tail = (
                _fmt(summarize(row.baseline_latency_ms).p99) if row.baseline_latency_ms else "-"
            )
            ours_tail = _fmt(summarize(row.ours_latency_ms).p99) if row.ours_latency_ms else "-"
        lines.append(
            [
                row.mode,
                row.name,
                unit,
                _fmt(base.median),
                base_tail,
                _fmt(ours.median),
                ours_tail,
                f"{ratios[0]:.2f}x" + ("" if row.unit != "ms" else f" / {ratios[1]:.2f}x"),
                row.goal.text() if row.goal else "",
                verdict,
            ]
        )
    widths = [
        max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
        for i, h in enumerate(header)
    ]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    for line in lines:
        out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    notes = [f"  {row.mode} {row.name}: {row.notes}" for row in rows if row.notes and row.measured]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _command_version(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else None


def machine_info() -> dict[str, Any]:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = f"{int(line.split()[1]) // 1024} MiB"
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem_total,
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "vessel-workers": _version("vessel-workers"),
            "celery": _version("celery"),
            "kombu": _version("kombu"),
            "redis-py": _version("redis"),
            "httpx": _version("httpx"),
            "redis-server": _command_version(["redis-server", "--version"]),
            "bwrap": _command_version(["bwrap", "--version"]),
        },
    }


def write_json(path: Path, *, rows: list[Row], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {**meta, "rows": [row.as_dict() for row in rows]}
    path.write_text(json.dumps(document, indent=1, default=str) + "\n")
