"""Per-agent admission: fair, bounded, crash-safe dispatch of calls to Celery lanes.

The problem
-----------
One Celery queue per agent does not scale: a worker polls with one BRPOP naming
every queue it consumes, and throughput falls with the number of queues (883 to
357 tasks/s at 500 queues). One shared FIFO queue does not scale either, in a
different way: agent A's 1,000 queued calls block agent B's 10.

The design
----------
Each worker kind has a fixed set of Celery queues, "lanes" (`broker.queues`):
`vessel.sandbox` and `vessel.service` shared by all agents, and
`vessel.<kind>.<agent>` for workers an operator dedicates with `--agents`. Calls
do not go straight into a lane. They wait in Redis, per agent, and enter a lane
only when it has room:

* `submit` stores the call's message under `vessel:call:<id>`, appends the id to
  the agent's pending list and, if the agent has no place yet, appends the agent
  to the round-robin ring of its lane. Then it dispatches.
* `dispatch` (one Lua script, atomic) runs while the lane holds fewer unfinished
  calls than its window: it pops the next agent off the ring, takes that agent's
  oldest pending call (if the agent is below its `max_concurrent_calls`), gives it
  a lease and puts the agent back at the end of the ring. An agent at its limit
  leaves the ring for a "blocked" set and comes back when one of its calls
  finishes; an agent with nothing pending leaves the ring. Each agent popped
  either yields a call or leaves, so dispatch costs O(1) per call whatever the
  number of agents. A call submitted with a prepared message (`broker.envelope`,
  the fast path) is pushed into the lane by the script itself; the caller (client
  or worker) publishes what dispatch returns as Celery tasks: task id = call id,
  the lane as queue, the message as args.
* A lane's **window** is the sum of the concurrency of the live workers consuming
  it, kept by their heartbeats (`vessel:window:<lane>`, expires with the last
  heartbeat), plus a slack of 2 so a freed worker finds its next call waiting.
  So a lane's Celery queue never holds more than about a window of calls: B's
  first call waits behind at most a window of A's, and from then on the ring
  alternates A, B, A, B.
* **Slots**: an agent's running calls are a sorted set call id -> lease expiry,
  shared by every worker and host, so `max_concurrent_calls` holds across all of
  them. When a call finishes, its worker releases the slot (unblocking its agent)
  and dispatches again, in one script.
* **Dedicated workers**: while a worker started with `--agents a` is live, agent
  `a` takes its turns on the lane `vessel.<kind>.a`, which only dedicated
  workers consume. When the last of them stops, the agent moves back to the
  shared lane.

Turns and homes
---------------
A turn's workspace is a folder on one host (`workers.sandbox.workspace`), so
every call of a turn must run where its folder is. A **host** is one workspace
root, named by `VESSEL_HOST_ID` (default: the machine's hostname): the worker
processes of one machine sharing a root serve each other's turns. Each sandbox
worker consumes its lane and that lane's **home lane** `<lane>@<host>`, which
only the workers of its host consume; a home lane's window is its host's live
capacity, from the same heartbeats.

* A turn's first call goes to the agent's lane like any call. The worker that
  claims it makes its host the turn's **home** (`vessel:home:<agent>:<turn>`,
  set in the claim script, atomically; it expires with the workspace's idle
  TTL and is renewed at every claim).
* `submit` of a call whose turn has a live home puts it in the agent's queue
  for that home lane, `vessel:<kind>:pending:<agent>:<home lane>`. Each home
  lane has a ring of its own, so the same round robin, `max_concurrent_calls`
  (the agent's slots are one set across all its lanes) and leases hold; an
  agent at its limit parks each of its queues (`vessel:<kind>:parked:<agent>`)
  until a slot comes free.
* A call of the turn that reached another host meanwhile (two calls of a new
  turn dispatched at once) is never run there: its claim finds the home alive
  elsewhere, puts the call back at the head of the agent's queue for the home
  lane and returns `moved`.
* When the home host's heartbeat expires (SIGKILL, a lost machine, a warm
  shutdown of its last worker), the recovery sweep moves the calls queued for
  its home lane, and those dispatched there that no worker claimed, back to
  their agents' own queues; the next claim of the turn finds its home dead and
  takes the turn with an empty folder: `lost` 2, and the result says
  `workspace_lost`. The same when Redis no longer has the home while the
  client saw one (`seen`: Redis lost its data), unless the folder is on the
  claiming host (then it was the home and nothing was lost).
* Workspace operations (`client.files`, `workers.workspace_ops`) are routed by
  `route_turn` to the home lane (or the agent's lane for a turn with no live
  home) and checked by `take_home` where they arrive, like a claim; they take no
  slot. An operation that found the workspace lost leaves the note owed to the
  next call (the `lost` field of the home), so the model is still told.

Leases and crashes
------------------
A call's lease is its tool's time limit plus `VESSEL_LEASE_GRACE_SECONDS`
(default 30 s): the longest a healthy worker can hold it, since the runner kills
the tool at its limit. The lease starts at dispatch (covering the short wait in
the lane) and starts again when a worker claims the call. Every worker runs a
recovery sweep every `VESSEL_SWEEP_SECONDS` (2 s): a call whose lease expired
without a result goes back to the head of its agent's queue and is dispatched
again, so a SIGKILLed worker's slots and calls come back within lease + 2 s.
(kombu's visibility-timeout redelivery would only repeat that, later: the
messages admission pushes keep no copy in its `unacked` hash, see
`broker.transport`; calls published with `send_task`, when `broker.fast_path`
has the fast path off, keep kombu's copy and its redelivery too.) A message
can still arrive twice (a requeue, a warm shutdown's restore racing the sweep);
every delivery ends in one run of the tool:

* `claim` (`SET vessel:claim:<id> NX PX lease`): a worker runs a call only if no
  result exists and no live worker holds it; otherwise it acks and returns.
* `finish` (`SET vessel:done:<id> NX`): only the first result is stored.
  When the result backend is this same Redis database (the default), the
  worker's `complete` script does `finish`, writes the result as Celery's Redis
  backend would (its key, its encoded value, SET with expiry + PUBLISH), and
  `release`, atomically: one round trip, and no moment where a call is done
  without its result.

Cancel
------
`cancel(id)` takes a queued call out of its agent's list (it never starts; the
canceller stores its `[cancelled]` result), or sets `vessel:cancel:<id>` (checked
by `claim`, so a dispatched call never starts) and publishes the id on the
`vessel:cancel` channel; the worker running it sets the call's cancel event and
the runner kills its process tree.

Limits, stated plainly
----------------------
* One Redis (or Sentinel), not Redis Cluster: the scripts compute the keys they
  touch. Redis must run with `maxmemory-policy noeviction` (workers check).
* With a result backend elsewhere (`VESSEL_RESULT_BACKEND` another Redis), a
  worker killed in the microseconds between marking a call done and writing
  its result: the call is not run again (it may have had its effect); the
  recovery sweep finds it done without a result and stores an error result
  saying the worker stopped, so the platform still gets an answer.
* A cancel reaches a running call only on the threads (default) and solo pools,
  where the call's cancel event lives in the worker process.

Measured on the shared 2-core machine (load average 8 from other work): one
service worker with 4 threads and a no-op tool did 41 calls/s with one agent and
41 calls/s with the same 1,000 calls spread over 1,000 agents (raw Celery with
the same settings: 30 calls/s at the same time). In the cluster test, 30 of
agent A's calls finished before agent B's 10th (the requirement: fewer than 50).

The package
-----------
    protocol.py     the interface both implementations satisfy (`Admission`) and
                    what it returns (`Dispatched`, `Claim`, the outcomes)
    redis.py        `RedisAdmission`: the rules as atomic Lua scripts in the broker's
                    Redis, shared by every client, worker and host
    scripts/        those scripts: `lib.lua` (ring, slots, dispatch, homes) and one
                    file per operation (`submit.lua`, `claim.lua`, ...)
    lua.py          loads a script: the constants of keys.py, lib.lua, the script
    keys.py         every Redis key, prefix and number admission uses, defined once
                    for Python and Lua
    listener.py     the thread receiving the cancel channel (`listen_cancels`)
    in_process.py   `LocalAdmission`: the same rules in one process (the embedded
                    default, `vessel-workers call` without a broker)
    publish.py      Celery's side of a dispatch: publish what admission let in
    finish.py       the end of a call: store its result once, free its slot

A call is admitted in `submit.lua` (`RedisAdmission.submit`), dispatched by
`dispatch` in `lib.lua`, claimed in `claim.lua` and finished in `complete.lua`
(or `finish.lua` then `release.lua`).
"""

from __future__ import annotations

from broker.admission.in_process import LocalAdmission
from broker.admission.keys import MAX_DISPATCH
from broker.admission.protocol import (
    Admission,
    CancelOutcome,
    Claim,
    ClaimOutcome,
    Dispatched,
    Subscription,
    lane_kind,
)
from broker.admission.redis import RedisAdmission

__all__ = [
    "MAX_DISPATCH",
    "Admission",
    "CancelOutcome",
    "Claim",
    "ClaimOutcome",
    "Dispatched",
    "LocalAdmission",
    "RedisAdmission",
    "Subscription",
    "lane_kind",
]
