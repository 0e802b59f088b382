"""Every name and number admission keeps in Redis, defined once, for Python and Lua alike.

The Lua scripts (`scripts/`) never spell a key prefix, the slack, the default
lease or the delivery-tag prefix: `lua_preamble` turns `LUA_CONSTANTS` into
`local` lines that `broker.admission.lua` puts before every script. A name
changed here changes in both.

The keys (all under `vessel:`, `broker.constants.REDIS_PREFIX`):

    vessel:call:<id>                  the call's message (JSON), until it has a result
    vessel:meta:<id>                  hash: kind, agent, lease_ms, at (submitted, ms),
                                      lane (once dispatched);
                                      turn and seen (calls that follow their turn's home);
                                      queue (the home lane, while queued for one);
                                      envelope, route, tag (a prepared message, `broker.envelope`);
                                      deliveries (how many times it was pushed)
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
    vessel:probe:<id>                 the worker self-test's delivery count (deleted at once)
    vessel:fast-path:off              why a worker's self-test failed (`broker.fast_path`)
    vessel:cancel                     pub/sub channel: call ids to kill where they run, and
                                      `end-turn:<turn>` (sandbox workers remove its workspaces)

A message admission pushes into a lane (`broker.envelope`) carries the kombu
delivery tag `vessel-<id>-<delivery>` (`ADMISSION_TAG_PREFIX`):
`broker.transport` keeps no unacked copy of those, since admission's lease
already redelivers them.
"""

from __future__ import annotations

import re

from broker.constants import REDIS_PREFIX
from broker.queues import AGENT_SEPARATOR, HOME_SEPARATOR, LANE_PREFIX, Kind

__all__ = [
    "ADMISSION_TAG_PREFIX",
    "ALIVE",
    "BLOCKED",
    "CALL",
    "CANCEL",
    "CANCEL_CHANNEL",
    "CLAIM",
    "DEFAULT_LEASE_MS",
    "DONE",
    "END_TURN_PREFIX",
    "FAST_PATH_OFF_KEY",
    "HOME",
    "INFLIGHT",
    "LANES",
    "LEASES",
    "LIMIT",
    "LUA_CONSTANTS",
    "MAX_DISPATCH",
    "META",
    "PARKED",
    "PENDING",
    "PLACED",
    "PREFIX",
    "PROBE",
    "RECOVER_BATCH",
    "RING",
    "RUNNING",
    "SEP",
    "SLACK",
    "TURN",
    "UNKNOWN_AGENT_LIMIT",
    "WHERE",
    "WINDOW",
    "WORKERS",
    "call_key",
    "claim_key",
    "done_key",
    "home_key",
    "kind_key",
    "lua_preamble",
    "meta_key",
    "turn_key",
]

PREFIX = REDIS_PREFIX
#: Between the parts of a key's name.
SEP = ":"

# --- keys named by one thing: the prefix, then a call id, lane, turn or host ---
CALL = f"{PREFIX}call:"
META = f"{PREFIX}meta:"
CLAIM = f"{PREFIX}claim:"
DONE = f"{PREFIX}done:"
CANCEL = f"{PREFIX}cancel:"
TURN = f"{PREFIX}turn:"
#: Then `<agent>:<turn>`.
HOME = f"{PREFIX}home:"
RING = f"{PREFIX}ring:"
INFLIGHT = f"{PREFIX}inflight:"
WINDOW = f"{PREFIX}window:"
WORKERS = f"{PREFIX}workers:"
ALIVE = f"{PREFIX}alive:"
PLACED = f"{PREFIX}placed:"
PROBE = f"{PREFIX}probe:"

# --- keys of one worker kind: `vessel:<kind>:<name>[:<agent>]` (`kind_key`) ---
PENDING = "pending"
PARKED = "parked"
WHERE = "where"
BLOCKED = "blocked"
LIMIT = "limit"
RUNNING = "running"
LEASES = "leases"
LANES = "lanes"

#: Set (to the reason) by a worker whose start-up self-test failed; while it
#: exists, clients build no envelopes and admission's Lua pushes none
#: (`broker.fast_path`). Expires three heartbeats after the last failing
#: worker stopped.
FAST_PATH_OFF_KEY = f"{PREFIX}fast-path:off"
#: Pub/sub channel carrying the ids of calls to kill wherever they run.
CANCEL_CHANNEL = f"{PREFIX}cancel"
#: On the cancel channel: the turn ended, sandbox workers remove its workspaces.
#: Call ids are hex, so this never reads as one.
END_TURN_PREFIX = "end-turn:"
#: How the delivery tag of every message admission pushes starts (Lua's
#: `push_envelope` writes `vessel-<id>-<delivery>`); kombu's own tags are uuids.
ADMISSION_TAG_PREFIX = "vessel-"

#: Calls a lane may hold beyond its live capacity, so a worker that finishes a
#: call finds the next one already waiting instead of waiting for a round trip.
SLACK = 2
#: The lease of a call whose record has none (every submit writes one; a record
#: from an older client may not): a minute.
DEFAULT_LEASE_MS = 60_000
#: Calls one script may dispatch at once; keeps each script call short.
MAX_DISPATCH = 500
#: Expired leases one recovery sweep takes back at most (the next sweep takes the rest).
RECOVER_BATCH = 1000
#: The max_concurrent_calls of an agent admission has no limit for (every submit
#: writes one; this only guards a record cut short).
UNKNOWN_AGENT_LIMIT = 1


def call_key(call_id: str) -> str:
    return f"{CALL}{call_id}"


def meta_key(call_id: str) -> str:
    return f"{META}{call_id}"


def claim_key(call_id: str) -> str:
    return f"{CLAIM}{call_id}"


def done_key(call_id: str) -> str:
    return f"{DONE}{call_id}"


def turn_key(turn: str) -> str:
    return f"{TURN}{turn}"


def home_key(agent: str, turn: str) -> str:
    return f"{HOME}{agent}{SEP}{turn}"


def kind_key(kind: Kind, name: str, *rest: str) -> str:
    """`vessel:<kind>:<name>[:<rest>...]`, e.g. `kind_key("sandbox", PENDING, agent)`."""
    return SEP.join((f"{PREFIX}{kind}", name, *rest))


#: What every Lua script gets as `local NAME = value` (`lua_preamble`).
LUA_CONSTANTS: dict[str, str | int] = {
    "P": PREFIX,
    "SEP": SEP,
    "CALL": CALL,
    "META": META,
    "CLAIM": CLAIM,
    "DONE": DONE,
    "CANCEL": CANCEL,
    "TURN": TURN,
    "HOME": HOME,
    "RING": RING,
    "INFLIGHT": INFLIGHT,
    "WINDOW": WINDOW,
    "WORKERS": WORKERS,
    "ALIVE": ALIVE,
    "PLACED": PLACED,
    "PROBE": PROBE,
    "PENDING": PENDING,
    "PARKED": PARKED,
    "WHERE": WHERE,
    "BLOCKED": BLOCKED,
    "LIMIT": LIMIT,
    "RUNNING": RUNNING,
    "LEASES": LEASES,
    "LANES": LANES,
    "FAST_PATH_OFF_KEY": FAST_PATH_OFF_KEY,
    "CANCEL_CHANNEL": CANCEL_CHANNEL,
    "TAG_PREFIX": ADMISSION_TAG_PREFIX,
    "LANE_PREFIX": LANE_PREFIX,
    "HOME_SEPARATOR": HOME_SEPARATOR,
    "AGENT_SEPARATOR": AGENT_SEPARATOR,
    "SLACK": SLACK,
    "DEFAULT_LEASE_MS": DEFAULT_LEASE_MS,
    "MAX_DISPATCH": MAX_DISPATCH,
    "RECOVER_BATCH": RECOVER_BATCH,
    "UNKNOWN_AGENT_LIMIT": UNKNOWN_AGENT_LIMIT,
}

#: What a constant's text may hold to be written as a Lua string literal as is.
_LUA_SAFE_TEXT = re.compile(r"[A-Za-z0-9:._@-]*")


def _lua_value(name: str, value: str | int) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"Lua constant {name}: {value!r} is neither text nor an integer")
    if isinstance(value, int):
        return str(value)
    if not _LUA_SAFE_TEXT.fullmatch(value):
        raise ValueError(
            f"Lua constant {name}: {value!r} holds characters a key name does not need "
            "(letters, digits and ':', '.', '_', '@', '-' only)"
        )
    return f"'{value}'"


def lua_preamble() -> str:
    """`local NAME = value` for each of `LUA_CONSTANTS`, one per line."""
    return "".join(
        f"local {name} = {_lua_value(name, value)}\n" for name, value in LUA_CONSTANTS.items()
    )
