"""`vessel-workers mcp AGENT`: serve one agent's catalogue as an MCP server.

Over standard input and output by default (calls run as --owner); over
streamable HTTP at http://HOST:PORT/mcp with --http HOST:PORT, where every
request needs a bearer token of the deployment's `[mcp] tokens`, and the
token's owner is the owner of the calls. Each MCP session is one turn: its
calls share a workspace, removed when the session ends.

Without VESSEL_BROKER_URL calls run on the embedded default (in this process,
confinement real; an agent whose tools are all of one kind); with it, on the
real workers.

Exit status: 0 when the client closed the session (stdio) or the server was
stopped; 2 refused before serving (an invalid deployment, an unknown agent, a
bad owner or address, a tool name the model APIs refuse, a token variable that
is not set, no confinement here).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from typing import Any

from broker.errors import (
    ConfigError,
    ConfinementUnavailable,
    InvalidDeployment,
    MissingSecret,
    UnknownAgent,
)
from broker.owner import DEFAULT_OWNER, check_owner
from workers.commands.common import BROKER_ENV, epilog

__all__ = ["EXIT_OK", "EXIT_REFUSED", "add_parser", "parse_address", "run"]

EXIT_OK = 0
EXIT_REFUSED = 2


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "mcp",
        parents=[common],
        help="serve an agent's tools as an MCP server (stdio, or --http HOST:PORT)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog(
            exit_codes=(
                "  0 the client closed the session (stdio) or the server was stopped\n"
                "  2 refused before serving: an invalid deployment, an unknown agent, a bad\n"
                "    owner or address, a tool name the model APIs refuse (over 64 characters),\n"
                "    a token variable that is not set, no confinement here"
            ),
            environment=(
                BROKER_ENV + "\n"
                "                        (unset: calls run on the embedded default here)\n"
                "  the [mcp] tokens' env:NAME variables (--http)"
            ),
            example=(
                "vessel-workers mcp field-guide --http 127.0.0.1:8765 -d examples/deployment.toml"
            ),
        ),
    )
    parser.add_argument("agent", metavar="AGENT", help="the agent id")
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        default=None,
        help="serve streamable HTTP at http://HOST:PORT/mcp (bearer tokens from [mcp] tokens)",
    )
    parser.add_argument(
        "--owner",
        default=DEFAULT_OWNER,
        help=f"the owner of the calls over stdio, app/user or 'issuer|subject' "
        f"(default {DEFAULT_OWNER})",
    )
    parser.set_defaults(run=run)


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets); ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)


def _fail(message: str) -> int:
    print(f"vessel-workers mcp: {message}", file=sys.stderr)
    return EXIT_REFUSED


def run(args: argparse.Namespace) -> int:
    # Imported here: every verb's module is imported by the command line.
    import anyio  # noqa: PLC0415

    from broker.config import Settings  # noqa: PLC0415
    from broker.loading import load_deployment  # noqa: PLC0415
    from broker.tool_formats import in_format, listed  # noqa: PLC0415

    try:
        settings = Settings.from_environ()
        deployment = load_deployment(args.deployment)
        agent = deployment.agent(args.agent)
        # A name the model APIs refuse is refused here, before anything is served.
        in_format(listed(deployment, args.agent), "mcp")
        address = parse_address(args.http) if args.http is not None else None
        owner = check_owner(args.owner) if address is None else None
        tokens: dict[str, str] = {}
        if address is not None:
            from workers.mcp.http import resolve_tokens  # noqa: PLC0415

            tokens = resolve_tokens(deployment.mcp)
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_REFUSED
    except (ValueError, ConfigError, UnknownAgent) as exc:
        return _fail(str(exc))

    from workers.mcp import serve_stdio  # noqa: PLC0415
    from workers.mcp.server import Turns, build_server  # noqa: PLC0415

    with ExitStack() as stack:
        try:
            if settings.embedded:
                from workers.embedded import embedded_client  # noqa: PLC0415

                kinds = sorted({tool.kind for tool in agent.tools.values()})
                if len(kinds) > 1:
                    return _fail(
                        f"agent {args.agent!r} has tools of several kinds ({', '.join(kinds)}): "
                        "the embedded default runs one; set VESSEL_BROKER_URL to use the workers"
                    )
                kind = kinds[0] if kinds else "sandbox"
                client = stack.enter_context(
                    embedded_client(deployment, settings, kind, [args.agent])
                )
            else:
                from broker.client import VesselClient  # noqa: PLC0415

                client = VesselClient(deployment, settings)
                stack.callback(client.close)
        except (ConfinementUnavailable, MissingSecret, ConfigError) as exc:
            return _fail(str(exc))
        turns = Turns(client)
        server = build_server(client, args.agent, owner=owner, turns=turns)
        try:
            if address is None:
                anyio.run(serve_stdio, server, turns)
            else:
                from workers.mcp.http import serve_http  # noqa: PLC0415

                host, port = address
                print(f"vessel-workers mcp: serving http://{host}:{port}/mcp", file=sys.stderr)

                async def main() -> None:
                    await serve_http(server, host=host, port=port, tokens=tokens, turns=turns)

                anyio.run(main)
        except KeyboardInterrupt:
            pass
    return EXIT_OK
