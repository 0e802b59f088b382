"""`vessel-workers mcp`: one agent's catalogue as a Model Context Protocol server.

`server` builds the SDK server (tools/list, tools/call, progress, cancel, turns);
`http` serves it over streamable HTTP behind bearer tokens; `serve_stdio` here
over the process's standard input and output.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
from mcp.server import Server

from workers.mcp.server import Turns

__all__ = ["serve_stdio"]


async def serve_stdio(server: Server[Any], turns: Turns) -> None:
    """Serve `server` on stdin/stdout until stdin closes; then end the session's turn."""
    from mcp.server.runner import serve_loop  # noqa: PLC0415
    from mcp.server.stdio import stdio_server  # noqa: PLC0415

    try:
        # The handshake-only loop (`Server.run` would also serve the 2026-07-28
        # era, which has no session to carry the turn: see workers.mcp.server).
        async with server.lifespan(server) as state, stdio_server() as (reader, writer):
            await serve_loop(
                server,
                reader,
                writer,
                lifespan_state=state,
                init_options=server.create_initialization_options(),
            )
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(turns.end_all)
