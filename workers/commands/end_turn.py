"""`vessel-workers end-turn TURN`: the turn is over; remove its workspaces.

With VESSEL_BROKER_URL every sandbox host removes the turn's workspace of every
agent, and the turn's homes are forgotten (`client.end_turn`); without it (the
embedded default), the workspaces under this machine's workspace root
(VESSEL_WORKSPACE_ROOT), where an embedded `call --turn` ran. The calls'
results stay until they expire. Without this a workspace is removed once idle
for the workspace TTL.
"""

from __future__ import annotations

import argparse
from typing import Any

from broker.errors import TransientError
from workers.commands.common import (
    BROKER_ENV,
    EXIT_ERROR,
    EXIT_OK,
    add_verb,
    fail,
    load,
    remote_client,
)

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = add_verb(
        subparsers,
        common,
        "end-turn",
        help="end a turn: its workspaces are removed on every sandbox host",
        doc=__doc__,
        exit_codes=(
            "  0 ended (also for a turn nobody knows: there is nothing to remove)\n"
            "  1 Redis failed while sending it\n"
            "  2 an unreachable Redis, an invalid deployment"
        ),
        environment=BROKER_ENV + "\n  VESSEL_WORKSPACE_ROOT the workspace root (embedded default)",
        example="vessel-workers end-turn turn-42",
    )
    parser.add_argument("turn", metavar="TURN", help="the turn id given to call --turn")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    loaded = load("end-turn", args)
    if isinstance(loaded, int):
        return loaded
    settings, deployment = loaded
    if settings.embedded:
        from workers.sandbox.workspace import (  # noqa: PLC0415
            WorkspaceStore,
            default_workspace_root,
        )

        store = WorkspaceStore(default_workspace_root())
        try:
            for agent in deployment.agents:
                store.end_turn(agent, args.turn)
        except OSError as exc:
            return fail("end-turn", f"removing the workspaces failed: {exc}", EXIT_ERROR)
        print(f"turn {args.turn} ended: its workspaces here are removed")
        return EXIT_OK
    client = remote_client("end-turn", settings, deployment)
    if isinstance(client, int):
        return client
    try:
        client.end_turn(args.turn)
    except TransientError as exc:
        return fail("end-turn", str(exc), EXIT_ERROR)
    except Exception as exc:  # redis-py's errors, without importing redis here
        return fail("end-turn", f"sending the end of the turn failed: {exc}", EXIT_ERROR)
    finally:
        client.close()
    print(f"turn {args.turn} ended: every sandbox host removes its workspaces")
    return EXIT_OK
