"""`vessel-workers tools AGENT`: print the tool list the model is given, as JSON.

Each entry is `{name, description, parameters}`, in declaration order. Exit 0;
1 when the deployment is invalid (its problems on stderr); 2 for an unknown agent.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from broker.errors import InvalidDeployment, UnknownAgent
from broker.loading import load_deployment

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_UNKNOWN_AGENT", "add_parser", "run"]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNKNOWN_AGENT = 2


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "tools",
        parents=[common],
        help="print the tool list an agent's model is given, as JSON",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("agent", metavar="AGENT", help="the agent id")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        deployment = load_deployment(args.deployment)
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_INVALID
    try:
        agent = deployment.agent(args.agent)
    except UnknownAgent as exc:
        print(f"vessel-workers tools: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN_AGENT
    print(json.dumps(agent.catalogue(), indent=2))
    return EXIT_OK
