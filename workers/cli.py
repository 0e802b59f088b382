"""The `vessel-workers` command line: one module per verb in `workers.commands`.

Every verb's --help names its arguments, exit status, environment and an
example (docs/operations.md has them all in one page).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from broker.constants import DEFAULT_DEPLOYMENT_FILE, ENV_DEPLOYMENT
from workers.commands import (
    agents,
    call,
    cancel,
    check,
    end_turn,
    files,
    helptext,
    result,
    status,
    tools,
    worker,
)
from workers.commands import mcp as mcp_verb

__all__ = ["build_parser", "default_deployment", "main"]

_VERBS = (check, tools, agents, call, result, cancel, end_turn, status, files, worker)
_MORE_VERBS = (mcp_verb,)


def default_deployment() -> Path:
    """`$VESSEL_DEPLOYMENT`, then `./deployment.toml`."""
    return Path(os.environ.get(ENV_DEPLOYMENT) or DEFAULT_DEPLOYMENT_FILE)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vessel-workers",
        description="Run AI agents' tool calls: declared tools confined, service tools over HTTP.",
        epilog="`vessel-workers VERB --help` describes each verb, its exit status and environment.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-d",
        "--deployment",
        type=Path,
        default=None,
        help=f"deployment file (default ${ENV_DEPLOYMENT}, then ./{DEFAULT_DEPLOYMENT_FILE})",
    )
    subparsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in (*_VERBS, *_MORE_VERBS):
        verb.add_parser(subparsers, common)
    helptext.apply(subparsers)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("vessel-workers")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.deployment is None:
        args.deployment = default_deployment()
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
