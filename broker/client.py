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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery

from broker import fast_path
from broker.admission import Admission, RedisAdmission
from broker.admission.finish import store_result_once
from broker.admission.publish import publish
from broker.arguments import submit_problem
from broker.catalogue import Answer, Catalogue, route_call
from broker.celery_app import longest_timeout, make_app
from broker.config import Settings, hide_password
from broker.constants import ENV_BROKER_URL
from broker.envelope import EnvelopeFactory
from broker.errors import BrokerUnavailable, MissingBrokerURL
from broker.model import Deployment
from broker.owner import check_owner
from broker.protocol import CallRequest, Initiator, ToolResult, cancelled_result, new_call_id
from broker.queues import WORKSPACE_KINDS
from broker.retrying import unreachable
from broker.seen_turns import SeenTurns
from broker.waiting import ResultWaiter

if TYPE_CHECKING:
    from broker.files import TurnFiles

__all__ = ["CallHandle", "VesselClient"]

_log = logging.getLogger(__name__)

#: Who stores the result of a call refused at submit or cancelled while queued.
_CLIENT_HOST = "client"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _while_connecting(exc: BaseException) -> bool:
    """True if redis-py failed before sending (no connection): nothing ran."""
    text = str(exc)
    return "connecting to" in text or "Timeout connecting" in text


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
                    "(workers.embedded.embedded_client)."
                )
            admission = RedisAdmission.from_url(
                self.settings.broker_url, sentinel_master=self.settings.sentinel_master
            )
        self.admission = admission
        self._own_app = app is None
        if app is None:
            app = make_app(self.settings, longest_tool_seconds=longest_timeout(deployment))
        self.app = app
        # Admission in the broker's Redis can push each call's prepared message
        # into its lane itself (broker/envelope.py) if broker/fast_path.py agrees.
        self.fast_path = (
            fast_path.decide(app, self.settings, admission)
            if isinstance(admission, RedisAdmission)
            else fast_path.Decision(enabled=False, reason="the embedded default")
        )
        self._envelopes = EnvelopeFactory(app) if self.fast_path.enabled else None
        self._waiter = ResultWaiter(
            app, admission, heartbeat_seconds=self.settings.heartbeat_seconds
        )
        self._turns = SeenTurns()

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
                ToolResult.error(request, problem, outcome="refused"),
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
                seen=affinity and turn is not None and self._turns.seen(agent, turn),
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
            self._turns.note_call(request.call_id, agent, turn)
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
        PUBLISHes each stored result on, so a result is seen as soon as it is
        stored; otherwise (the embedded default's in-memory backend) it polls
        every few milliseconds (`broker.waiting`). BrokerLostCall when the
        broker came back from an outage without the call.
        """
        found = self._waiter.wait(call_id, timeout)
        self._turns.result_came(found)
        return found

    def saw_turn(self, agent: str, turn: str) -> None:
        """Remember that the turn had a home (a result or operation came back)."""
        self._turns.saw(agent, turn)

    def turn_seen(self, agent: str, turn: str) -> bool:
        """True if this client saw the turn homed within the workspace idle TTL."""
        return self._turns.seen(agent, turn)

    def files(self, agent: str, turn: str, *, timeout: float | None = None) -> TurnFiles:
        """The turn's workspace: put, get, list, delete on its home host (`broker.files`)."""
        from broker.files import DEFAULT_OP_TIMEOUT_SECONDS, TurnFiles  # noqa: PLC0415

        return TurnFiles(self, agent, turn, timeout=timeout or DEFAULT_OP_TIMEOUT_SECONDS)

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
        self._turns.forget(agents, turn)

    def close(self) -> None:
        """Close the connections this client opened."""
        self._waiter.close()
        self.admission.close()
        if self._own_app:
            self.app.close()
