"""`vessel-workers mcp` driven by the MCP SDK's own client, over stdio and streamable
HTTP, against real workers (one sandbox, one service worker) and a real Redis.

One agent, `mix`, with declared tools (echo, fail, spin, ws, outbox) and a service
tool (`work`, with an integer `n` the worker checks) on the recording server.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from bench.redis_server import free_port
from broker.loading import load_deployment
from broker.tool_formats import in_format, listed

from .conftest import (
    CLUSTER_ENV,
    REPO,
    Cluster,
    Recorder,
    processes_with,
    serve,
    start_redis,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

TOKEN_A = "tok-alice-0123456789abcdef"
TOKEN_B = "tok-bob-0123456789abcdef"

ECHO_PY = "import json, sys\nprint(json.dumps({'got': json.load(sys.stdin)}))\n"
FAIL_PY = "import sys\nprint('it broke')\nsys.exit(3)\n"
SPIN_PY = """\
import json, subprocess, sys, time
args = json.load(sys.stdin)
subprocess.Popen(["sleep", args["marker"]])
print("spinning", flush=True)
time.sleep(float(args.get("sleep", 600)))
print("done")
"""
WS_PY = """\
import json, os, sys
args = json.load(sys.stdin)
home = os.environ["HOME"]
for name, text in args.get("write", {}).items():
    with open(os.path.join(home, name), "w") as f:
        f.write(text)
seen = {}
for name in args.get("read", []):
    try:
        with open(os.path.join(home, name)) as f:
            seen[name] = f.read()
    except FileNotFoundError:
        seen[name] = None
print(json.dumps(seen))
"""
OUTBOX_PY = """\
import os
with open(os.path.join(os.environ["VESSEL_OUTBOX"], "report.txt"), "w") as f:
    f.write("hello outbox")
print("wrote report.txt")
"""
WORK_TOOL = """\
name = "work"
description = "Ask the test server to do some work."
service = "app"
path = "/work"
timeout_seconds = 10
[parameters]
type = "object"
required = ["n"]
[parameters.properties.n]
type = "integer"
[parameters.properties.sleep]
type = "number"
"""


def _declared(name: str, timeout: float) -> str:
    return (
        f'name = "{name}"\ndescription = "{name} (test tool)"\n'
        f'command = ["python3", "{{package}}/tools/{name}.py"]\n'
        f'timeout_seconds = {timeout}\n[parameters]\ntype = "object"\n'
    )


def _write(folder: Path, port: int) -> Path:
    pkg = folder / "mixpkg"
    (pkg / "tools").mkdir(parents=True)
    declared = {
        "echo": ECHO_PY,
        "fail": FAIL_PY,
        "spin": SPIN_PY,
        "hold": SPIN_PY,
        "ws": WS_PY,
        "outbox": OUTBOX_PY,
    }
    names = [*declared, "work"]
    (pkg / "vessel.toml").write_text(
        "tool_timeout_seconds = 10\n[tools]\ndeclared = ["
        + ", ".join(f'"tools/{n}.toml"' for n in names)
        + "]\n"
    )
    for name, body in declared.items():
        (pkg / "tools" / f"{name}.py").write_text(body)
        (pkg / "tools" / f"{name}.toml").write_text(_declared(name, 1 if name == "spin" else 10))
    (pkg / "tools" / "work.toml").write_text(WORK_TOOL)
    (folder / "data").mkdir()
    path = folder / "deployment.toml"
    path.write_text(
        '[mcp]\ntokens = { "env:MCP_TOKEN_A" = "web/alice", "env:MCP_TOKEN_B" = "web/bob" }\n'
        '[[agents]]\nid = "mix"\npackage = "mixpkg"\n'
        '[agents.mounts]\n"/data" = "data"\n'
        f'[agents.services.app]\nurl = "http://127.0.0.1:{port}"\n'
    )
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("mcp")
    redis_proc, url = start_redis(folder)
    recorder = Recorder()
    server = serve(recorder)
    deployment = _write(folder, server.server_address[1])
    env = dict(os.environ)
    env.pop("VESSEL_RESULT_BACKEND", None)
    env.update(CLUSTER_ENV)
    # A grace of 1 s puts the worker's watchdog (lease - 1 s) at the tool's own
    # limit, and it would win the race with the timeout as a cancel.
    env["VESSEL_LEASE_GRACE_SECONDS"] = "5"
    env.update(
        VESSEL_BROKER_URL=url,
        VESSEL_WORKSPACE_ROOT=str(folder / "workspaces"),
        MCP_TOKEN_A=TOKEN_A,
        MCP_TOKEN_B=TOKEN_B,
    )
    made = Cluster(
        url=url,
        deployment_path=deployment,
        env=env,
        recorder=recorder,
        workspaces=folder / "workspaces",
    )
    try:
        made.start_worker("sandbox", name="mcp-box")
        made.start_worker("service", name="mcp-svc")
        yield made
    finally:
        made.stop_all()
        server.shutdown()
        server.server_close()
        redis_proc.terminate()
        redis_proc.wait(10)


def _command(cluster: Cluster, *extra: str) -> list[str]:
    return ["-m", "workers.cli", "mcp", "mix", "-d", str(cluster.deployment_path), *extra]


@pytest.fixture(scope="module")
def http_url(cluster: Cluster) -> Iterator[str]:
    port = free_port()
    log = open(cluster.workspaces.parent / "mcp-http.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, *_command(cluster, "--http", f"127.0.0.1:{port}")],
        env=cluster.env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, (cluster.workspaces.parent / "mcp-http.log").read_text()
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise AssertionError("the MCP server did not start") from None
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(15)
    log.close()


def _stdio(cluster: Cluster, owner: str = "web/alice") -> Client:
    params = StdioServerParameters(
        command=sys.executable,
        args=_command(cluster, "--owner", owner),
        env=cluster.env,
        cwd=str(REPO),
    )
    return Client(params)


@contextlib.asynccontextmanager
async def _http(url: str, token: str = TOKEN_A) -> AsyncIterator[Client]:
    # A client given to the transport is the caller's to close.
    headers = {"Authorization": f"Bearer {token}"}
    async with contextlib.AsyncExitStack() as stack:
        http_client = await stack.enter_async_context(create_mcp_http_client(headers=headers))
        transport = streamable_http_client(url, http_client=http_client)
        yield await stack.enter_async_context(Client(transport))


def _text(result: Any) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


def _run(fn: Any) -> Any:
    return anyio.run(fn)


def _holding(cluster: Cluster, marker: str) -> list[str]:
    """Workspaces' files named `marker` (os.walk: workspaces removed meanwhile are skipped)."""
    return [
        os.path.join(folder, marker)
        for folder, _, files in os.walk(cluster.workspaces)
        if marker in files
    ]


def _gone(cluster: Cluster, marker: str, seconds: float = 15) -> bool:
    """True once no workspace holds a file named `marker` (within `seconds`)."""
    deadline = time.monotonic() + seconds
    while _holding(cluster, marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


async def _cancel_mid_call(client: Client, marker: str) -> None:
    """Starts `hold`, waits for its process, then cancels the request."""
    async with anyio.create_task_group() as group:

        async def call() -> None:
            await client.call_tool("hold", {"marker": marker})
            raise AssertionError("the call finished: it was not cancelled")

        group.start_soon(call)
        deadline = time.monotonic() + 15
        while not processes_with(marker):
            assert time.monotonic() < deadline, "the tool never started"
            await anyio.sleep(0.05)
        group.cancel_scope.cancel()


def _stopped(marker: str) -> bool:
    # hold's own limit is 10 s: gone well before it, the cancel stopped it.
    deadline = time.monotonic() + 6
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_with(marker) == []


# --- stdio ---------------------------------------------------------------------------


def test_stdio_lists_exactly_the_model_list(cluster: Cluster) -> None:
    expected = in_format(listed(load_deployment(cluster.deployment_path), "mix"), "mcp")

    async def main() -> list[dict[str, Any]]:
        async with _stdio(cluster) as client:
            tools = await client.list_tools()
            return [
                {"name": t.name, "description": t.description, "inputSchema": t.input_schema}
                for t in tools.tools
            ]

    assert _run(main) == expected


def test_stdio_calls_ok_error_refused_timeout_and_outbox(cluster: Cluster) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 7000}.125"

    async def main() -> dict[str, Any]:
        async with _stdio(cluster) as client:
            return {
                "ok": await client.call_tool("echo", {"a": 1}),
                "error": await client.call_tool("fail", {}),
                "refused": await client.call_tool("work", {"n": "not a number"}),
                "timeout": await client.call_tool("spin", {"marker": marker}),
                "outbox": await client.call_tool("outbox", {}),
                "service": await client.call_tool("work", {"n": 7}),
            }

    got = _run(main)
    assert got["ok"].is_error is False
    assert json.loads(_text(got["ok"])) == {"got": {"a": 1}}
    assert got["error"].is_error is True
    assert _text(got["error"]) == "it broke\n"
    assert got["refused"].is_error is True
    assert "n" in _text(got["refused"]) and "integer" in _text(got["refused"])
    assert got["timeout"].is_error is True
    assert "[timed out after 1 s]" in _text(got["timeout"])
    assert processes_with(marker) == []
    resources = [c for c in got["outbox"].content if c.type == "resource"]
    assert len(resources) == 1
    assert resources[0].resource.uri.endswith("/outbox/report.txt")
    assert base64.b64decode(resources[0].resource.blob) == b"hello outbox"
    service = json.loads(_text(got["service"]))
    assert service["n"] == 7 and service["owner"] == "web/alice"


def test_stdio_session_is_one_turn(cluster: Cluster) -> None:
    async def main() -> tuple[str, str]:
        async with _stdio(cluster) as client:
            await client.call_tool("ws", {"write": {"note.txt": "kept"}})
            again = await client.call_tool("ws", {"read": ["note.txt"]})
        async with _stdio(cluster) as client:
            other = await client.call_tool("ws", {"read": ["note.txt"]})
        return _text(again), _text(other)

    again, other = _run(main)
    assert json.loads(again) == {"note.txt": "kept"}
    assert json.loads(other) == {"note.txt": None}


def test_stdio_session_end_removes_its_workspace(cluster: Cluster) -> None:
    marker = f"mark-{uuid.uuid4().hex}.txt"

    async def main() -> None:
        async with _stdio(cluster) as client:
            await client.call_tool("ws", {"write": {marker: "x"}})
            assert _holding(cluster, marker), "the file is in the session's workspace"

    _run(main)
    assert _gone(cluster, marker), "the session's turn was not ended when stdin closed"


def test_stdio_progress_and_cancel(cluster: Cluster) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 7000}.625"
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))

    async def main() -> Any:
        async with _stdio(cluster) as client:
            result = await client.call_tool(
                "work", {"n": 13, "sleep": 1.6}, progress_callback=progress
            )
            await _cancel_mid_call(client, marker)
            # The session goes on after a cancelled request.
            after = await client.call_tool("echo", {"after": True})
            return result, after

    result, after = _run(main)
    assert result.is_error is False and json.loads(_text(result))["n"] == 13
    assert any(message and message.startswith("running") for _, message in seen), seen
    assert _stopped(marker)
    assert json.loads(_text(after)) == {"got": {"after": True}}


# --- streamable HTTP -----------------------------------------------------------------


def test_http_without_a_token_is_refused(http_url: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    assert httpx.post(http_url, json=body, headers=headers).status_code == 401
    wrong = {**headers, "Authorization": "Bearer not-a-token"}
    assert httpx.post(http_url, json=body, headers=wrong).status_code == 401


def test_http_lists_and_calls_as_the_tokens_owner(cluster: Cluster, http_url: str) -> None:
    expected = [
        t["name"] for t in in_format(listed(load_deployment(cluster.deployment_path), "mix"), "mcp")
    ]

    async def main() -> tuple[list[str], Any, Any]:
        async with _http(http_url, TOKEN_B) as client:
            tools = await client.list_tools()
            ok = await client.call_tool("work", {"n": 11})
            error = await client.call_tool("fail", {})
            return [t.name for t in tools.tools], ok, error

    names, ok, error = _run(main)
    assert names == expected
    assert ok.is_error is False
    assert json.loads(_text(ok))["owner"] == "web/bob"
    assert error.is_error is True and _text(error) == "it broke\n"


def test_http_progress_is_reported_while_a_call_runs(http_url: str) -> None:
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))

    async def main() -> Any:
        async with _http(http_url) as client:
            return await client.call_tool(
                "work", {"n": 12, "sleep": 1.6}, progress_callback=progress
            )

    result = _run(main)
    assert result.is_error is False
    assert seen, "no progress notification arrived"
    assert any(message and message.startswith("running") for _, message in seen)
    values = [value for value, _ in seen]
    assert values == sorted(values)


def test_http_cancel_mid_call_stops_the_tool(http_url: str) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 7000}.375"

    async def main() -> None:
        async with _http(http_url) as client:
            await _cancel_mid_call(client, marker)

    _run(main)
    assert _stopped(marker)


def test_http_calls_refused_arguments_timeout_and_outbox(http_url: str) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 7000}.875"

    async def main() -> dict[str, Any]:
        async with _http(http_url) as client:
            return {
                "refused": await client.call_tool("work", {"n": "not a number"}),
                "timeout": await client.call_tool("spin", {"marker": marker}),
                "outbox": await client.call_tool("outbox", {}),
            }

    got = _run(main)
    assert got["refused"].is_error is True
    assert "n" in _text(got["refused"]) and "integer" in _text(got["refused"])
    assert got["timeout"].is_error is True
    assert "[timed out after 1 s]" in _text(got["timeout"])
    assert processes_with(marker) == []
    resources = [c for c in got["outbox"].content if c.type == "resource"]
    assert [base64.b64decode(r.resource.blob) for r in resources] == [b"hello outbox"]


def test_http_an_unknown_tool_is_a_protocol_error(http_url: str) -> None:
    from mcp.shared.exceptions import MCPError

    async def main() -> None:
        async with _http(http_url) as client:
            with pytest.raises(MCPError, match="unknown tool 'nope'"):
                await client.call_tool("nope", {})

    _run(main)


def test_http_session_end_removes_its_workspace(cluster: Cluster, http_url: str) -> None:
    marker = f"mark-{uuid.uuid4().hex}.txt"

    async def main() -> None:
        # The SDK's client ends its session (HTTP DELETE) when it closes.
        async with _http(http_url) as client:
            await client.call_tool("ws", {"write": {marker: "x"}})
            assert _holding(cluster, marker), "the file is in the session's workspace"

    _run(main)
    assert _gone(cluster, marker), "the session's turn was not ended by its DELETE"


def test_http_sessions_have_separate_workspaces(http_url: str) -> None:
    async def main() -> tuple[str, str, str]:
        async with _http(http_url) as first, _http(http_url) as second:
            await first.call_tool("ws", {"write": {"mine.txt": "first's"}})
            in_second = await second.call_tool("ws", {"read": ["mine.txt"]})
            in_first = await first.call_tool("ws", {"read": ["mine.txt"]})
            await second.call_tool("ws", {"write": {"mine.txt": "second's"}})
            first_again = await first.call_tool("ws", {"read": ["mine.txt"]})
        return _text(in_second), _text(in_first), _text(first_again)

    in_second, in_first, first_again = _run(main)
    assert json.loads(in_second) == {"mine.txt": None}
    assert json.loads(in_first) == {"mine.txt": "first's"}
    assert json.loads(first_again) == {"mine.txt": "first's"}
