"""Fixtures for the service caller: real HTTP servers on 127.0.0.1, no mocked transport.

- `http_server`: a threaded stdlib server; a test routes paths to small handler
  functions and reads back every request as the server received it.
- `raw_server`: a factory of raw TCP servers for the misbehaving ones (drip,
  never answer, reset, lie about Content-Length); each connection runs a
  function given the socket.
- `make_caller`: builds Agent / ServiceTool / Grant / Deployment directly from
  the `broker.model` dataclasses and a `ServiceCaller` over them; closes them all.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.model import Agent, AgentSettings, Deployment, Grant, ServiceTool
from broker.result import ToolResult
from workers.service import ServiceCaller

TOKEN = "s3cr3t-token-0123456789"

#: How far past the moment a call must stop (its limit, its cancel) a test lets it
#: run. The tests prove a call ends then and not when the hostile server would let
#: it (it holds on for 30 s) nor at a longer limit (5 or 10 s): the slack is well
#: below those, and well above the scheduling delays of a loaded 2-core machine.
SLACK_SECONDS = 3.0


def timed(fn: Callable[[], ToolResult]) -> tuple[ToolResult, float]:
    """`fn()` and the seconds it took."""
    started = time.monotonic()
    result = fn()
    return result, time.monotonic() - started


class CancelAfter(threading.Event):
    """A cancel flag set `seconds` from now; `set_at` says when it was set."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.set_at: float | None = None
        threading.Timer(seconds, self._fire).start()

    def _fire(self) -> None:
        self.set_at = time.monotonic()
        self.set()

    def stopped_within(self, seconds: float) -> bool:
        """True if the flag was set and the call returned (now) within `seconds` of it."""
        return self.set_at is not None and time.monotonic() - self.set_at < seconds


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    header_items: list[tuple[str, str]]
    body: bytes


Route = Callable[["_Handler"], None]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.received.append(
            Received(
                method=self.command,
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                header_items=list(self.headers.items()),
                body=body,
            )
        )
        self.request_body = body
        route = self.server.routes.get(self.path.split("?")[0])
        if route is None:
            self.reply(404, b"no route")
            return
        route(self)

    do_POST = _handle
    do_GET = _handle

    def reply(
        self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's listen backlog is 5: tests open 20 connections at once, and a
    # connect past a full backlog has its SYN dropped and retried a second later
    # (twice, under load, is longer than a test's barrier waits).
    request_queue_size = 64

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Route] = {}
        self.received: list[Received] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that stopped reading (too large, timeout) is expected here

    def route(self, path: str, fn: Route) -> None:
        self.routes[path] = fn

    def answer(
        self, path: str, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> None:
        """Route `path` to a fixed answer."""
        self.route(path, lambda h: h.reply(status, body, headers))


@pytest.fixture
def http_server() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class RawServer:
    """Accepts connections and runs `handler(conn, server)` for each on its own thread."""

    def __init__(self, handler: Callable[[socket.socket, RawServer], None]) -> None:
        self.handler = handler
        self.stopped = threading.Event()
        self.connections = 0
        #: The clients' addresses, in the order their connections were accepted.
        self.peers: list[tuple[str, int]] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.sent = 0
        #: Set when a connection's handler has returned (its client went away, or it ended).
        self.handler_ended = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self.peers.append(peer)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        # OSError: the client went away, which is often the point of the test.
        try:
            with conn, contextlib.suppress(OSError):
                self.handler(conn, self)
        finally:
            self.handler_ended.set()

    @staticmethod
    def read_request(conn: socket.socket) -> tuple[bytes, bytes]:
        return read_request(conn)

    def connections_before_probe(self) -> int:
        """How many connections reached this server before now, counted for sure.

        Connects once more and waits until the accept thread has taken that
        probe: connections are accepted in the order they came, so every earlier
        one has been accepted by then, with no sleep that hopes it was long enough.
        """
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as probe:
            mine = probe.getsockname()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with self._lock:
                    if mine in self.peers:
                        return self.peers.index(mine)
                time.sleep(0.01)
        raise AssertionError("the probe connection was never accepted")

    def count_sent(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


def read_request(conn: socket.socket) -> tuple[bytes, bytes]:
    """Read one request: (head, body), the body as long as its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket, RawServer], None]], RawServer]]:
    made: list[RawServer] = []

    def create(handler: Callable[[socket.socket, RawServer], None]) -> RawServer:
        server = RawServer(handler)
        made.append(server)
        return server

    yield create
    for server in made:
        server.close()


@dataclass
class Setup:
    caller: ServiceCaller
    agent: Agent
    tool: ServiceTool
    deployment: Deployment
    tools: dict[str, ServiceTool] = field(default_factory=dict)

    def call(
        self,
        arguments: dict[str, Any] | None = None,
        *,
        owner: str = "web/alice",
        tool: str | None = None,
        cancel: threading.Event | None = None,
        call_id: str = "c-1",
    ) -> ToolResult:
        return self.caller.call(
            call_id=call_id,
            agent=self.agent,
            tool=self.tools[tool] if tool else self.tool,
            arguments={"id": "A-1042"} if arguments is None else arguments,
            owner=owner,
            cancel=cancel,
        )


def build_deployment(
    *,
    url: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
    output_chars: int = 20_000,
    path: str = "/agent-tools/lookup",
    agent_id: str = "records-agent",
    service: str = "records",
    tool_name: str = "lookup",
    extra_agents: Mapping[str, Mapping[str, str]] | None = None,
) -> Deployment:
    """A deployment with one agent granted one service, built from the dataclasses."""
    settings = AgentSettings(
        workdir="/data",
        tool_timeout_seconds=timeout,
        tool_output_chars=output_chars,
        disk_limit_mb=256,
        memory_limit_mb=512,
    )
    tool = ServiceTool(
        name=tool_name,
        description="Look up a record by its id.",
        parameters={"type": "object", "properties": {"id": {"type": "string"}}},
        scope="tools:read",
        timeout_seconds=timeout,
        source=Path("tools/lookup.toml"),
        service=service,
        path=path,
    )
    grant_headers = {"X-Internal-Token": TOKEN} if headers is None else dict(headers)
    agents = {
        agent_id: Agent(
            id=agent_id,
            package_dir=Path("agents/records"),
            settings=settings,
            tools={tool.name: tool},
            mounts={},
            grants={service: Grant(name=service, url=url, headers=grant_headers)},
            max_concurrent_calls=16,
        )
    }
    for other_id, other_headers in (extra_agents or {}).items():
        agents[other_id] = Agent(
            id=other_id,
            package_dir=Path("agents/other"),
            settings=settings,
            tools={tool.name: tool},
            mounts={},
            grants={service: Grant(name=service, url=url, headers=dict(other_headers))},
            max_concurrent_calls=16,
        )
    return Deployment(path=Path("deployment.toml"), agents=agents)


@pytest.fixture
def make_caller() -> Iterator[Callable[..., Setup]]:
    made: list[ServiceCaller] = []

    def create(
        url: str,
        *,
        environ: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        **kwargs: Any,
    ) -> Setup:
        deployment = build_deployment(url=url, **kwargs)
        agent_id = kwargs.get("agent_id", "records-agent")
        caller = ServiceCaller(
            deployment, agents=[agent_id], environ=environ or {}, transport=transport
        )
        made.append(caller)
        agent = deployment.agents[agent_id]
        tools = {name: t for name, t in agent.tools.items() if isinstance(t, ServiceTool)}
        return Setup(
            caller=caller,
            agent=agent,
            tool=next(iter(tools.values())),
            deployment=deployment,
            tools=tools,
        )

    yield create
    for caller in made:
        caller.close()


@pytest.fixture
def token() -> str:
    """The literal X-Internal-Token value `make_caller` grants by default."""
    return TOKEN


@pytest.fixture
def deployment_factory() -> Callable[..., Deployment]:
    """`build_deployment`, for tests that construct a `ServiceCaller` themselves."""
    return build_deployment
