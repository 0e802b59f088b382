"""The client API a platform calls: submit, result, call, cancel, cancel_turn.

    from broker.client import VesselClient
    from broker.loading import load_deployment

    client = VesselClient(load_deployment("deployment.toml"))   # settings from the environment
    handle = client.submit("field-guide", "species", {"habitat": "rivers"},
                           owner="web/alice", turn="turn-42")
    result = handle.result(timeout=60)        # a broker.result.ToolResult
    print(result.output)                      # the text the model sees

    result = client.call("records", "lookup", {"id": "A-1042"}, owner="web/alice")
    client.cancel(handle.call_id)             # True if it was still queued or running
    client.cancel_turn("turn-42")             # how many of the turn's calls were cancelled
    files = client.files("field-guide", "turn-42")   # the turn's workspace (broker.files)
    files.put("uploads/a.md", b"...")
    client.end_turn("turn-42")                # its workspace removed on its home host
    client.close()

`search_tools` and `call_tool` (broker/catalogue) answer like any tool:
`search_tools` is answered at submit (its result stored at once, no worker),
`call_tool` is submitted as the direct call of the tool it names.

`submit` refuses, by raising, only what the platform got wrong: an agent or tool
the deployment does not have (`UnknownAgent`, `UnknownTool`) and an owner of
neither form (`ValueError`). The model's arguments never make it raise:
arguments that are not a JSON object, or do not match the tool's parameters,
come back as a result with `outcome == "refused"` and the text the model should
see, like any other result. Arguments over the agent's `max_argument_bytes`
(or a decoded value nested too deeply, or holding NaN: `broker.arguments`)
are refused at submit: the refused result is stored at once, nothing is
queued, and the handle's `result()` returns it.

A broker outage (a Redis restart, a Sentinel failover): `submit` raises
`TransientError` (`BrokerUnavailable`) at once, with nothing queued (the
submit script is atomic, and the call's Celery message is built before it
runs); `result()` waits across the outage up to its timeout; a call the
broker lost (Redis came back empty) ends with `BrokerLostCall` as soon as
neither its records nor its result exist (docs/broker-outages.md).

A cancelled call ends with the result `[cancelled]` (`is_error`, outcome
`"cancelled"`): a queued call gets it at once and never starts; a running one
gets it when its process tree (or HTTP request) has been stopped on whatever
host runs it.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery, states

from broker import fast_path
from broker.admission import Admission, Dispatched, RedisAdmission
from broker.arguments import submit_problem
from broker.catalogue import Answer, Catalogue, route_call
from broker.celery_app import make_app
from broker.config import Settings, hide_password
from broker.constants import (
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    ENV_BROKER_URL,
    WORKSPACE_IDLE_TTL_SECONDS,
)
from broker.envelope import EnvelopeFactory, send_call
from broker.errors import BrokerLostCall, BrokerUnavailable, CallTimeout, MissingBrokerURL
from broker.model import Deployment
from broker.owner import check_owner
from broker.queues import WORKSPACE_KINDS
from broker.request import CallRequest, Initiator, new_call_id
from broker.result import ToolResult
from broker.retrying import MAX_PAUSE_SECONDS, unreachable

if TYPE_CHECKING:
    from broker.files import TurnFiles

__all__ = [
    "CANCELLED_TEXT",
    "CallHandle",
    "VesselClient",
    "cancelled_result",
    "finish_call",
    "longest_tool_seconds",
    "publish",
    "results_in_admission",
    "store_result_once",
]

_log = logging.getLogger(__name__)

#: What the model sees of a cancelled call.
CANCELLED_TEXT = "[cancelled]"
#: Who stores the result of a call cancelled while queued.
_CLIENT_HOST = "client"
#: The longest pause between two reads of a backend that cannot notify.
_POLL_CAP_SECONDS = 0.005
#: How long a wait on a result channel goes without reading the store again.
_WAIT_CHUNK_SECONDS = 1.0


#: Subscription connections kept between waits, at most.
_IDLE_PUBSUBS = 64
#: Turns (agent, turn) this client remembers having seen homed, at most: the
#: evidence that lets a worker tell a turn's first call from one whose home
#: Redis lost (broker/admission.py, "Turns and homes").
_SEEN_TURNS = 100_000
#: Quiet waits (of `_WAIT_CHUNK_SECONDS`) between two checks that the broker
#: still knows the call; after an outage it is checked at every one.
_LOST_CHECK_EVERY = 5
#: A call is reported lost only when two checks this far apart (plus a
#: heartbeat period) find nothing: a queued call being cancelled has no records
#: between the cancel script and its `[cancelled]` result, and after an outage
#: a worker still running a call marks it claimed again with its first
#: heartbeat (`workers.worker`), which comes within a heartbeat and a retry pause.
_LOST_CONFIRM_SECONDS = 2 * MAX_PAUSE_SECONDS


class _ChannelLost(Exception):
    """The connection of a wait on a result channel failed."""


def _notifies(backend: object) -> bool:
    """True for a Redis result backend (it PUBLISHes every result it stores).

    Checked without importing the Redis backend: if `backend` is one, its
    module is loaded already; the embedded default never loads redis-py.
    """
    module = sys.modules.get("celery.backends.redis")
    return module is not None and isinstance(backend, module.RedisBackend)


def _from_meta(meta: Any) -> ToolResult | None:
    if isinstance(meta, dict) and meta.get("status") == "SUCCESS":
        result = meta.get("result")
        if isinstance(result, dict):
            return ToolResult.from_dict(result)
    return None


def longest_tool_seconds(deployment: Deployment) -> float:
    """The longest time limit of any tool: it sizes the visibility timeout."""
    limits = [t.timeout_seconds for a in deployment.agents.values() for t in a.tools.values()]
    return max(limits, default=DEFAULT_TOOL_TIMEOUT_SECONDS)


def cancelled_result(request: CallRequest, *, duration_ms: float = 0.0) -> ToolResult:
    return ToolResult(
        call_id=request.call_id,
        agent=request.agent,
        tool=request.tool,
        is_error=True,
        output=CANCELLED_TEXT,
        duration_ms=round(duration_ms, 3),
        outcome="cancelled",
    )


def _refused_at_submit(request: CallRequest, text: str) -> ToolResult:
    return ToolResult(
        call_id=request.call_id,
        agent=request.agent,
        tool=request.tool,
        is_error=True,
        output=text,
        outcome="refused",
    )


def publish(app: Celery, dispatched: Iterable[Dispatched]) -> None:
    """Send what admission let in as Celery tasks: task id = call id, queue = lane.

    Never raises: if the broker is down (after kombu's own retries), the calls'
    leases expire and the recovery sweep dispatches them again, so a failure
    here delays calls but loses none. The caller's work (a submit, a stored
    result) has already succeeded and must not be reported as failed.
    """
    items = list(dispatched)
    if not items:
        return
    try:
        with app.producer_or_acquire() as producer:
            for item in items:
                message = json.loads(item.message)
                send_call(app, item.kind, item.call_id, message, lane=item.lane, producer=producer)
    except Exception as exc:  # see the docstring: recovery re-dispatches them
        _log.warning(
            "could not publish %d calls (%s); they are dispatched again when their lease ends",
            len(items),
            exc,
        )


def store_result_once(
    app: Celery,
    admission: Admission,
    result: ToolResult,
    *,
    hostname: str,
    ttl_seconds: int,
) -> bool:
    """Store `result` unless the call already has one; True if this one was stored."""
    if not admission.finish(result.call_id, hostname, ttl_seconds):
        return False

    def store() -> None:
        app.backend.store_result(result.call_id, result.to_dict(), "SUCCESS")

    if isinstance(admission, RedisAdmission):
        # Done is marked: the result must follow, across an outage of the backend too.
        admission.retrying(store)
    else:
        store()
    return True


def results_in_admission(app: Celery, admission: Admission) -> bool:
    """True if the result backend is a Redis backend in admission's own Redis database.

    Then a worker writes a result, its done mark and the slot's release in one
    script (`finish_call`); checked once per worker.
    """
    if not isinstance(admission, RedisAdmission) or not _notifies(app.backend):
        return False
    pool = app.backend.client.connection_pool
    return admission.same_database(pool.connection_kwargs)


def finish_call(
    app: Celery,
    admission: Admission,
    result: ToolResult,
    *,
    hostname: str,
    ttl_seconds: int,
    in_one_script: bool,
) -> tuple[bool, list[Dispatched]]:
    """Store `result` unless the call has one, free its slot; (stored, what to publish).

    `in_one_script` (`results_in_admission`): the backend's key and encoded
    result, built by the backend itself, are written by admission's `complete`
    script with the done mark and the release: one round trip instead of four
    (finish, Celery's read-before-write, its SET+PUBLISH, release).
    """
    if in_one_script and isinstance(admission, RedisAdmission):
        backend = app.backend
        meta = backend._get_result_meta(
            result=result.to_dict(), state=states.SUCCESS, traceback=None, request=None
        )
        meta["task_id"] = result.call_id
        return admission.complete(
            result.call_id,
            hostname,
            ttl_seconds,
            result_key=backend.get_key_for_task(result.call_id),
            result_value=backend.encode(meta),
            result_ttl_seconds=backend.expires,
        )
    stored = store_result_once(app, admission, result, hostname=hostname, ttl_seconds=ttl_seconds)
    return stored, admission.release(result.call_id)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _while_connecting(exc: BaseException) -> bool:
    """True if redis-py failed before sending (no connection): nothing ran."""
    text = str(exc)
    return "connecting to" in text or "Timeout connecting" in text


class _LostCheck:
    """Whether the broker still knows a call a client waits for (`BrokerLostCall`).

    A call is lost when two checks a few seconds apart (`_LOST_CONFIRM_SECONDS`)
    find neither its result nor any record in admission (queued, dispatched,
    claimed by a worker running it, or done). Read in
    that order, a result stored between the reads is never missed: the done
    mark is set before (or with) the result and outlives it. Checked when the
    wait starts (one EXISTS), then every `_LOST_CHECK_EVERY` quiet seconds, and every
    second after an outage.
    A result backend elsewhere: only admission's Redis is asked, the result is
    read from the backend as always.
    """

    def __init__(self, client: VesselClient, call_id: str) -> None:
        self._client = client
        self._call_id = call_id
        self._quiet = 0
        self._first_miss: float | None = None
        self.after_outage = False

    def check(self) -> bool:
        admission = self._client.admission
        if not isinstance(admission, RedisAdmission):
            return False  # the embedded default never loses a call
        self._quiet += 1
        if not self.after_outage and self._quiet != 1 and self._quiet % _LOST_CHECK_EVERY:
            return False
        if admission.call_known(self._call_id):
            self._first_miss = None
            return False
        now = time.monotonic()
        confirm = _LOST_CONFIRM_SECONDS + self._client.settings.heartbeat_seconds
        if self._first_miss is None:
            self._first_miss = now
            time.sleep(confirm)
            now = time.monotonic()
        if now - self._first_miss < confirm:
            return False
        if self._client._stored(self._call_id) is not None:
            return False
        return not admission.call_known(self._call_id)


@dataclass(frozen=True, slots=True)
class CallHandle:
    """A submitted call: its id, and a way to wait for its result."""

    call_id: str
    client: VesselClient

    def result(self, timeout: float | None = None) -> ToolResult:
        return self.client.result(self.call_id, timeout=timeout)

    def cancel(self) -> bool:
        return self.client.cancel(self.call_id)


class VesselClient:
    """Submits calls to the workers of `deployment` and reads their results.

    `settings` default to the environment (`VESSEL_BROKER_URL`, …). `app` and
    `admission` are for the embedded default, which shares them with its
    in-process worker; a platform leaves them out.
    """

    def __init__(
        self,
        deployment: Deployment,
        settings: Settings | None = None,
        *,
        app: Celery | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.deployment = deployment
        self.settings = settings or Settings.from_environ()
        if admission is None:
            if self.settings.broker_url is None:
                raise MissingBrokerURL(
                    f"{ENV_BROKER_URL} is not set: a client needs the broker's Redis "
                    "(redis://host:6379/0), or the embedded default's app and admission "
                    "(workers.worker.embedded_client)."
                )
            admission = RedisAdmission.from_url(
                self.settings.broker_url, sentinel_master=self.settings.sentinel_master
            )
        self.admission = admission
        self._own_app = app is None
        if app is None:
            app = make_app(self.settings, longest_tool_seconds=longest_tool_seconds(deployment))
        self.app = app
        # Admission in the broker's Redis can push each call's prepared message
        # into its lane itself (broker/envelope.py) if broker/fast_path.py agrees.
        self.fast_path = (
            fast_path.decide(app, self.settings, admission)
            if isinstance(admission, RedisAdmission)
            else fast_path.Decision(enabled=False, reason="the embedded default")
        )
        self._envelopes = EnvelopeFactory(app) if self.fast_path.enabled else None
        self._pubsub_lock = threading.Lock()
        self._idle_pubsubs: list[Any] = []
        self._closed = False
        self._turns_lock = threading.Lock()
        #: (agent, turn) -> when a result or operation of it last came back.
        self._seen_turns: OrderedDict[tuple[str, str], float] = OrderedDict()
        #: call id -> (agent, turn), for calls that follow their turn's home.
        self._turn_calls: OrderedDict[str, tuple[str, str]] = OrderedDict()

    @property
    def _ttl(self) -> int:
        return int(self.settings.result_expires_seconds)

    def submit(
        self,
        agent: str,
        tool: str,
        arguments: Any,
        *,
        owner: str,
        turn: str | None = None,
        call_id: str | None = None,
        initiator: Initiator | None = None,
    ) -> CallHandle:
        """Queue one call; raises UnknownAgent, UnknownTool, or ValueError (owner).

        `initiator` says what started the turn (plugin tools see it as
        `context.initiator`); None is the platform, not verified.
        """
        entry = self.deployment.agent(agent)
        routed = route_call(self.deployment, agent, tool, arguments)
        if isinstance(routed, Answer):  # search_tools, or a built-in refusing its arguments
            check_owner(owner)
            answer = routed.result(call_id or new_call_id(), agent)
            store_result_once(
                self.app, self.admission, answer, hostname=_CLIENT_HOST, ttl_seconds=self._ttl
            )
            return CallHandle(answer.call_id, self)
        if routed is not None:  # call_tool: exactly a direct call of the named tool
            tool, arguments = routed.tool, routed.arguments
        found = entry.tool(tool)
        limit = entry.max_concurrent_calls
        request = CallRequest(
            call_id=call_id or new_call_id(),
            agent=agent,
            tool=tool,
            arguments=arguments,
            owner=check_owner(owner),
            turn=turn,
            initiator=initiator or Initiator(),
        )
        problem = submit_problem(tool, arguments, max_bytes=entry.settings.max_argument_bytes)
        if problem is not None:
            # Refused as the worker would refuse it, without sending it there:
            # the result is stored now, as for a queued call that is cancelled.
            store_result_once(
                self.app,
                self.admission,
                _refused_at_submit(request, problem),
                hostname=_CLIENT_HOST,
                ttl_seconds=self._ttl,
            )
            return CallHandle(request.call_id, self)
        lease_ms = int((found.timeout_seconds + self.settings.lease_grace_seconds) * 1000)
        message = request.to_message()
        try:
            # Built before anything is written: kombu connects to the broker
            # to build the first message of a kind (broker.envelope).
            envelope = (
                self._envelopes.build(found.kind, request.call_id, message)
                if self._envelopes is not None
                else None
            )
        except Exception as exc:
            if not unreachable(exc):
                raise
            raise BrokerUnavailable(
                f"{self._broker_name()} is unreachable ({_one_line(exc)}): "
                f"call {request.call_id} was not submitted"
            ) from exc
        affinity = turn is not None and found.kind in WORKSPACE_KINDS
        try:
            dispatched = self.admission.submit(
                call_id=request.call_id,
                kind=found.kind,
                agent=agent,
                message=json.dumps(message),
                limit=limit,
                lease_ms=lease_ms,
                turn=turn,
                ttl_seconds=self._ttl,
                envelope=envelope,
                affinity=affinity,
                seen=affinity and turn is not None and self.turn_seen(agent, turn),
            )
        except BrokerUnavailable as exc:
            # The submit script is atomic: it ran whole or not at all. Only a
            # connection lost between sending it and its reply leaves it unknown.
            cause = exc.__cause__
            sent = cause is not None and not _while_connecting(cause)
            raise BrokerUnavailable(
                f"{exc}: call {request.call_id} "
                + (
                    "may have been queued (the connection broke before the reply)"
                    if sent
                    else "was not submitted"
                )
            ) from cause
        if affinity and turn is not None:
            self._note_turn_call(request.call_id, agent, turn)
        # Never raises: a call it could not publish is dispatched again when
        # its lease ends (the admission record is complete).
        publish(self.app, dispatched)
        return CallHandle(request.call_id, self)

    def _broker_name(self) -> str:
        url = self.settings.broker_url
        return "the broker Redis" + (f" {hide_password(url)}" if url else "")

    def result(self, call_id: str, timeout: float | None = None) -> ToolResult:
        """Wait for the call's result; CallTimeout after `timeout` seconds (None: forever).

        With a Redis result backend this waits on the channel the backend
        PUBLISHes each stored result on (one subscription per wait, closed when
        it ends), so a result is seen as soon as it is stored; otherwise (the
        embedded default's in-memory backend) it polls every few milliseconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if _notifies(self.app.backend):
            found = self._wait_across_outages(call_id, deadline)
            if found is not None:
                return self._seen_result(found)
            raise CallTimeout(f"no result for call {call_id} within {timeout} s")
        pause = 0.001
        while True:
            found = self._stored(call_id)
            if found is not None:
                return self._seen_result(found)
            if deadline is not None and time.monotonic() >= deadline:
                raise CallTimeout(f"no result for call {call_id} within {timeout} s")
            wait = pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0))
            time.sleep(wait)
            pause = min(pause * 2, _POLL_CAP_SECONDS)

    # --- turns seen homed (broker/admission.py, "Turns and homes") -------------

    def _note_turn_call(self, call_id: str, agent: str, turn: str) -> None:
        with self._turns_lock:
            self._turn_calls[call_id] = (agent, turn)
            while len(self._turn_calls) > _SEEN_TURNS:
                self._turn_calls.popitem(last=False)

    def _seen_result(self, result: ToolResult) -> ToolResult:
        """A result of a call that ran (not one cancelled in its queue) shows its turn homed."""
        with self._turns_lock:
            key = self._turn_calls.pop(result.call_id, None)
        if key is not None and result.outcome != "cancelled":
            self.saw_turn(*key)
        return result

    def saw_turn(self, agent: str, turn: str) -> None:
        """Remember that the turn had a home (a result or operation came back)."""
        with self._turns_lock:
            self._seen_turns[(agent, turn)] = time.monotonic()
            self._seen_turns.move_to_end((agent, turn))
            while len(self._seen_turns) > _SEEN_TURNS:
                self._seen_turns.popitem(last=False)

    def turn_seen(self, agent: str, turn: str) -> bool:
        """True if this client saw the turn homed within the workspace idle TTL."""
        with self._turns_lock:
            when = self._seen_turns.get((agent, turn))
        return when is not None and time.monotonic() - when < WORKSPACE_IDLE_TTL_SECONDS

    def files(self, agent: str, turn: str, *, timeout: float | None = None) -> TurnFiles:
        """The turn's workspace: put, get, list, delete on its home host (`broker.files`)."""
        from broker.files import DEFAULT_OP_TIMEOUT_SECONDS, TurnFiles  # noqa: PLC0415

        return TurnFiles(self, agent, turn, timeout=timeout or DEFAULT_OP_TIMEOUT_SECONDS)

    def _stored(self, call_id: str) -> ToolResult | None:
        return _from_meta(self.app.backend.get_task_meta(call_id))

    def _wait_across_outages(self, call_id: str, deadline: float | None) -> ToolResult | None:
        """`_wait_published`, again after each connection failure, until `deadline`.

        Raises BrokerLostCall when the broker came back without the call
        (`_LostCheck`).
        """
        outage = self.admission.outage if isinstance(self.admission, RedisAdmission) else None
        lost = _LostCheck(self, call_id)
        pause = 0.05
        while True:
            try:
                found = self._wait_published(call_id, deadline, lost)
            except Exception as exc:
                error = exc.__cause__ if isinstance(exc, _ChannelLost) else exc
                if error is None or not unreachable(error):
                    raise
                if outage is not None:
                    outage.failed(error)  # one warning per outage, not per call
                lost.after_outage = True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                time.sleep(pause if left is None else min(pause, left))
                pause = min(pause * 2, MAX_PAUSE_SECONDS)
                continue
            if outage is not None:
                outage.succeeded()
            return found

    def _wait_published(
        self, call_id: str, deadline: float | None, lost: _LostCheck | None = None
    ) -> ToolResult | None:
        """The result, waiting on its channel until `deadline`; None at the deadline.

        Each wait holds a subscription connection of its own (so any number of
        threads may wait at once); an idle one is kept for the next wait and
        closed by `close`.
        """
        import redis  # noqa: PLC0415 (only with a Redis backend: redis-py is installed)

        backend = self.app.backend
        channel = backend.get_key_for_task(call_id)
        pubsub = self._take_pubsub(backend)
        reusable = False
        try:
            try:
                pubsub.subscribe(channel)
            except redis.RedisError as exc:
                raise _ChannelLost from exc
            # Subscribe first, then read once: a result stored before the
            # subscription is seen by the read, one stored after it by the
            # subscription. The read goes on another connection, so it waits
            # for Redis to confirm the subscription.
            found = self._next_published(pubsub, channel, deadline, until_subscribed=True)
            while found is None:
                found = self._stored(call_id)
                if found is not None:
                    break
                if lost is not None and lost.check():
                    raise BrokerLostCall(
                        f"the broker lost this call ({call_id}); submit it again "
                        "(its Redis came back without the call's records or result)"
                    )
                found = self._next_published(pubsub, channel, deadline)
                if deadline is not None and time.monotonic() >= deadline:
                    break
            try:
                pubsub.unsubscribe(channel)
                reusable = True
            except redis.RedisError:
                pass
            return found
        finally:
            self._give_back(pubsub, reusable=reusable)

    def _next_published(
        self,
        pubsub: Any,
        channel: bytes,
        deadline: float | None,
        *,
        until_subscribed: bool = False,
    ) -> ToolResult | None:
        """A result published on `channel`; None after a quiet second or at the deadline.

        `until_subscribed`: None as soon as Redis confirms the subscription.
        """
        import redis  # noqa: PLC0415 (see _wait_published)

        quiet_until = time.monotonic() + _WAIT_CHUNK_SECONDS
        while True:
            now = time.monotonic()
            left = quiet_until - now
            if deadline is not None:
                left = min(left, deadline - now)
            if left <= 0:
                # Quiet for a while: the caller reads the store again (it is
                # cheap), in case a message was missed.
                return None
            try:
                message = pubsub.get_message(timeout=left)
            except (redis.RedisError, OSError, ValueError) as exc:
                raise _ChannelLost from exc
            if message is None or message.get("channel") != channel:
                continue  # nothing yet, or a late message of the connection's previous wait
            kind = message.get("type")
            if kind == "subscribe" and until_subscribed:
                return None
            if kind != "message":
                continue
            found = _from_meta(self.app.backend.decode_result(message["data"]))
            if found is not None:
                return found

    def _take_pubsub(self, backend: Any) -> Any:
        with self._pubsub_lock:
            if self._idle_pubsubs:
                return self._idle_pubsubs.pop()
        return backend.client.pubsub()

    def _give_back(self, pubsub: Any, *, reusable: bool) -> None:
        if reusable:
            with self._pubsub_lock:
                if not self._closed and len(self._idle_pubsubs) < _IDLE_PUBSUBS:
                    self._idle_pubsubs.append(pubsub)
                    return
        pubsub.close()

    def call(
        self,
        agent: str,
        tool: str,
        arguments: Any,
        *,
        owner: str,
        turn: str | None = None,
        timeout: float | None = None,
    ) -> ToolResult:
        """`submit` then `result`."""
        return self.submit(agent, tool, arguments, owner=owner, turn=turn).result(timeout)

    def tools(self, agent: str, *, format: str | None = None) -> list[dict[str, Any]]:
        """The tool list the model is given; `format` "openai", "anthropic" or "mcp"
        puts it in that API's tool format (`broker.tool_formats`)."""
        from broker.tool_formats import in_format, listed  # noqa: PLC0415

        listing = listed(self.deployment, agent)
        return listing if format is None else in_format(listing, format)  # type: ignore[arg-type]

    def search_tools(self, agent: str, query: str, *, limit: int = 5) -> list[dict[str, Any]]:
        """What `search_tools` finds for `query` among the agent's unlisted tools:
        `{name, description, parameters}` entries, best first ([] when none matches)."""
        return Catalogue.of(self.deployment).search(agent, query, limit)

    def cancel(self, call_id: str) -> bool:
        """Cancel a queued or running call; False if it had finished or is unknown."""
        return self.cancel_outcome(call_id) in ("queued", "signalled")

    def cancel_outcome(self, call_id: str) -> str:
        """`cancel`, saying what it found: 'queued' (it never starts), 'signalled'
        (stopped where it runs), 'finished' or 'unknown'."""
        outcome, message = self.admission.cancel(call_id, self._ttl)
        if outcome == "queued":
            if message is not None:
                request = CallRequest.from_message(json.loads(message))
            else:  # cannot happen: a queued call has its record
                request = CallRequest(call_id=call_id, agent="", tool="", arguments=None, owner="")
            store_result_once(
                self.app,
                self.admission,
                cancelled_result(request),
                hostname=_CLIENT_HOST,
                ttl_seconds=self._ttl,
            )
        return str(outcome)

    def cancel_turn(self, turn: str) -> int:
        """Cancel every unfinished call of the turn; returns how many were cancelled."""
        return sum(self.cancel(call_id) for call_id in self.admission.turn_calls(turn))

    def end_turn(self, turn: str) -> None:
        """The turn is over: its workspaces are removed on every sandbox host
        (its home and any other where one lingers) and its homes forgotten.

        Its calls' results stay until they expire. Without this, a workspace
        is removed after the workspace TTL.
        """
        agents = list(self.deployment.agents)
        self.admission.end_turn(turn, agents)
        with self._turns_lock:
            for agent in agents:
                self._seen_turns.pop((agent, turn), None)

    def close(self) -> None:
        """Close the connections this client opened."""
        with self._pubsub_lock:
            self._closed = True
            idle, self._idle_pubsubs = self._idle_pubsubs, []
        for pubsub in idle:
            pubsub.close()
        self.admission.close()
        if self._own_app:
            self.app.close()
