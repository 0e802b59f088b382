"""`ServiceCaller`: runs service tool calls (seed 001) for one service worker process.

One `httpx.Client` serves every call of the process (thread-safe, pooled
keep-alive connections). For a call it POSTs the arguments as a JSON object to
the granted URL + the tool's path, with the grant's headers and the three
`X-Vessel-*` headers, and turns whatever happens into a `ToolResult`; nothing the
server does makes `call` raise.

Choices the seed leaves open (also in texts.py and the README):

- Redirects are never followed, proxies and `.netrc` from the environment are
  ignored (`trust_env=False`: a grant's secret goes to the granted host only),
  and cookies are never kept (one service's cookie must not follow another
  owner's call).
- `Accept-Encoding: identity` is asked for, so the body cap is a cap on bytes.
- `status` in the result is the status line received, or None when none came.
- Redaction covers every granted header value of the agent (all its services),
  in every text the model can see; then the text is cut to `tool_output_chars`.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from types import TracebackType
from typing import Any

import httpx

from broker.constants import DEFAULT_TOOL_TIMEOUT_SECONDS, SERVICE_BODY_LIMIT_BYTES
from broker.model import Agent, Deployment, ServiceTool
from broker.result import ToolResult
from workers.output import cut_output
from workers.service import texts
from workers.service.exchange import Exchange, Failure, run_exchange
from workers.service.redact import Redactor
from workers.service.secrets import ResolvedGrant, resolve_grants
from workers.service.transport import SocketOption, build_transport, stops_by_itself

__all__ = ["POOL_LIMITS", "USER_AGENT", "ServiceCaller"]

log = logging.getLogger(__name__)

USER_AGENT = "vessel-workers"

#: Connections of one worker process, across every service. The ceiling only
#: stops a runaway: each call in flight holds at most one connection.
#: Keep-alive connections are reused for at most 1.5 s idle, below the 2 s of
#: gunicorn's and the 5 s of uvicorn's and Node's defaults, so a call rarely
#: picks a connection the server is closing (a POST is never retried: the
#: service may not be idempotent).
POOL_LIMITS = httpx.Limits(max_connections=512, max_keepalive_connections=64, keepalive_expiry=1.5)

#: httpcore writes a request's headers and body separately; with Nagle on, the
#: body of a call on a reused connection waits for the server's delayed ACK
#: (40 ms on Linux). Every call is latency-bound, so no Nagle.
_SOCKET_OPTIONS: list[SocketOption] = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]

#: The client's default; every request carries its own tool's limit instead.
_CLIENT_TIMEOUT = httpx.Timeout(DEFAULT_TOOL_TIMEOUT_SECONDS)

#: Loggers that could print a URL or a response header (an echoed token) below
#: WARNING; see `_quiet_library_logs`.
_LIBRARY_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
)


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


def _quiet_library_logs() -> None:
    # httpcore's DEBUG lines include response headers, where a hostile service
    # can echo a token; httpx's INFO line includes the URL, which may come from
    # a secret. A service worker holds secrets, so these never reach a handler,
    # whatever logging level an operator turns on. Idempotent.
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _BelowWarning) for f in logger.filters):
            logger.addFilter(_BelowWarning())


def _no_cookies() -> CookieJar:
    # An empty allow-list refuses every domain: Set-Cookie is dropped, and no
    # Cookie header is ever sent.
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


class ServiceCaller:
    """Calls services for the given agents (default: every agent of the deployment).

    Resolves the grants' `env:` values now, raising `MissingSecret` naming each
    missing variable. Thread-safe: a service worker runs many calls at once.
    """

    def __init__(
        self,
        deployment: Deployment,
        *,
        agents: Iterable[str] | None = None,
        environ: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        ids = sorted(set(deployment.agents if agents is None else agents))
        self._grants: dict[tuple[str, str], ResolvedGrant] = resolve_grants(
            deployment, ids, environ
        )
        self._agents = frozenset(ids)
        values: dict[str, list[str]] = {agent_id: [] for agent_id in ids}
        for (agent_id, _service), grant in self._grants.items():
            values[agent_id].extend(grant.headers.values())
        # Built at an agent's first call, once per distinct set of values:
        # compiling every spelling of a value costs about 1 ms per character,
        # and a worker may serve thousands of agents sharing one token.
        self._values = {agent_id: frozenset(v) for agent_id, v in values.items()}
        self._redactors: dict[frozenset[str], Redactor] = {}
        self._redactors_lock = threading.Lock()
        _quiet_library_logs()
        if transport is None:
            transport = build_transport(limits=POOL_LIMITS, socket_options=_SOCKET_OPTIONS)
        # Exchanges run on the calling thread when the transport itself keeps
        # the call's limit and cancel (workers.service.exchange).
        self._inline = stops_by_itself(transport)
        self._client = httpx.Client(
            transport=transport,
            timeout=_CLIENT_TIMEOUT,
            follow_redirects=False,
            trust_env=False,
            cookies=_no_cookies(),
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        )
        self._closed = False

    def __repr__(self) -> str:
        # Names and counts only: the grants hold secrets.
        return (
            f"ServiceCaller(agents={sorted(self._agents)!r}, grants={len(self._grants)}, "
            f"closed={self._closed})"
        )

    def __enter__(self) -> ServiceCaller:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def runs_inline(self) -> bool:
        """True if exchanges run on the calling thread: the transport itself keeps
        each call's limit and cancel (the default one does); else each runs on a
        thread of its own that the calling thread gives up."""
        return self._inline

    def _redactor(self, agent_id: str) -> Redactor:
        values = self._values.get(agent_id, frozenset())
        with self._redactors_lock:
            redactor = self._redactors.get(values)
            if redactor is None:
                redactor = self._redactors[values] = Redactor(values)
        return redactor

    def close(self) -> None:
        """Close the connection pool; idempotent."""
        self._closed = True
        self._client.close()

    def call(
        self,
        *,
        call_id: str,
        agent: Agent,
        tool: ServiceTool,
        arguments: dict[str, Any],
        owner: str,
        cancel: threading.Event | None = None,
    ) -> ToolResult:
        """Run one call; every outcome, including the server's misbehaviour, is a result."""
        started = time.monotonic()
        redact = self._redactor(agent.id)

        def result(
            text: str, *, is_error: bool, outcome: str, status: int | None = None
        ) -> ToolResult:
            output, dropped = cut_output(redact(text), agent.settings.tool_output_chars)
            duration = round((time.monotonic() - started) * 1000, 3)
            log.debug(
                "service call %s agent=%s tool=%s status=%s outcome=%s %.1f ms",
                call_id,
                agent.id,
                tool.name,
                status,
                outcome,
                duration,
            )
            return ToolResult(
                call_id=call_id,
                agent=agent.id,
                tool=tool.name,
                is_error=is_error,
                output=output,
                dropped_chars=dropped,
                status=status,
                duration_ms=duration,
                outcome=outcome,
            )

        grant = self._grants.get((agent.id, tool.service))
        if grant is None:
            return result(
                f"{tool.name}: this worker holds no grant of service {tool.service!r} "
                f"for agent {agent.id!r}",
                is_error=True,
                outcome="refused",
            )
        if self._closed:
            return result(texts.unreachable(tool.name), is_error=True, outcome="error")
        if cancel is not None and cancel.is_set():
            return result(texts.CANCELLED, is_error=True, outcome="cancelled")
        try:
            request = self._build(grant, agent, tool, arguments, owner)
        except (TypeError, ValueError, httpx.InvalidURL):
            # Arguments that are not JSON (checked earlier, so unlikely) or a
            # target httpx refuses: nothing was sent. The error text is not
            # shown: it could quote the URL.
            return result(
                f"{tool.name}: the call could not be sent", is_error=True, outcome="refused"
            )
        exchange = run_exchange(
            self._client,
            request,
            deadline=started + tool.timeout_seconds,
            cancel=cancel,
            limit=SERVICE_BODY_LIMIT_BYTES,
            inline=self._inline,
            name=f"vessel-service-{call_id}",
        )
        text, is_error, outcome = _shown(exchange, tool)
        return result(text, is_error=is_error, outcome=outcome, status=exchange.status)

    def _build(
        self,
        grant: ResolvedGrant,
        agent: Agent,
        tool: ServiceTool,
        arguments: dict[str, Any],
        owner: str,
    ) -> httpx.Request:
        body = json.dumps(arguments, allow_nan=False).encode("utf-8")
        headers = dict(grant.headers)
        # Set last so a grant cannot change them (the loader also refuses X-Vessel-*).
        headers["Content-Type"] = "application/json"
        headers["X-Vessel-Owner"] = owner
        headers["X-Vessel-Agent"] = agent.id
        headers["X-Vessel-Tool"] = tool.name
        # Every phase gets at most the call's whole limit; run_exchange enforces
        # the limit on the call as a whole.
        return self._client.build_request(
            "POST",
            grant.url + tool.path,
            content=body,
            headers=headers,
            timeout=httpx.Timeout(tool.timeout_seconds),
        )


def _shown(exchange: Exchange, tool: ServiceTool) -> tuple[str, bool, str]:
    """(text before redaction, is_error, outcome) for what came back."""
    if exchange.failure is Failure.TIMEOUT:
        return texts.no_answer(tool.name, tool.timeout_seconds), True, "timeout"
    if exchange.failure is Failure.CANCELLED:
        return texts.CANCELLED, True, "cancelled"
    if exchange.failure is Failure.TOO_LARGE:
        return texts.too_large(tool.name), True, "error"
    if exchange.failure is Failure.UNREACHABLE or exchange.status is None:
        return texts.unreachable(tool.name), True, "error"
    status = exchange.status
    if exchange.body is None:
        return texts.failed(tool.name, status), True, "error"
    if 200 <= status < 300:
        return texts.render_body(status, exchange.body), False, "ok"
    return texts.render_body(status, exchange.body), True, "error"
