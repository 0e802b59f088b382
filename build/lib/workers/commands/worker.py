"""`vessel-workers worker sandbox|service`: start a Celery worker of one kind.

Without `--agents` the worker consumes its kind's shared lane (every agent);
with `--agents a,b` only the dedicated lanes of those agents. Celery's own
options pass through: --concurrency, --pool, --hostname, --loglevel.

Exit status: the Celery worker's, or 2 when it refuses to start (invalid
deployment, unknown agent, no confinement, a missing secret, no broker, a Redis
that may evict keys).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from broker.errors import InvalidDeployment, VesselError

__all__ = ["add_parser", "run"]

_REFUSED = 2


def _agents(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "worker",
        parents=[common],
        help="start a sandbox or service worker",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("kind", choices=["sandbox", "service"])
    parser.add_argument(
        "--agents", type=_agents, default=(), help="dedicate this worker to these agents (a,b)"
    )
    parser.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=None,
        help="calls at once (default: cores for sandbox, 32 for service)",
    )
    parser.add_argument(
        "-P", "--pool", default="threads", help="Celery pool (default threads; see README)"
    )
    parser.add_argument("-n", "--hostname", default=None, help="Celery node name (%%h = host)")
    parser.add_argument("-l", "--loglevel", default="INFO", help="Celery log level")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the command line imports every verb, and Celery is slow to import.
    from broker.config import Settings  # noqa: PLC0415
    from broker.loading import load_deployment  # noqa: PLC0415
    from workers.worker import WorkerOptions, run_worker  # noqa: PLC0415

    try:
        settings = Settings.from_environ()
        deployment = load_deployment(args.deployment)
        options = WorkerOptions(
            kind=args.kind,
            agents=args.agents,
            concurrency=args.concurrency,
            pool=args.pool,
            hostname=args.hostname,
            loglevel=args.loglevel,
            metrics_port=args.metrics_port,
        )
        return run_worker(deployment, settings, options)
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
    except VesselError as exc:
        print(f"vessel-workers worker {args.kind}: {exc}", file=sys.stderr)
    return _REFUSED
