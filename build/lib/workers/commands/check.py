"""`vessel-workers check`: validate the deployment and every agent package.

Prints one `FILE: FIELD: what is wrong` line per problem and exits 1, or one
summary line (`deployment.toml: 2 agents, 3 tools: valid`) and exits 0.
"""

from __future__ import annotations

import argparse
from typing import Any

from broker.errors import InvalidDeployment
from broker.loading import load_deployment
from broker.model import Deployment

__all__ = ["EXIT_PROBLEMS", "EXIT_VALID", "add_parser", "run", "summary"]

EXIT_VALID = 0
EXIT_PROBLEMS = 1


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "check",
        parents=[common],
        help="validate the deployment and its agent packages",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.set_defaults(run=run)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def summary(deployment: Deployment) -> str:
    """`FILE: N agents, M tools: valid`."""
    tools = sum(len(agent.tools) for agent in deployment.agents.values())
    counts = f"{_count(len(deployment.agents), 'agent')}, {_count(tools, 'tool')}"
    return f"{deployment.path}: {counts}: valid"


def run(args: argparse.Namespace) -> int:
    try:
        deployment = load_deployment(args.deployment)
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem)
        return EXIT_PROBLEMS
    print(summary(deployment))
    return EXIT_VALID
