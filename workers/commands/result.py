"""`vessel-workers result CALL_ID`: wait for a call's result and print it as `call` does.

The text the model sees (or the whole result with --json). A call still queued
or running is waited for (--timeout to give up; Ctrl-C stops waiting and
leaves the call running). Needs the workers' broker (VESSEL_BROKER_URL):
results of the embedded default live only in the process that ran the call.
"""

from __future__ import annotations

import argparse
from typing import Any

from broker.errors import CallTimeout, TransientError
from workers.commands import waiting
from workers.commands.common import (
    BROKER_ENV,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    add_verb,
    connect,
    fail,
    print_result,
)

__all__ = ["add_parser", "known", "run"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = add_verb(
        subparsers,
        common,
        "result",
        help="print a call's result (waiting for it), as call does",
        doc=__doc__,
        exit_codes=(
            "  0 a result\n  1 an error result (the tool failed, timed out, was cancelled),\n"
            "    or no result within --timeout\n"
            "  2 an unknown call id (never submitted, or its result expired), no broker,\n"
            "    an unreachable Redis, an invalid deployment\n"
            "  130 interrupted (Ctrl-C); the call goes on"
        ),
        environment=BROKER_ENV,
        example="vessel-workers result 3f2a9c0e5b7d4e1f8a6b2c4d0e9f1a3b --json",
    )
    parser.add_argument("call_id", metavar="CALL_ID", help="the call's id (a result's call_id)")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up after this long (default: wait for the result)",
    )
    parser.set_defaults(run=run)


def known(client: Any, call_id: str) -> bool:
    """True if the call is queued, running or has a result still kept."""
    from broker.status import call_state  # noqa: PLC0415

    if call_state(client.admission.redis, call_id).state != "unknown":
        return True
    return bool(client.app.backend.get_task_meta(call_id).get("status") == "SUCCESS")


def run(args: argparse.Namespace) -> int:
    connected = connect("result", args)
    if isinstance(connected, int):
        return connected
    _settings, _deployment, client = connected
    from broker.client import CallHandle  # noqa: PLC0415
    from workers.commands.call import exit_code  # noqa: PLC0415

    try:
        if not known(client, args.call_id):
            return fail(
                "result",
                f"no call {args.call_id} is known here (never submitted to this broker, "
                "or its result expired)",
                EXIT_REFUSED,
            )
        handle = CallHandle(args.call_id, client)
        result = waiting.wait(handle, timeout=args.timeout, live=not args.json, cancel=False)
    except CallTimeout as exc:
        return fail("result", f"{exc}; the call goes on", EXIT_ERROR)
    except waiting.Interrupted as exc:
        return fail("result", str(exc), EXIT_INTERRUPTED)
    except TransientError as exc:
        return fail("result", str(exc), EXIT_ERROR)
    finally:
        client.close()
    print_result(result, as_json=args.json)
    return exit_code(result)
