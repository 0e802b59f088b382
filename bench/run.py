"""The one entry point: `python bench/run.py [--quick] [--only P1,P3] [--json P] [--plot P]`.

Runs each selected mode (baselines and ours in turns, after warm-up), prints
the table, writes the JSON (`bench/out/results.json`) and the latency plot
(`bench/out/latency.png`). `--quick` is CI's correctness run: a handful of
iterations of every mode, nothing timed is judged, and the exit status is 1 if
any mode failed or returned a wrong result. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

# Run as a script, Python puts bench/ first on sys.path, where bench/profile.py
# would shadow the standard library's `profile` (which cProfile imports). Put
# the repository there instead, so `bench` is a package and stdlib stays stdlib.
_REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == _REPO / "bench":
    sys.path[0] = str(_REPO)

from bench.context import Context  # noqa: E402  (needs the sys.path fix above)
from bench.report import Row, machine_info, render_table, write_json  # noqa: E402

__all__ = ["EXTRA_MODES", "MODES", "main"]

OUT = _REPO / "bench" / "out"


def _p1(ctx: Context) -> list[Row]:
    from bench import p1_sandbox

    return p1_sandbox.run(ctx)


def _p2(ctx: Context) -> list[Row]:
    from bench import p2_end_to_end

    return p2_end_to_end.run(ctx)


def _p2_mcp(ctx: Context) -> list[Row]:
    from bench import p2_mcp

    return p2_mcp.run(ctx)


def _p3(ctx: Context) -> list[Row]:
    from bench import p3_burst

    return p3_burst.run(ctx)


def _p4(ctx: Context) -> list[Row]:
    from bench import p4_agents

    return p4_agents.run(ctx)


def _cat(ctx: Context) -> list[Row]:
    from bench import catalogue

    return catalogue.run(ctx)


def _mem(ctx: Context) -> list[Row]:
    from bench import memory_mode

    return memory_mode.run(ctx)


def _plugin(ctx: Context) -> list[Row]:
    from bench import plugin_mode

    return plugin_mode.run(ctx)


#: Mode name -> runner, in the order they run. MEM reads the workers' peak
#: memory after the bursts, so it comes last.
MODES: dict[str, Callable[[Context], list[Row]]] = {
    "P1": _p1,
    "P2": _p2,
    "P2MCP": _p2_mcp,
    "P3": _p3,
    "P4": _p4,
    "CAT": _cat,
    "MEM": _mem,
}
#: Run only when named in --only: the plugin rows of P2, P3 and MEM on their own.
EXTRA_MODES: dict[str, Callable[[Context], list[Row]]] = {"PLUGIN": _plugin}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run.py", description="vessel-workers against its baselines, side by side."
    )
    parser.add_argument(
        "--quick", action="store_true", help="correctness only: a few iterations, nothing judged"
    )
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated modes ({','.join([*MODES, *EXTRA_MODES])})",
    )
    parser.add_argument("--json", type=Path, default=OUT / "results.json", help="JSON output")
    parser.add_argument("--plot", type=Path, default=OUT / "latency.png", help="PNG output")
    args = parser.parse_args(argv)
    selected = [m.strip().upper() for m in args.only.split(",") if m.strip()] or list(MODES)
    known = {**MODES, **EXTRA_MODES}
    unknown = [m for m in selected if m not in known]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; modes are {', '.join(known)}")
    args.modes = [m for m in known if m in selected]
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (CI timeout, kill) unwinds like Ctrl-C, so the cluster is torn down.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    rows: list[Row] = []
    crashed: list[str] = []
    interrupted: BaseException | None = None
    with tempfile.TemporaryDirectory(prefix="vessel-bench-") as tmp:
        # A root worker's calls run as the sandbox uid, which must pass through
        # this folder to the workspaces and packages under it (never list it).
        os.chmod(tmp, 0o711)
        ctx = Context(quick=args.quick, folder=Path(tmp))
        try:
            for mode in args.modes:
                print(f"== {mode} ...", file=sys.stderr, flush=True)
                mode_started = time.monotonic()
                try:
                    produced = {**MODES, **EXTRA_MODES}[mode](ctx)
                except Exception as exc:
                    traceback.print_exc()
                    crashed.append(mode)
                    produced = [
                        Row(
                            mode=mode,
                            name="mode failed",
                            unit="-",
                            errors=[f"{type(exc).__name__}: {exc}"],
                        )
                    ]
                ctx.ran.append(mode)
                rows += produced
                print(
                    f"   {mode} done in {time.monotonic() - mode_started:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
        except (KeyboardInterrupt, SystemExit) as exc:
            # Stopped from outside: keep what the finished modes measured.
            interrupted = exc
            print(
                f"interrupted ({type(exc).__name__}): reporting the finished modes", file=sys.stderr
            )
        finally:
            if ctx.cluster is not None:
                ctx.cluster.close()

    elapsed = time.monotonic() - started
    table = render_table(rows)
    print(table)
    meta = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "interrupted": interrupted is not None,
        "modes": args.modes,
        "elapsed_seconds": round(elapsed, 1),
        "machine": machine_info(),
        "setup": ctx.cluster.describe() if ctx.cluster is not None else None,
        "table": table,
    }
    write_json(args.json, rows=rows, meta=meta)
    from bench.plot import plot_latency

    plotted = plot_latency(rows, args.plot, title=f"vessel-workers bench, {meta['when']}")
    print(
        f"\n{len(rows)} rows in {elapsed:.0f} s; JSON: {args.json}"
        + (f"; plot: {args.plot}" if plotted else ""),
        file=sys.stderr,
    )
    if interrupted is not None:
        return 130 if isinstance(interrupted, KeyboardInterrupt) else 143
    wrong = [r for r in rows if r.errors]
    if wrong or crashed:
        for row in wrong:
            print(f"WRONG {row.mode} {row.name}: {'; '.join(row.errors)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
