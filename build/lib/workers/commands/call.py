"""`vessel-workers call AGENT TOOL [ARGS]`: run one call and print what the model sees.

ARGS is JSON text (default `{}`; `-` reads standard input). It is sent as
written: text that is not a JSON object is refused by the worker with the
message the model would get, like any other result.

Without VESSEL_BROKER_URL the call runs on the embedded default (broker,
admission and a worker in this process, confinement real); with it, the call
goes to the real workers and this waits for the result.

Exit status: 0 a result; 1 an error result (the tool failed, timed out, was
cancelled; or no result within --timeout); 2 refused before running (arguments
the worker refused, an unknown agent or tool, a bad owner, an invalid
deployment or setting, no confinement or a missing secret here).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from typing import Any

from broker.errors import (
    CallTimeout,
    ConfigError,
    ConfinementUnavailable,
    InvalidDeployment,
    MissingSecret,
    TransientError,
    UnknownAgent,
    UnknownTool,
)
from broker.owner import DEFAULT_OWNER, check_owner

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_REFUSED", "add_parser", "exit_code", "run"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REFUSED = 2


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "call",
        parents=[common],
        help="run one tool call and print the text the model sees",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("agent", metavar="AGENT")
    parser.add_argument("tool", metavar="TOOL")
    parser.add_argument(
        "arguments",
        metavar="ARGS",
        nargs="?",
        default="{}",
        help="the arguments as JSON text (default {}; - reads standard input)",
    )
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument(
        "--owner",
        default=DEFAULT_OWNER,
        help=f"the turn's owner, app/user or 'issuer|subject' (default {DEFAULT_OWNER})",
    )
    parser.add_argument("--turn", default=None, help="the turn id (calls of one turn share files)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up (and cancel the call) after this long (default: wait for the result)",
    )
    parser.set_defaults(run=run)


def exit_code(result: Any) -> int:
    """0 a result, 1 an error result, 2 refused before running."""
    if result.outcome == "refused":
        return EXIT_REFUSED
    return EXIT_ERROR if result.is_error else EXIT_OK


def _fail(message: str) -> int:
    print(f"vessel-workers call: {message}", file=sys.stderr)
    return EXIT_REFUSED


def run(args: argparse.Namespace) -> int:
    # Imported here, not at the top: every verb's module is imported by the
    # command line, and Celery alone takes a third of a second to import.
    from broker.config import Settings  # noqa: PLC0415
    from broker.loading import load_deployment  # noqa: PLC0415

    text = sys.stdin.read() if args.arguments == "-" else args.arguments
    try:
        settings = Settings.from_environ()
        owner = check_owner(args.owner)
        deployment = load_deployment(args.deployment)
        kind = deployment.agent(args.agent).tool(args.tool).kind
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_REFUSED
    except (ValueError, ConfigError, UnknownAgent, UnknownTool) as exc:
        return _fail(str(exc))

    with ExitStack() as stack:
        try:
            if settings.embedded:
                from workers.worker import embedded_client  # noqa: PLC0415

                # Only the called agent's secrets are needed here.
                embedded = embedded_client(deployment, settings, kind, [args.agent])
                client = stack.enter_context(embedded)
            else:
                from broker.client import VesselClient  # noqa: PLC0415

                client = VesselClient(deployment, settings)
                stack.callback(client.close)
        except (ConfinementUnavailable, MissingSecret, ConfigError) as exc:
            return _fail(str(exc))
        try:
            handle = client.submit(args.agent, args.tool, text, owner=owner, turn=args.turn)
        except TransientError as exc:
            return _fail(f"{exc} (nothing ran)")
        try:
            result = handle.result(timeout=args.timeout)
        except CallTimeout as exc:
            handle.cancel()
            print(f"vessel-workers call: {exc}; the call was cancelled", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            handle.cancel()
            raise

    if args.json:
        print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    else:
        output = result.output
        sys.stdout.write(output if output.endswith("\n") else output + "\n")
    sys.stdout.flush()
    return exit_code(result)
