"""P2 MCP: an MCP `tools/call` of the trivial service tool over streamable HTTP,
against the same call through `VesselClient.call`.

The MCP server (`workers.mcp`) runs in this process on its own thread and event
loop, over the solo deployment's client; the MCP side is the SDK's own client,
one session for the run, one call at a time. Goal: the MCP layer adds at most
1.2x or 1 ms at the median, whichever is larger (the row's goal is the ratio;
the notes give the added milliseconds).
"""

from __future__ import annotations

import threading
import time

import httpx

from bench.context import Context
from bench.deployment import TOOL_PING
from bench.ours import NotAvailable, require_parts
from bench.report import Goal, Row
from bench.stack import cluster_of
from bench.turns import WrongResult, in_turns

__all__ = ["GOAL", "run"]

GOAL = Goal(median_max=1.2)
_NAME = "service call over MCP (streamable HTTP): ours via MCP vs client.call"
_TOKEN = "bench-mcp-token"
_TIMEOUT = 30.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(ctx: Context) -> list[Row]:
    try:
        require_parts()
    except NotAvailable as exc:
        return [Row(mode="P2", name=_NAME, unit="ms", goal=GOAL, skipped=f"not measured: {exc}")]
    import anyio
    from anyio.from_thread import start_blocking_portal
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from workers.mcp.http import serve_http
    from workers.mcp.server import Turns, build_server

    iterations, warmup = (5, 2) if ctx.quick else (150, 15)
    deployment, ours = cluster_of(ctx).solo()
    agent = deployment.agents[0]
    client = ours.client
    turns = Turns(client)
    server = build_server(client, agent, owner=None, turns=turns)
    port = _free_port()
    stop = threading.Event()
    tokens = {_TOKEN: "bench/mcp"}

    def serve() -> None:
        async def main() -> None:
            async with anyio.create_task_group() as group:
                group.start_soon(
                    lambda: serve_http(
                        server,
                        host="127.0.0.1",
                        port=port,
                        tokens=tokens,
                        turns=turns,
                    )
                )
                while not stop.is_set():
                    await anyio.sleep(0.05)
                group.cancel_scope.cancel()

        anyio.run(main)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 20
    while True:  # until the server answers (401 without a token: it is up)
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {_TOKEN}"})
    session = Client(streamable_http_client(url, http_client=http_client))
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(session) as mcp:

            def via_mcp() -> None:
                result = portal.call(mcp.call_tool, TOOL_PING, {})
                if result.is_error:
                    raise WrongResult(f"MCP call failed: {result.content!r}")

            turns_run = in_turns(
                {
                    "ours_service": lambda: ours.call(agent, TOOL_PING, {}, _TIMEOUT),
                    "ours_mcp": via_mcp,
                },
                iterations=iterations,
                warmup=warmup,
            )
        portal.call(http_client.aclose)  # a client given to the transport is ours to close
    stop.set()
    thread.join(10)
    return [
        Row(
            mode="P2",
            name=_NAME,
            unit="ms",
            baseline_name="client.call",
            baseline_samples=turns_run.samples["ours_service"],
            ours_samples=turns_run.samples["ours_mcp"],
            goal=GOAL,
            errors=turns_run.errors_of("ours_service", "ours_mcp"),
            notes="MCP server in-process (uvicorn, SSE responses), the SDK's client; "
            "goal: at most 1.2x or +1 ms at the median, whichever is larger",
        )
    ]
