"""Celery queue ("lane") names, task names and worker kinds, each defined once.

Lanes are a fixed set per worker kind, not one queue per agent (a worker
naming 500 queues in every BRPOP falls from 883 to 357 tasks/s):

    vessel.sandbox              shared lane of the sandbox workers
    vessel.service              shared lane of the service workers
    vessel.plugin               shared lane of the plugin workers
    vessel.sandbox.<agent>      dedicated lane: only workers started with --agents <agent>
    vessel.service.<agent>
    vessel.plugin.<agent>
    vessel.sandbox@<host>       home lane of one sandbox host (`VESSEL_HOST_ID`: one
                                workspace root): the calls of the turns homed there
    vessel.sandbox.<agent>@<host>   the same for the dedicated workers of <agent>

Every sandbox worker consumes its shared (or dedicated) lanes and the home lane of
each: `<lane>@<host id>`. `@` never appears in an agent id nor in a kind, so a
home lane is told apart by it (`is_home_lane`). Service workers have no
workspaces, hence no home lanes.

Which call goes next, and to which lane, is decided by admission
(`broker.admission`); its Redis keys are named in `broker.admission.keys`.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "AGENT_SEPARATOR",
    "HOME_SEPARATOR",
    "HOST_ID_PATTERN",
    "KINDS",
    "LANE_PREFIX",
    "TASK_NAMES",
    "WORKSPACE_KINDS",
    "WORKSPACE_OP_TASK",
    "Kind",
    "base_lane",
    "check_host_id",
    "dedicated_lane",
    "home_lane",
    "is_home_lane",
    "shared_lane",
]

Kind = Literal["sandbox", "service", "plugin"]
KINDS: tuple[Kind, ...] = ("sandbox", "service", "plugin")

#: The Celery task of each worker kind; Flower shows these names.
TASK_NAMES: dict[Kind, str] = {
    "sandbox": "vessel.sandbox_call",
    "service": "vessel.service_call",
    "plugin": "vessel.plugin_call",
}

#: The kinds whose calls have a workspace per turn, so follow their turn's home.
WORKSPACE_KINDS: frozenset[Kind] = frozenset({"sandbox"})
#: The task of a workspace operation (`client.files`), run by sandbox workers.
WORKSPACE_OP_TASK = "vessel.workspace_op"

#: A host id (`VESSEL_HOST_ID`): a hostname's characters, so it fits a queue name
#: and a Redis key; no `@` (it ends a home lane's name) and no `:`.
HOST_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: Ends a lane's name and starts its host's id in a home lane's (`<lane>@<host>`).
HOME_SEPARATOR = "@"
#: How every lane's name starts (`vessel.<kind>...`).
LANE_PREFIX = "vessel."
#: Between the kind and the agent in a dedicated lane's name (`vessel.<kind>.<agent>`).
AGENT_SEPARATOR = "."


def shared_lane(kind: Kind) -> str:
    return f"{LANE_PREFIX}{kind}"


def dedicated_lane(kind: Kind, agent: str) -> str:
    """The lane of workers an operator dedicates to `agent` (`--agents`)."""
    return f"{LANE_PREFIX}{kind}{AGENT_SEPARATOR}{agent}"


def check_host_id(host_id: str) -> str:
    """`host_id` if it is a valid host id, else ValueError saying what is wrong."""
    if not HOST_ID_PATTERN.fullmatch(host_id):
        raise ValueError(
            f"host id {host_id!r} is not valid: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit), at most 100 characters"
        )
    return host_id


def home_lane(lane: str, host_id: str) -> str:
    """The home lane of `host_id` for `lane` (shared or dedicated): `<lane>@<host>`."""
    return f"{base_lane(lane)}{HOME_SEPARATOR}{host_id}"


def is_home_lane(lane: str) -> bool:
    return HOME_SEPARATOR in lane


def base_lane(lane: str) -> str:
    """The shared or dedicated lane a home lane belongs to (itself for those)."""
    return lane.split(HOME_SEPARATOR, 1)[0]
