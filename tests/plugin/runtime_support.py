"""Builders for the runtime tests: a deployment with one plugin, published for real
(the sources run in the confined runtime and the lock is written), and a small real
`HostBridge` that answers a few chains the way the worker's bridge does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from broker.loading import load_deployment
from broker.model import Agent, Deployment, PluginTool
from broker.request import Initiator, new_call_id
from broker.result import ToolResult
from workers.commands.check import publish_plugins
from workers.plugin.host.context import HostContext, HostFailed, HostRefused
from workers.plugin.runner import PluginRunner

FIELD_GUIDE = Path(__file__).resolve().parents[2] / "examples" / "field-guide"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


class Bridge:
    """A real, small HostBridge: settings.get/all, log.*, echo.back, slow.wait; permissions checked.

    `secret` is a settings value the runner must redact from results.
    """

    def __init__(self, settings: Mapping[str, Any] | None = None, secret: str = "") -> None:
        self.settings = dict(settings or {})
        self.secret = secret
        self.calls: list[tuple[str, str, list[Any]]] = []
        self.written: list[Any] = []
        self.fetch_body = ""
        self._logs: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def call(self, context: HostContext, chain: str, args: list[Any]) -> Any:
        with self._lock:
            self.calls.append((context.call_id, chain, args))
        permission = "host:" + chain.replace(".", ":")
        if permission not in context.plugin.permissions:
            raise HostRefused(f"host.{chain}: the plugin has no permission {permission}")
        if chain == "settings.get":
            if args and args[0] == "secret":
                return self.secret
            return self.settings.get(str(args[0])) if args else None
        if chain == "settings.all":
            return self.settings
        if chain.startswith("log."):
            with self._lock:
                self._logs.setdefault(context.call_id, []).append(
                    {"level": chain[4:], "message": str(args[0] if args else "")}
                )
            return None
        if chain == "echo.back":
            return args
        if chain == "fetch":
            # A stand-in forecast service's answer (the real fetch is the worker's).
            return {"status": 200, "headers": {}, "body": self.fetch_body}
        if chain == "workspace.write":
            with self._lock:
                self.written.append(args[0])
            return None
        if chain == "fail.now":
            raise HostFailed("host.fail.now: it failed, as asked")
        raise HostRefused(f"host.{chain}: not available in this test bridge")

    def logs(self, call_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return self._logs.pop(call_id, [])

    def secrets(self, plugin: str) -> list[str]:
        return [self.secret] if len(self.secret) >= 8 else []

    def close(self) -> None:
        pass


def write_plugin(root: Path, slug: str, sources: Mapping[str, str], toml_extra: str = "") -> Path:
    folder = root / slug
    for name, text in sources.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    names = ", ".join(f'"{n}"' for n in sources)
    (folder / "plugin.toml").write_text(f'slug = "{slug}"\nsources = [{names}]\n{toml_extra}')
    return folder


def write_deployment(root: Path, slugs: list[str], agent_extra: str = "") -> Path:
    text = "".join(f'[[plugins]]\npackage = "{s}"\n' for s in slugs)
    text += f'[[agents]]\nid = "guide"\npackage = "{FIELD_GUIDE}"\n{agent_extra}'
    path = root / "deployment.toml"
    path.write_text(text)
    return path


def published(
    root: Path, slug: str, sources: Mapping[str, str], toml_extra: str = ""
) -> Deployment:
    """A deployment with one plugin, checked by the publish check and loaded from its lock."""
    write_plugin(root, slug, sources, toml_extra)
    path = write_deployment(root, [slug])
    problems, _warnings, _failed = publish_plugins(path, None)
    assert not problems, [str(p) for p in problems]
    return load_deployment(path)


class Calls:
    """Runs calls of one deployment's plugin tools through one PluginRunner."""

    def __init__(self, deployment: Deployment, runner: PluginRunner) -> None:
        self.deployment = deployment
        self.runner = runner
        self.agent: Agent = deployment.agent("guide")

    def tool(self, name: str) -> PluginTool:
        tool = self.agent.tool(name)
        assert isinstance(tool, PluginTool)
        return tool

    def __call__(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        initiator: Initiator | None = None,
        call_id: str | None = None,
        cancel: threading.Event | None = None,
    ) -> ToolResult:
        return self.runner.run(
            call_id=call_id or new_call_id(),
            agent=self.agent,
            tool=self.tool(name),
            arguments=arguments or {},
            owner="web/alice",
            turn=None,
            initiator=initiator or Initiator(),
            cancel=cancel,
        )


@contextmanager
def running(deployment: Deployment, bridge: Bridge | None = None) -> Iterator[Calls]:
    runner = PluginRunner(deployment, bridge or Bridge())
    try:
        yield Calls(deployment, runner)
    finally:
        runner.close()
