"""`vessel-workers status`: the live workers per lane and the calls per agent.

Workers: every lane (shared `vessel.<kind>`, dedicated `vessel.<kind>.<agent>`,
home lanes `<lane>@<host>`) with each live worker's concurrency and last
heartbeat. Agents: calls queued and running, whether the agent is blocked at
its max_concurrent_calls, and the oldest queued call's age. Read from
admission's keys in Redis without scanning the keyspace (broker.status).

Last heartbeats are computed from the workers' heartbeat expiry and
VESSEL_HEARTBEAT_SECONDS: set it here as it is set for the workers.
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Sequence
from typing import Any

from workers.commands.common import (
    BROKER_ENV,
    EXIT_ERROR,
    EXIT_OK,
    add_verb,
    connect,
    fail,
)

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = add_verb(
        subparsers,
        common,
        "status",
        help="show live workers per lane and queued/running calls per agent",
        doc=__doc__,
        exit_codes=(
            "  0 shown\n  1 Redis failed while reading\n"
            "  2 no broker (VESSEL_BROKER_URL), an unreachable Redis, an invalid deployment"
        ),
        environment=BROKER_ENV
        + "\n  VESSEL_HEARTBEAT_SECONDS the workers' heartbeat period (default 2)",
        example="VESSEL_BROKER_URL=redis://127.0.0.1:6379/0 vessel-workers status --json",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"workers": [{name, lane, concurrency, last_heartbeat}], '
        '"agents": [{id, queued, running, blocked, oldest_queued_seconds}], '
        '"oldest_queued_seconds"}',
    )
    parser.set_defaults(run=run)


def _when(timestamp: float) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.strftime("%H:%M:%S") + "Z"


def _table(lines: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def _print(status: Any) -> None:
    if status.workers:
        workers = [("LANE", "WORKER", "CONCURRENCY", "LAST_HEARTBEAT")]
        workers += [
            (w.lane, w.name, str(w.concurrency), _when(w.last_heartbeat)) for w in status.workers
        ]
        _table(workers)
    else:
        print("no live workers")
    print()
    agents = [("AGENT", "QUEUED", "RUNNING", "BLOCKED", "OLDEST_QUEUED")]
    for a in status.agents:
        oldest = "-" if a.oldest_queued_seconds is None else f"{a.oldest_queued_seconds:.1f} s"
        agents.append((a.id, str(a.queued), str(a.running), "yes" if a.blocked else "no", oldest))
    _table(agents)
    oldest = status.oldest_queued_seconds
    print()
    print("oldest queued call: " + ("none queued" if oldest is None else f"{oldest:.1f} s"))


def run(args: argparse.Namespace) -> int:
    connected = connect("status", args)
    if isinstance(connected, int):
        return connected
    settings, deployment, client = connected
    from broker.status import read_status  # noqa: PLC0415

    kinds = {a.id: [t.kind for t in a.tools.values()] for a in deployment.agents.values()}
    try:
        redis = getattr(client.admission, "redis")  # noqa: B009 (RedisAdmission: a broker URL)
        status = read_status(redis, kinds, heartbeat_seconds=settings.heartbeat_seconds)
    except Exception as exc:  # redis-py's errors, without importing redis here
        return fail("status", f"reading admission's keys failed: {exc}", EXIT_ERROR)
    finally:
        client.close()
    if args.json:
        print(json.dumps(status.to_dict(), indent=2))
    else:
        _print(status)
    return EXIT_OK
