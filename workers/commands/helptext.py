"""The --help of the verbs defined before this module: their exit status,
environment, an example, and a sentence for each argument that had none.

Kept apart from those verbs' modules so that their argument parsing stays
theirs; `workers.cli` applies it after building the parser. The verbs added
since (`agents`, `status`, `result`, `cancel`, `end-turn`) carry their own.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workers.commands.common import BROKER_ENV, epilog

__all__ = ["ARGUMENT_HELP", "EPILOGS", "apply"]

_SECRETS = "  the grants' env:NAME variables (service tools), e.g. RECORDS_TOKEN"

EPILOGS: dict[str, str] = {
    "check": epilog(
        exit_codes="  0 valid\n  1 problems (one FILE: FIELD: message line each)",
        example="vessel-workers check -d examples/deployment.toml",
    ),
    "tools": epilog(
        exit_codes="  0 printed\n  1 the deployment is invalid\n  2 an unknown agent",
        example="vessel-workers tools field-guide -d examples/deployment.toml",
    ),
    "call": epilog(
        exit_codes=(
            "  0 a result\n"
            "  1 an error result (the tool failed, timed out, was cancelled), or no result\n"
            "    within --timeout (the call is then cancelled)\n"
            "  2 refused before running: arguments the worker refused, an unknown agent or\n"
            "    tool, a bad owner, an invalid deployment or setting, no confinement or a\n"
            "    missing secret here, an unreachable or refusing broker Redis (nothing ran)\n"
            "  130 interrupted (Ctrl-C): the call was cancelled"
        ),
        environment=(
            BROKER_ENV + "\n"
            "                        (unset: the embedded default runs the call here)\n"
            "  VESSEL_WORKSPACE_ROOT where the embedded default keeps turns' workspaces\n"
            + _SECRETS
            + " (embedded default)"
        ),
        example=(
            'vessel-workers call field-guide species \'{"habitat": "rivers"}\' '
            "-d examples/deployment.toml"
        ),
    ),
    "files": epilog(
        exit_codes=(
            "  0 done\n  1 refused by the workspace (no such file, a folder where a file is\n"
            "    wanted, too large), or no answer within --timeout\n"
            "  2 refused before anything was sent: a path of the wrong form, an unknown agent,\n"
            "    an invalid deployment or setting, an unreachable broker Redis"
        ),
        environment=BROKER_ENV + "\n  VESSEL_WORKSPACE_ROOT the workspace root (embedded default)",
        example="vessel-workers files field-guide turn-42 ls",
    ),
    "worker": epilog(
        exit_codes=(
            "  0 warm shutdown (SIGTERM: running calls finish first)\n"
            "  2 refused to start: an invalid deployment, an unknown agent, no confinement,\n"
            "    a missing secret, no broker, a Redis that may evict keys"
        ),
        environment=(
            BROKER_ENV + "\n"
            "  VESSEL_HOST_ID        a sandbox host's id (default: the hostname)\n"
            "  VESSEL_WORKSPACE_ROOT the sandbox workspaces' folder\n"
            "  VESSEL_SANDBOX_CGROUPS per-call (default) or off\n"
            "  VESSEL_TASK_EVENTS    on-request (default) or always: Flower's task events\n"
            "  VESSEL_HEARTBEAT_SECONDS, VESSEL_SWEEP_SECONDS, VESSEL_LEASE_GRACE_SECONDS\n"
            + _SECRETS
            + " (service workers)"
        ),
        example=(
            "VESSEL_BROKER_URL=redis://127.0.0.1:6379/0 vessel-workers worker sandbox "
            "-d examples/deployment.toml"
        ),
    ),
}

#: verb -> argument dest -> its help, for the arguments defined without one.
ARGUMENT_HELP: dict[str, dict[str, str]] = {
    "call": {"agent": "the agent id", "tool": "the tool's name, as `tools AGENT` lists it"},
    "files": {
        "agent": "the agent id",
        "turn": "the turn id given to call --turn",
        "op": "what to do: ls, get, put or rm (`files AGENT TURN OP --help`)",
    },
    "worker": {"kind": "sandbox (declared tools) or service (service tools)"},
}


def apply(subparsers: Any) -> None:
    """Give each verb its full description, epilog and argument help."""
    for name, parser in subparsers.choices.items():
        if name in EPILOGS and parser.epilog is None:
            parser.epilog = EPILOGS[name]
            parser.formatter_class = argparse.RawDescriptionHelpFormatter
            module = sys.modules.get(parser.get_default("run").__module__)
            if module is not None and module.__doc__:
                parser.description = module.__doc__
        for action in parser._actions:
            text = ARGUMENT_HELP.get(name, {}).get(action.dest)
            if text and not action.help:
                action.help = text
