"""Builders for the host API tests: a plugin, an agent, a call's HostContext, a real
HTTP server on 127.0.0.1 that records what it received.

Built straight from the `broker.model` dataclasses, so these tests need no
JS runtime: they cross `PluginHost.call` exactly as the runtime's pipe does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from broker.model import Agent, AgentSettings, Deployment, Platform, Plugin, PluginTool
from broker.request import Initiator
from workers.plugin.host import HostContext, PluginHost
from workers.sandbox.workspace import WorkspaceStore

ALL_PERMISSIONS = (
    "host:fetch",
    "host:settings:get",
    "host:settings:all",
    "host:crypto:randomUUID",
    "host:crypto:randomBytes",
    "host:crypto:digest",
    "host:log:debug",
    "host:log:info",
    "host:log:warn",
    "host:log:error",
    "host:workspace:read",
    "host:workspace:write",
    "host:workspace:list",
    "host:workspace:delete",
    "host:session:post",
    "host:session:llm",
    "host:license",
    "host:llm",
    "host:agents:create",
)


def make_plugin(
    *,
    slug: str = "weather",
    egress: tuple[str, ...] = (),
    private_egress: tuple[str, ...] = (),
    permissions: tuple[str, ...] = ALL_PERMISSIONS,
    settings: Mapping[str, Any] | None = None,
) -> Plugin:
    tool = PluginTool(
        name=f"{slug}__get_forecast",
        description="Get tomorrow's temperature range.",
        parameters={"type": "object", "properties": {}},
        scope="tools:read",
        timeout_seconds=30.0,
        source=Path("plugin.lock.json"),
        plugin=slug,
        key="get_forecast",
        memory_limit_mb=128,
        permissions=permissions,
    )
    return Plugin(
        slug=slug,
        package_dir=Path("/plugins") / slug,
        sources=("src/weather.ts",),
        sources_sha256={"src/weather.ts": "0" * 64},
        settings=dict(settings or {}),
        private_egress=private_egress,
        egress=egress,
        permissions=permissions,
        timeout_seconds=30.0,
        memory_limit_mb=128,
        tools={tool.name: tool},
        lock_path=Path("/plugins") / slug / "plugin.lock.json",
    )


def make_agent(plugins: tuple[Plugin, ...], *, disk_limit_mb: int = 256) -> Agent:
    settings = AgentSettings(
        workdir="/data",
        tool_timeout_seconds=30.0,
        tool_output_chars=20_000,
        disk_limit_mb=disk_limit_mb,
        memory_limit_mb=512,
    )
    tools = {name: t for p in plugins for name, t in p.tools.items()}
    return Agent(
        id="field-guide",
        package_dir=Path("/agents/field-guide"),
        settings=settings,
        tools=tools,
        mounts={},
        grants={},
        max_concurrent_calls=4,
    )


@dataclass
class HostSetup:
    host: PluginHost
    plugin: Plugin
    agent: Agent
    workspaces: WorkspaceStore | None

    def context(
        self,
        *,
        turn: str | None = "turn-1",
        seconds: float = 10.0,
        call_id: str = "call-1",
        initiator: Initiator | None = None,
        cancel: threading.Event | None = None,
        plugin: Plugin | None = None,
    ) -> HostContext:
        plugin = plugin or self.plugin
        return HostContext(
            call_id=call_id,
            agent=self.agent,
            tool=next(iter(plugin.tools.values())),
            plugin=plugin,
            owner="web/alice",
            turn=turn,
            initiator=initiator or Initiator(),
            deadline=time.monotonic() + seconds,
            cancel=cancel or threading.Event(),
        )

    def call(self, chain: str, *args: Any, **context: Any) -> Any:
        return self.host.call(self.context(**context), chain, list(args))

    def workspace(self, turn: str = "turn-1") -> Path:
        assert self.workspaces is not None
        return self.workspaces.for_turn(self.agent.id, turn)


@contextmanager
def host_setup(
    plugin: Plugin,
    *,
    workspace_root: Path | None = None,
    platform: Platform | None = None,
    environ: Mapping[str, str] | None = None,
    disk_limit_mb: int = 256,
) -> Iterator[HostSetup]:
    agent = make_agent((plugin,), disk_limit_mb=disk_limit_mb)
    deployment = Deployment(
        path=Path("deployment.toml"),
        agents={agent.id: agent},
        plugins={plugin.slug: plugin},
        platform=platform,
    )
    workspaces = WorkspaceStore(workspace_root) if workspace_root is not None else None
    host = PluginHost(deployment, workspaces=workspaces, environ=environ or {})
    try:
        yield HostSetup(host=host, plugin=plugin, agent=agent, workspaces=workspaces)
    finally:
        host.close()


# --- a real HTTP server ---------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Route = Callable[["Handler"], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(
            Seen(
                method=self.command,
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
        )
        route = self.server.routes.get(self.path.split("?")[0])
        if route is None:
            self.reply(404, b"no route")
            return
        route(self)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def reply(
        self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_response(status)
        merged = {"Content-Length": str(len(body)), **(headers or {})}
        for name, value in merged.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.routes: dict[str, Route] = {}
        self.seen: list[Seen] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that stopped reading (too large) is expected here

    def answer(
        self, path: str, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> None:
        self.routes[path] = lambda h: h.reply(status, body, headers)


@contextmanager
def http_server() -> Iterator[Server]:
    server = Server()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
