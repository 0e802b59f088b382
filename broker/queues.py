"""Celery queue ("lane") names, task names and Redis key names, each defined once.

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

Which call goes next, and to which lane, is decided by admission in Redis
(`broker.admission`); these keys are its state (all under `vessel:`):

    vessel:call:<id>                  the call's message (JSON), until it has a result
    vessel:meta:<id>                  hash: kind, agent, lease_ms, at (submitted, ms),
                                      lane (once dispatched);
                                      turn and seen (calls that follow their turn's home);
                                      queue (the home lane, while queued for one)
    vessel:<kind>:pending:<agent>     list of the agent's queued call ids, oldest first
    vessel:<kind>:pending:<agent>:<home lane>
                                      the same, for the calls of turns homed on that lane
    vessel:placed:<home lane>         set of agents with a place there (ring or parked)
    vessel:<kind>:parked:<agent>      set of the agent's queues waiting at its limit:
                                      `base` and/or home lanes
    vessel:<kind>:where               hash agent -> lane, while the agent has a ring place
                                      or is blocked at its max_concurrent_calls
    vessel:<kind>:blocked             set of agents at their limit with calls pending
                                      (some queue of theirs is parked)
    vessel:<kind>:limit               hash agent -> max_concurrent_calls
    vessel:<kind>:running:<agent>     zset call id -> lease expiry (ms): the agent's slots
    vessel:<kind>:leases              zset call id -> lease expiry (ms), all agents
    vessel:ring:<lane>                list of agents taking turns on the lane
    vessel:inflight:<lane>            zset call id -> lease expiry: dispatched, unfinished
    vessel:window:<lane>              how many calls the lane may hold (live capacity), TTL
    vessel:workers:<lane>             hash hostname -> concurrency
    vessel:alive:<lane>               zset hostname -> heartbeat expiry (ms)
    vessel:turn:<turn>                set of the turn's call ids (cancel_turn)
    vessel:home:<agent>:<turn>        hash: lane (the turn's home lane), lost ('1': the
                                      next call tells the model its workspace was lost);
                                      expires with the workspace's idle TTL
    vessel:<kind>:lanes               set of the lanes other than the shared one that
                                      workers announced (dedicated and home lanes)
    vessel:claim:<id>                 hostname running the call, with the lease as TTL
    vessel:done:<id>                  set once, when the first result is stored
    vessel:cancel:<id>                set by cancel(); checked before a call starts
    vessel:cancel                     pub/sub channel: call ids to kill where they run, and
                                      `end-turn:<turn>` (sandbox workers remove its workspaces)

A message admission pushes into a lane (`broker.envelope`) carries the kombu
delivery tag `vessel-<id>-<delivery>`: `broker.transport` keeps no unacked copy
of those, since admission's lease already redelivers them.
"""

from __future__ import annotations

import re
from typing import Literal

from broker.constants import REDIS_PREFIX
from broker.model import Tool

__all__ = [
    "ADMISSION_TAG_PREFIX",
    "CANCEL_CHANNEL",
    "END_TURN_PREFIX",
    "HOST_ID_PATTERN",
    "KINDS",
    "TASK_NAMES",
    "WORKSPACE_KINDS",
    "WORKSPACE_OP_TASK",
    "Kind",
    "base_lane",
    "call_key",
    "cancel_key",
    "check_host_id",
    "claim_key",
    "dedicated_lane",
    "done_key",
    "home_key",
    "home_lane",
    "is_home_lane",
    "kind_of",
    "meta_key",
    "shared_lane",
    "turn_key",
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
_HOME_SEPARATOR = "@"

#: Pub/sub channel carrying the ids of calls to kill wherever they run.
CANCEL_CHANNEL = f"{REDIS_PREFIX}cancel"
#: On the cancel channel: the turn ended, sandbox workers remove its workspaces.
#: Call ids are hex, so this never reads as one.
END_TURN_PREFIX = "end-turn:"

_LANE_PREFIX = "vessel."

#: How the delivery tag of every message admission pushes starts (its Lua
#: `push_envelope` writes `vessel-<id>-<delivery>`); kombu's own tags are uuids.
ADMISSION_TAG_PREFIX = "vessel-"


def kind_of(tool: Tool) -> Kind:
    """Which worker kind runs `tool`."""
    return tool.kind


def shared_lane(kind: Kind) -> str:
    return f"{_LANE_PREFIX}{kind}"


def dedicated_lane(kind: Kind, agent: str) -> str:
    """The lane of workers an operator dedicates to `agent` (`--agents`)."""
    return f"{_LANE_PREFIX}{kind}.{agent}"


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
    return f"{base_lane(lane)}{_HOME_SEPARATOR}{host_id}"


def is_home_lane(lane: str) -> bool:
    return _HOME_SEPARATOR in lane


def base_lane(lane: str) -> str:
    """The shared or dedicated lane a home lane belongs to (itself for those)."""
    return lane.split(_HOME_SEPARATOR, 1)[0]


def home_key(agent: str, turn: str) -> str:
    return f"{REDIS_PREFIX}home:{agent}:{turn}"


def call_key(call_id: str) -> str:
    return f"{REDIS_PREFIX}call:{call_id}"


def meta_key(call_id: str) -> str:
    return f"{REDIS_PREFIX}meta:{call_id}"


def claim_key(call_id: str) -> str:
    return f"{REDIS_PREFIX}claim:{call_id}"


def done_key(call_id: str) -> str:
    return f"{REDIS_PREFIX}done:{call_id}"


def cancel_key(call_id: str) -> str:
    return f"{REDIS_PREFIX}cancel:{call_id}"


def turn_key(turn: str) -> str:
    return f"{REDIS_PREFIX}turn:{turn}"
