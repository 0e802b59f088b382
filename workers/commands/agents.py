"""`vessel-workers agents`: the deployment's agents, their tools and limits.

One row per agent: its id, how many tools it has of each worker kind (sandbox:
declared tools, service: service tools), its max_concurrent_calls and its
per-call limits (time, memory, disk, output shown to the model). Reads only
the deployment; no broker needed.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from workers.commands.common import EXIT_OK, add_verb, fail, load

__all__ = ["add_parser", "rows", "run"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = add_verb(
        subparsers,
        common,
        "agents",
        help="list the deployment's agents, their tool counts, kinds and limits",
        doc=__doc__,
        exit_codes="  0 listed\n  2 the deployment is invalid (its problems on stderr)",
        example="vessel-workers agents -d examples/deployment.toml --json",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead")
    parser.set_defaults(run=run)


def rows(deployment: Any) -> list[dict[str, Any]]:
    out = []
    for agent in deployment.agents.values():
        kinds = Counter(tool.kind for tool in agent.tools.values())
        s = agent.settings
        out.append(
            {
                "id": agent.id,
                "tools": len(agent.tools),
                "kinds": dict(sorted(kinds.items())),
                "max_concurrent_calls": agent.max_concurrent_calls,
                "tool_timeout_seconds": s.tool_timeout_seconds,
                "memory_limit_mb": s.memory_limit_mb,
                "disk_limit_mb": s.disk_limit_mb,
                "tool_output_chars": s.tool_output_chars,
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    loaded = load("agents", args)
    if isinstance(loaded, int):
        return loaded
    _settings, deployment = loaded
    table = rows(deployment)
    if args.json:
        print(json.dumps(table, indent=2))
        return EXIT_OK
    if not table:
        return fail("agents", "the deployment has no agents", EXIT_OK)
    header = ("AGENT", "TOOLS", "KINDS", "MAX_CALLS", "TIMEOUT_S", "MEMORY_MB", "DISK_MB", "OUTPUT")
    lines = [header]
    for r in table:
        kinds = ",".join(f"{kind}:{n}" for kind, n in r["kinds"].items()) or "-"
        lines.append(
            (
                r["id"],
                str(r["tools"]),
                kinds,
                str(r["max_concurrent_calls"]),
                f"{r['tool_timeout_seconds']:g}",
                str(r["memory_limit_mb"]),
                str(r["disk_limit_mb"]),
                str(r["tool_output_chars"]),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return EXIT_OK
