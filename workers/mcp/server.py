"""One agent's catalogue as an MCP server, on the official SDK's low-level `Server`.

- `tools/list` is exactly the list the model is given (`broker.tool_formats.listed`),
  in MCP's shape (`inputSchema`).
- `tools/call` submits the call through the client API and waits for its result:
  the text the model sees as text content, `isError` from the result, each outbox
  file as an embedded resource (base64 blob). While it runs, a client that gave a
  progress token gets `notifications/progress` (queued or running, and the
  seconds elapsed as the progress value). A request cancelled by the client
  (`notifications/cancelled`, or a closed HTTP stream) cancels the call.
- The owner comes from the transport: the bearer token's owner over HTTP, the
  `--owner` of the command over stdio. The turn is the MCP session: one turn per
  session id over HTTP (one per process over stdio), ended when the session ends.

The server speaks the handshake era of the protocol (`initialize`, up to
2025-11-25): the 2026-07-28 era has no sessions, and the session is what gives
a client's calls one turn and one workspace. `server/discover` is answered with
METHOD_NOT_FOUND, which the SDK's client (mode "auto") takes as "use initialize".
"""

from __future__ import annotations

import logging
import mimetypes
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from broker.client import CallHandle, VesselClient
from broker.errors import CallTimeout, TransientError, UnknownTool
from broker.result import ToolResult
from broker.tool_formats import in_format, listed

__all__ = [
    "PROGRESS_SECONDS",
    "SERVER_NAME",
    "SESSION_HEADER",
    "TURN_PREFIX",
    "Turns",
    "build_server",
    "call_content",
    "session_key",
]

_log = logging.getLogger(__name__)

SERVER_NAME = "vessel-workers"
#: How often a running call reports progress: often enough that a client's
#: idle timer sees it alive, rare enough to cost nothing next to a call.
PROGRESS_SECONDS = 0.5
#: Turn ids this server makes start with this (a session's turn is `mcp-<hex>`).
TURN_PREFIX = "mcp-"
#: The header carrying the session id over streamable HTTP (lowercase: ASGI).
SESSION_HEADER = "mcp-session-id"


@dataclass(frozen=True, slots=True)
class _Turn:
    turn: str
    owner: str


class Turns:
    """Session -> turn, and the turns' ends (`client.end_turn`).

    Over HTTP a session is its `Mcp-Session-Id`; over stdio the process is the
    one session (key None). A session's turn and owner are fixed by its first
    call: a later call of the session with another owner is refused.
    """

    def __init__(self, client: VesselClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._turns: dict[str | None, _Turn] = {}
        self._used: dict[str | None, float] = {}

    def turn_for(self, key: str | None, owner: str) -> str:
        with self._lock:
            found = self._turns.get(key)
            if found is None:
                found = _Turn(turn=f"{TURN_PREFIX}{uuid.uuid4().hex}", owner=owner)
                self._turns[key] = found
            self._used[key] = time.monotonic()
        if found.owner != owner:
            raise MCPError(types.INVALID_REQUEST, "this session belongs to another owner")
        return found.turn

    def end(self, key: str | None) -> None:
        """The session is over: its turn's workspace is removed (no-op if it made no call)."""
        with self._lock:
            found = self._turns.pop(key, None)
            self._used.pop(key, None)
        if found is not None:
            try:
                self._client.end_turn(found.turn)
            except TransientError as exc:  # the workspace TTL removes it later
                _log.warning("could not end turn %s (%s)", found.turn, exc)

    def idle(self, seconds: float) -> list[str | None]:
        """Sessions with no call for `seconds`."""
        now = time.monotonic()
        with self._lock:
            return [key for key, used in self._used.items() if now - used > seconds]

    def end_all(self) -> None:
        with self._lock:
            keys = list(self._turns)
        for key in keys:
            self.end(key)


class _Pending:
    """A call being submitted from a worker thread while its request may be cancelled.

    Whichever comes second does the cancel: the request's cancel once the call
    is submitted, or the submitting thread if the request was cancelled first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._call_id: str | None = None
        self._cancelled = False

    def submitted(self, handle: CallHandle) -> bool:
        """Records the call; False if the request was cancelled meanwhile."""
        with self._lock:
            self._call_id = handle.call_id
            return not self._cancelled

    def call_id(self) -> str:
        if self._call_id is None:  # set before the first wait returns
            raise RuntimeError("the MCP call has no call id yet")
        return self._call_id

    def cancel(self) -> str | None:
        """The call to cancel, or None when the submitting thread will."""
        with self._lock:
            self._cancelled = True
            return self._call_id


def session_key(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The HTTP session id of the request; None over stdio."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    value = headers.get(SESSION_HEADER)
    return None if value is None else str(value)


def _owner_of_request(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The owner the bearer token maps to (set by `workers.mcp.tokens`), or None."""
    request = ctx.request
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return None
    user = scope.get("user")
    token = getattr(user, "access_token", None)
    owner = getattr(token, "client_id", None)
    return owner if isinstance(owner, str) else None


def call_content(result: ToolResult, *, agent: str, turn: str) -> dict[str, Any]:
    """The `tools/call` result of `result`: the model's text, isError, outbox files."""
    content: list[dict[str, Any]] = [{"type": "text", "text": result.output}]
    for found in result.files:
        mime = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
        content.append(
            {
                "type": "resource",
                "resource": {
                    "uri": f"vessel://{agent}/{turn}/outbox/{found.name}",
                    "mimeType": mime,
                    "blob": found.content_base64,
                },
            }
        )
    return {"content": content, "isError": result.is_error}


def _progress_token(ctx: ServerRequestContext[Any, Any]) -> Any:
    meta = ctx.meta
    if not meta:
        return None
    return meta.get("progress_token", meta.get("progressToken"))  # type: ignore[misc,unused-ignore]


def build_server(
    client: VesselClient,
    agent: str,
    *,
    owner: str | None,
    turns: Turns,
) -> Server[Any]:
    """The MCP server of `agent`'s catalogue.

    `owner`: the owner of every call (stdio); None takes it from the request's
    bearer token (HTTP). InvalidToolName (before anything is served) when a
    listed name is one the model APIs refuse.
    """
    # The deployment is fixed for the server's life, and so is the list: made
    # once, not per request (a call checks its tool against it).
    tools = in_format(listed(client.deployment, agent), "mcp")
    # What a call may name: every tool the agent may call, listed or not (a
    # client that learnt a name from search_tools calls it directly, as a model
    # may), plus the listed built-ins.
    names = frozenset(str(entry["name"]) for entry in tools) | frozenset(
        client.deployment.agent(agent).usable()
    )

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
    ) -> dict[str, Any]:
        return {"tools": tools}

    async def discover(ctx: ServerRequestContext[Any, Any], params: types.RequestParams) -> None:
        raise MCPError(
            types.METHOD_NOT_FOUND,
            "server/discover is not served: this server speaks the initialize handshake "
            "(a session is the turn its calls share)",
        )

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> dict[str, Any]:
        who = owner if owner is not None else _owner_of_request(ctx)
        if who is None:  # cannot happen behind the bearer check; refuse all the same
            raise MCPError(types.INVALID_REQUEST, "no owner: the request is not authenticated")
        if params.name not in names:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")
        turn = turns.turn_for(session_key(ctx), who)
        arguments = params.arguments if params.arguments is not None else {}
        pending = _Pending()

        def submit_and_wait() -> ToolResult | None:
            # One hop to a worker thread for the submit and the first wait: a
            # quick call's result is back before the first progress is due.
            handle = client.submit(agent, params.name, arguments, owner=who, turn=turn)
            if not pending.submitted(handle):  # cancelled while it was being submitted
                client.cancel(handle.call_id)
                return None
            return _result_within(client, handle.call_id)

        token = _progress_token(ctx)
        started = time.monotonic()
        try:
            try:
                result = await anyio.to_thread.run_sync(submit_and_wait, abandon_on_cancel=True)
            except UnknownTool as exc:
                raise MCPError(types.INVALID_PARAMS, str(exc)) from exc
            except TransientError as exc:
                raise MCPError(types.INTERNAL_ERROR, f"{exc} (nothing ran)") from exc
            while result is None:
                call_id = pending.call_id()
                if token is not None:
                    running = await anyio.to_thread.run_sync(client.admission.claimed, call_id)
                    elapsed = round(time.monotonic() - started, 1)
                    phase = "running" if running else "queued"
                    await ctx.session.report_progress(
                        elapsed, None, f"{phase}, {elapsed:.1f} s elapsed"
                    )
                result = await anyio.to_thread.run_sync(
                    _result_within, client, call_id, abandon_on_cancel=True
                )
        except anyio.get_cancelled_exc_class():
            to_cancel = pending.cancel()
            if to_cancel is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(client.cancel, to_cancel)
            raise
        return call_content(result, agent=agent, turn=turn)

    server: Server[Any] = Server(SERVER_NAME, version=_version())
    if not _tracing():
        # The SDK wraps every request in an OpenTelemetry span; with no tracer
        # provider set the span records nothing, and costs a few % of a call.
        server.middleware = [
            m for m in server.middleware if type(m).__name__ != "OpenTelemetryMiddleware"
        ]
    server.add_request_handler("tools/list", types.PaginatedRequestParams, list_tools)
    server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)
    server.add_request_handler("server/discover", types.RequestParams, discover)
    return server


def _tracing() -> bool:
    """True when a real OpenTelemetry tracer provider is set (e.g. by opentelemetry-instrument)."""
    from opentelemetry import trace  # noqa: PLC0415 (a dependency of the SDK)

    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _result_within(client: VesselClient, call_id: str) -> ToolResult | None:
    """The call's result if it comes within one progress period; else None."""
    try:
        return client.result(call_id, PROGRESS_SECONDS)
    except CallTimeout:
        return None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("vessel-workers")
    except PackageNotFoundError:
        return "0"
