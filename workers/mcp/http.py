"""Streamable HTTP for `vessel-workers mcp --http HOST:PORT`: bearer tokens, sessions' ends.

Every request needs `Authorization: Bearer <token>`, a token of the deployment's
`[mcp] tokens` (read from the environment here, where the server starts); the
SDK's bearer middleware answers 401 without one, and binds each session to the
credential that opened it. The token's owner is the owner of the session's calls.

A session's turn ends when the client ends the session (HTTP DELETE with its
`Mcp-Session-Id`), when the session has been idle for `SESSION_IDLE_SECONDS`,
and for every open session when the server stops.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.to_thread
from mcp.server import Server
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from broker.errors import ConfigError, MissingSecret
from broker.model import McpSettings
from workers.mcp.server import SESSION_HEADER, Turns

__all__ = ["SESSION_IDLE_SECONDS", "StaticTokens", "resolve_tokens", "serve_http"]

_log = logging.getLogger(__name__)

#: A session with no request for this long is closed by the SDK and its turn
#: ended here: long enough for a user's pause between two model turns.
SESSION_IDLE_SECONDS = 30 * 60.0
#: How often idle sessions' turns are looked for.
_SWEEP_SECONDS = 30.0


def resolve_tokens(
    settings: McpSettings | None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Token -> owner from `[mcp] tokens`; MissingSecret naming an unset variable.

    ConfigError when the deployment has no token at all: HTTP is never served
    unauthenticated.
    """
    env = os.environ if environ is None else environ
    pairs = settings.tokens if settings is not None else ()
    if not pairs:
        raise ConfigError(
            "the deployment has no [mcp] tokens: an MCP server over HTTP needs at least one "
            '(tokens = { "env:MCP_TOKEN_WEB" = "web/alice" })'
        )
    tokens: dict[str, str] = {}
    for name, owner in pairs:
        value = env.get(name)
        if not value:
            raise MissingSecret(f"[mcp] tokens: env:{name} is not set where the MCP server starts")
        tokens[value] = owner
    return tokens


class StaticTokens:
    """The SDK's `TokenVerifier` over a fixed token -> owner map."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._tokens = [(token.encode(), owner) for token, owner in tokens.items()]

    def __repr__(self) -> str:
        return f"StaticTokens(<{len(self._tokens)} tokens>)"

    async def verify_token(self, token: str) -> AccessToken | None:
        given = token.encode()
        found = None
        for known, owner in self._tokens:
            # Compared in constant time, and against every token.
            if hmac.compare_digest(given, known):
                found = owner
        if found is None:
            return None
        return AccessToken(token=token, client_id=found, scopes=[])


def _ends_sessions(app: Any, turns: Turns) -> Any:
    """Wraps the ASGI app: after a DELETE of a session, its turn is ended."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        if scope.get("type") == "http" and scope.get("method") == "DELETE":
            for name, value in scope.get("headers", ()):
                if name.decode("latin-1").lower() == SESSION_HEADER:
                    await anyio.to_thread.run_sync(turns.end, value.decode("latin-1"))

    return wrapped


async def serve_http(
    server: Server[Any],
    *,
    host: str,
    port: int,
    tokens: Mapping[str, str],
    turns: Turns,
) -> None:
    """Serve `server` over streamable HTTP at http://HOST:PORT/mcp until cancelled."""
    import uvicorn  # noqa: PLC0415 (only with --http)

    app = server.streamable_http_app(
        host=host,
        auth=AuthSettings(issuer_url=f"http://{host}:{port}", resource_server_url=None),  # type: ignore[arg-type]
        token_verifier=StaticTokens(tokens),
        session_idle_timeout=SESSION_IDLE_SECONDS,
    )
    config = uvicorn.Config(
        _ends_sessions(app, turns),
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
    )
    web = uvicorn.Server(config)

    async def sweep() -> None:
        while True:
            await anyio.sleep(_SWEEP_SECONDS)
            for key in turns.idle(SESSION_IDLE_SECONDS):
                await anyio.to_thread.run_sync(turns.end, key)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(sweep)
            await web.serve()
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(turns.end_all)
