"""P2 MCP: an MCP `tools/call` of the trivial service tool over streamable HTTP,
against the same call through `VesselClient.call`.

The MCP server is `vessel-workers mcp AGENT --http` in its own process, as it is
deployed, on the solo deployment's Redis and workers. The call through it comes
from a minimal client (`bench.mcp_client`: one session, one kept-alive
connection), so the row prices the server; the baseline is `client.call` of the
same tool in this process with a turn of its own, as the MCP session's calls
have one. A second row, without a goal, gives the same call through the SDK's
own client (`mcp.Client`, one session for the run), whose per-call cost is the
client's, not the server's.

Goal: the MCP layer adds at most 1.2x or 1 ms at the median, whichever is
larger (`met` in the notes and `details`: the row's ratio goal is 1.2x, and a
median within 1 ms of the baseline meets it too).
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Callable

import httpx

from bench.cluster import free_port
from bench.context import Context
from bench.deployment import TOOL_PING
from bench.mcp_client import MinimalMcpClient
from bench.ours import NotAvailable, require_parts
from bench.report import Goal, Row
from bench.stack import DB_SOLO, cluster_of
from bench.turns import WrongResult, in_turns

__all__ = ["ADDED_MS", "GOAL", "RATIO", "run"]

RATIO = 1.2
GOAL = Goal(median_max=RATIO)
#: Or this many milliseconds added at the median, whichever is larger.
ADDED_MS = 1.0
_NAME = "service call over MCP (streamable HTTP), minimal client: ours via MCP vs client.call"
_NAME_SDK = "the same through the SDK's client (mcp.Client), no goal: client cost included"
_TOKEN = "bench-mcp-token"
_TOKEN_ENV = "VESSEL_BENCH_MCP_TOKEN"
_TIMEOUT = 30.0


def _mcp_deployment(path: str) -> str:
    """The solo deployment with an `[mcp]` token table, beside it."""
    from pathlib import Path

    source = Path(path)
    target = source.with_name("deployment-mcp.toml")
    target.write_text(
        f'[mcp]\ntokens = {{ "env:{_TOKEN_ENV}" = "bench/mcp" }}\n' + source.read_text()
    )
    return str(target)


def _verdict(base: list[float], ours: list[float]) -> str:
    if not base or not ours:
        return "not measured"
    b, o = statistics.median(base), statistics.median(ours)
    met = o <= max(b * RATIO, b + ADDED_MS)
    return f"+{o - b:.2f} ms at the median ({o / b:.2f}x): {'met' if met else 'NOT met'}"


def run(ctx: Context) -> list[Row]:
    try:
        require_parts()
    except NotAvailable as exc:
        return [Row(mode="P2", name=_NAME, unit="ms", goal=GOAL, skipped=f"not measured: {exc}")]
    from anyio.from_thread import start_blocking_portal
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    iterations, warmup = (5, 2) if ctx.quick else (300, 30)
    bench = cluster_of(ctx)
    deployment, ours = bench.solo()
    agent = deployment.agents[0]
    port = free_port()
    server = bench.cluster.start_vessel_mcp(
        "ours-mcp",
        agent,
        deployment=_mcp_deployment(str(deployment.path)),
        broker_url=bench.cluster.redis_url(DB_SOLO),
        address=f"127.0.0.1:{port}",
        env={_TOKEN_ENV: _TOKEN},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    # Up when it answers (401 without a token).
    bench.cluster.wait_ready(
        lambda: httpx.get(url, timeout=1).status_code == 401, [server], "vessel-workers mcp"
    )
    minimal = MinimalMcpClient(url, _TOKEN, timeout=_TIMEOUT)
    turn = f"bench-mcp-{uuid.uuid4().hex}"
    http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {_TOKEN}"})
    try:
        with start_blocking_portal() as portal:
            try:
                with portal.wrap_async_context_manager(
                    Client(streamable_http_client(url, http_client=http_client))
                ) as sdk:

                    def via_minimal() -> None:
                        result = minimal.call_tool(TOOL_PING, {})
                        if result.get("isError") is not False:
                            raise WrongResult(f"MCP call failed: {result!r}")

                    def via_sdk() -> None:
                        result = portal.call(sdk.call_tool, TOOL_PING, {})
                        if result.is_error:
                            raise WrongResult(f"MCP call failed: {result.content!r}")

                    contenders: dict[str, Callable[[], object]] = {
                        "ours_service": lambda: ours.call(
                            agent, TOOL_PING, {}, _TIMEOUT, turn=turn
                        ),
                        "ours_mcp": via_minimal,
                        "ours_mcp_sdk": via_sdk,
                    }
                    turns_run = in_turns(contenders, iterations=iterations, warmup=warmup)
            finally:
                # A client given to the transport is ours to close: after the SDK's
                # client has ended its session with it (DELETE).
                portal.call(http_client.aclose)
    finally:
        minimal.close()
        ours.client.end_turn(turn)
        bench.cluster.stop(server)
    base = turns_run.samples["ours_service"]
    notes = (
        "vessel-workers mcp --http in its own process (uvicorn, SSE responses); one session, "
        "one kept-alive connection; baseline: client.call with a turn, like the session's calls"
    )
    return [
        Row(
            mode="P2",
            name=_NAME,
            unit="ms",
            baseline_name="client.call",
            baseline_samples=base,
            ours_samples=turns_run.samples["ours_mcp"],
            goal=GOAL,
            errors=turns_run.errors_of("ours_service", "ours_mcp"),
            notes=f"{notes}; goal: at most 1.2x or +1 ms at the median, whichever is larger; "
            + _verdict(base, turns_run.samples["ours_mcp"]),
        ),
        Row(
            mode="P2",
            name=_NAME_SDK,
            unit="ms",
            baseline_name="client.call",
            baseline_samples=base,
            ours_samples=turns_run.samples["ours_mcp_sdk"],
            errors=turns_run.errors_of("ours_mcp_sdk"),
            notes=_verdict(base, turns_run.samples["ours_mcp_sdk"]).split(":")[0],
        ),
    ]
