"""What the verbs share: exit codes, the one-line failure, loading, a connected client.

Every failure a verb reports is one line on stderr, `vessel-workers VERB:
what went wrong and what to check`, never a traceback; an invalid deployment
prints its problems, one `FILE: FIELD: message` line each.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from broker.errors import BrokerUnavailable, ConfigError, InvalidDeployment

if TYPE_CHECKING:
    from broker.client import VesselClient
    from broker.config import Settings
    from broker.model import Deployment

__all__ = [
    "BROKER_ENV",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "add_verb",
    "connect",
    "epilog",
    "fail",
    "load",
    "print_result",
    "remote_client",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REFUSED = 2
#: 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C.
EXIT_INTERRUPTED = 130

#: The environment every verb that loads a deployment reads.
_DEPLOYMENT_ENV = "  VESSEL_DEPLOYMENT     the deployment file when -d is not given"
#: What a verb that talks to the workers reads as well.
BROKER_ENV = (
    "  VESSEL_BROKER_URL     the broker's Redis, redis://HOST:PORT/DB (rediss:// for TLS)\n"
    "  VESSEL_RESULT_BACKEND the result backend (default: the broker's Redis)"
)


def epilog(*, exit_codes: str, example: str, environment: str = "") -> str:
    """The end of a verb's --help: exit status, environment, an example
    (for argparse.RawDescriptionHelpFormatter: the text is kept as written)."""
    env = "\n".join(x for x in (_DEPLOYMENT_ENV, environment) if x)
    return f"exit status:\n{exit_codes}\n\nenvironment:\n{env}\n\nexample:\n  {example}\n"


def add_verb(
    subparsers: Any,
    common: argparse.ArgumentParser,
    name: str,
    *,
    help: str,
    doc: str | None,
    exit_codes: str,
    example: str,
    environment: str = "",
) -> argparse.ArgumentParser:
    """A verb's parser: its one-line help, its module docstring as the
    description, and the epilog every verb ends its --help with."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        parents=[common],
        help=help,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog(exit_codes=exit_codes, environment=environment, example=example),
    )
    return parser


def fail(verb: str, message: str, code: int = EXIT_REFUSED) -> int:
    print(f"vessel-workers {verb}: {message}", file=sys.stderr)
    return code


def load(verb: str, args: argparse.Namespace) -> tuple[Settings, Deployment] | int:
    """The settings and the deployment, or the exit code after saying what is wrong."""
    from broker.config import Settings  # noqa: PLC0415 (see workers.commands.call)
    from broker.loading import load_deployment  # noqa: PLC0415

    try:
        return Settings.from_environ(), load_deployment(args.deployment)
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_REFUSED
    except (ValueError, ConfigError) as exc:
        return fail(verb, str(exc))


def remote_client(verb: str, settings: Settings, deployment: Deployment) -> VesselClient | int:
    """A client of the real workers (VESSEL_BROKER_URL), its Redis checked reachable;
    or the exit code (2) after one line saying why not."""
    from broker.client import VesselClient  # noqa: PLC0415
    from broker.reach import check_reachable  # noqa: PLC0415

    if settings.broker_url is None:
        return fail(
            verb,
            "VESSEL_BROKER_URL is not set: this verb reads the broker's Redis "
            "(redis://HOST:PORT/DB) that the workers use",
        )
    try:
        check_reachable(settings)
        return VesselClient(deployment, settings)
    except (BrokerUnavailable, ConfigError, ValueError) as exc:
        return fail(verb, str(exc))


def connect(verb: str, args: argparse.Namespace) -> tuple[Settings, Deployment, VesselClient] | int:
    """`load`, then `remote_client`: what a verb that reads the workers' Redis
    starts with; or the exit code after one line saying what is wrong."""
    loaded = load(verb, args)
    if isinstance(loaded, int):
        return loaded
    settings, deployment = loaded
    client = remote_client(verb, settings, deployment)
    if isinstance(client, int):
        return client
    return settings, deployment, client


def print_result(result: Any, *, as_json: bool) -> None:
    """What `call` prints: the text the model sees, or the whole result as JSON."""
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    else:
        output = result.output
        sys.stdout.write(output if output.endswith("\n") else output + "\n")
    sys.stdout.flush()
