"""`vessel-workers tools AGENT`: print the tool list the model is given, as JSON.

Each entry is `{name, description, parameters}`: the agent's pinned tools,
its always-listed ones, then the rest up to its `max_listed_tools`, ending
with `search_tools` and `call_tool` when some tools are not listed. `--all`
prints every tool of the agent instead, as `{name, state, reason, permissions}`
(state `listed`, `searchable` or `denied`). Exit 0; 1 when the deployment is
invalid (its problems on stderr); 2 for an unknown agent.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from broker.errors import InvalidDeployment, UnknownAgent
from broker.loading import load_deployment

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_UNKNOWN_AGENT", "EXIT_USAGE", "add_parser", "run"]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNKNOWN_AGENT = 2
#: Options that do not go together (as argparse's own usage errors).
EXIT_USAGE = 2


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "tools",
        parents=[common],
        help="print the tool list an agent's model is given, as JSON",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("agent", metavar="AGENT", help="the agent id")
    parser.add_argument(
        "--format",
        choices=("vessel", "openai", "anthropic", "mcp"),
        default="vessel",
        help="vessel (default: name, description, parameters), openai (Chat Completions "
        "function tools), anthropic (input_schema) or mcp (inputSchema)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="every tool of the agent with its state (listed, searchable, denied), "
        "the reason and its permissions",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from broker.catalogue import Catalogue  # noqa: PLC0415
    from broker.tool_formats import InvalidToolName, in_format  # noqa: PLC0415

    try:
        deployment = load_deployment(args.deployment)
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_INVALID
    try:
        entry = Catalogue.of(deployment).agent(args.agent)
    except UnknownAgent as exc:
        print(f"vessel-workers tools: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN_AGENT
    if args.all:
        if args.format != "vessel":
            print("vessel-workers tools: --all prints states, not a tool format", file=sys.stderr)
            return EXIT_USAGE
        print(json.dumps(entry.states(), indent=2))
        return EXIT_OK
    listing = entry.listed()
    if args.format != "vessel":
        try:
            listing = in_format(listing, args.format)
        except InvalidToolName as exc:
            print(f"vessel-workers tools: {exc}", file=sys.stderr)
            return EXIT_INVALID
    print(json.dumps(listing, indent=2))
    return EXIT_OK
