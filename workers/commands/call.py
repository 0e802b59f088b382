"""`vessel-workers call AGENT TOOL [ARGS]`: run one call and print what the model sees.

ARGS is JSON text (default `{}`; `-` reads standard input). It is sent as
written: text over the agent's `max_argument_bytes` is refused at submit, and
text that is not a JSON object (or nests too deeply, holds NaN or Infinity, or
an integer past Python's digits limit) by the worker, each with the message
the model would get, like any other result (exit status 2).

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
import re
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from broker.errors import (
    BrokerUnavailable,
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
from broker.request import INITIATOR_KINDS, Initiator
from workers.commands import waiting
from workers.commands.common import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from broker.client import VesselClient
    from broker.config import Settings
    from broker.model import Deployment, Tool

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
        "--initiator",
        choices=INITIATOR_KINDS,
        default="platform",
        metavar="KIND",
        help="what started the turn, as plugin tools see it: "
        f"{', '.join(INITIATOR_KINDS)} (default platform)",
    )
    parser.add_argument(
        "--verified",
        action="store_true",
        help="every input of the turn came from a signed-in user or a verified contact",
    )
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


def _fail(message: str, code: int = EXIT_REFUSED) -> int:
    print(f"vessel-workers call: {message}", file=sys.stderr)
    return code


def _missing_here(exc: MissingSecret) -> str:
    """The embedded default resolves the called agent's secrets in this process:
    name the variables this call needs, not a worker that does not exist."""
    details = [line for line in str(exc).splitlines() if not line.startswith("service workers")]
    names = sorted(set(re.findall(r"environment variable (\S+) is not set", str(exc))))
    need = ", ".join(names) or "a secret"
    return (
        f"this call needs {need}, which is not set here ({'; '.join(details)}); set it, "
        "or set VESSEL_BROKER_URL to send the call to service workers that have it"
    )


def _runs(deployment: Deployment, agent: str, tool: str, text: str) -> Tool | None:
    """The tool a worker runs for this call; None when the catalogue answers it at
    submit (search_tools, or call_tool refusing); UnknownAgent, UnknownTool."""
    from broker.catalogue import Answer, route_call  # noqa: PLC0415

    routed = route_call(deployment, agent, tool, text)
    if isinstance(routed, Answer):
        return None
    return deployment.agent(agent).tool(tool if routed is None else routed.tool)


@contextmanager
def _answering_client(deployment: Deployment, settings: Settings) -> Iterator[VesselClient]:
    """An embedded client without a worker: for calls the catalogue answers at submit."""
    from broker.celery_app import longest_timeout, make_app  # noqa: PLC0415
    from broker.client import VesselClient  # noqa: PLC0415
    from broker.embedded import LocalAdmission  # noqa: PLC0415

    app = make_app(settings, longest_tool_seconds=longest_timeout(deployment))
    client = VesselClient(deployment, settings, app=app, admission=LocalAdmission())
    try:
        yield client
    finally:
        client.close()
        app.close()


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
        # The tool a worker runs: call_tool's, or None when the catalogue answers.
        tool = _runs(deployment, args.agent, args.tool, text)
        kind = tool.kind if tool is not None else None
        # Only the called plugin's settings are needed here.
        plugins = [tool.plugin] if tool is not None and tool.kind == "plugin" else None
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_REFUSED
    except (ValueError, ConfigError, UnknownAgent, UnknownTool) as exc:
        return _fail(str(exc))

    with ExitStack() as stack:
        try:
            if settings.embedded and kind is None:
                # search_tools (or a refusal) is answered at submit: no worker.
                client = stack.enter_context(_answering_client(deployment, settings))
            elif settings.embedded and kind is not None:
                from workers.embedded import embedded_client  # noqa: PLC0415

                # Only the called agent's secrets are needed here.
                embedded = embedded_client(
                    deployment, settings, kind, [args.agent], plugins=plugins
                )
                client = stack.enter_context(embedded)
            else:
                from broker.client import VesselClient  # noqa: PLC0415
                from broker.reach import check_reachable  # noqa: PLC0415

                check_reachable(settings)
                client = VesselClient(deployment, settings)
                stack.callback(client.close)
        except MissingSecret as exc:
            return _fail(_missing_here(exc) if settings.embedded else str(exc))
        except BrokerUnavailable as exc:
            return _fail(f"{exc} (nothing ran)")
        except (ConfinementUnavailable, ConfigError) as exc:
            return _fail(str(exc))
        try:
            initiator = Initiator(kind=args.initiator, is_verified_person=args.verified)
            handle = client.submit(
                args.agent, args.tool, text, owner=owner, turn=args.turn, initiator=initiator
            )
        except TransientError as exc:
            # A submit cut off between script and reply says so itself.
            text = str(exc)
            return _fail(text if "may have been queued" in text else f"{text} (nothing ran)")
        except KeyboardInterrupt:
            return _fail("interrupted before the call was queued", EXIT_INTERRUPTED)
        try:
            result = waiting.wait(handle, timeout=args.timeout, live=not args.json)
        except CallTimeout as exc:
            handle.cancel()
            print(f"vessel-workers call: {exc}; the call was cancelled", file=sys.stderr)
            return EXIT_ERROR
        except waiting.Interrupted as exc:
            return _fail(str(exc), EXIT_INTERRUPTED)

    if args.json:
        print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    else:
        output = result.output
        sys.stdout.write(output if output.endswith("\n") else output + "\n")
    sys.stdout.flush()
    return exit_code(result)
