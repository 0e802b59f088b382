"""`vessel-workers cancel CALL_ID`: cancel a queued or running call.

A queued call never starts; a running one has its process tree (declared
tools) or HTTP request (service tools) stopped on whatever host runs it. Either
way its result is `[cancelled]` (`vessel-workers result CALL_ID`).
"""

from __future__ import annotations

import argparse
from typing import Any

from broker.errors import TransientError
from workers.commands.common import (
    BROKER_ENV,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_REFUSED,
    add_verb,
    connect,
    fail,
)

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = add_verb(
        subparsers,
        common,
        "cancel",
        help="cancel a queued or running call",
        doc=__doc__,
        exit_codes=(
            "  0 cancelled (it was queued or running)\n  1 it had already finished "
            "(or Redis failed)\n  2 an unknown call id, no broker, an unreachable Redis, "
            "an invalid deployment"
        ),
        environment=BROKER_ENV,
        example="vessel-workers cancel 3f2a9c0e5b7d4e1f8a6b2c4d0e9f1a3b",
    )
    parser.add_argument("call_id", metavar="CALL_ID", help="the call's id")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    connected = connect("cancel", args)
    if isinstance(connected, int):
        return connected
    _settings, _deployment, client = connected
    try:
        outcome = client.cancel_outcome(args.call_id)
    except TransientError as exc:
        return fail("cancel", str(exc), EXIT_ERROR)
    finally:
        client.close()
    if outcome == "queued":
        print(f"call {args.call_id} cancelled before it started")
        return EXIT_OK
    if outcome == "signalled":
        print(f"call {args.call_id} cancelled: it is being stopped where it runs")
        return EXIT_OK
    if outcome == "finished":
        return fail("cancel", f"call {args.call_id} had already finished", EXIT_ERROR)
    return fail(
        "cancel",
        f"no call {args.call_id} is known here (never submitted to this broker, "
        "or its result expired)",
        EXIT_REFUSED,
    )
