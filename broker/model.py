"""The loaded deployment: frozen values built once by `broker.loading`.

A worker looks every call up in its own copy of these; a message never carries
a command line or a URL (DESIGN.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from broker.constants import (
    DEFAULT_CPU_LIMIT,
    DEFAULT_MAX_ARGUMENT_BYTES,
    DEFAULT_MAX_LISTED_TOOLS,
    DEFAULT_WORKSPACE_FILES,
    DEFAULT_WORKSPACE_LIMIT_MB,
)
from broker.errors import UnknownAgent, UnknownTool

__all__ = [
    "Access",
    "Agent",
    "AgentSettings",
    "DeclaredTool",
    "Deployment",
    "Grant",
    "InputMode",
    "McpSettings",
    "Platform",
    "Plugin",
    "PluginTool",
    "ServiceTool",
    "Tool",
]

InputMode = Literal["json-stdin", "args"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentSettings:
    """The agent settings at the top of `vessel.toml` (defaults in `broker.constants`)."""

    workdir: str
    tool_timeout_seconds: float
    tool_output_chars: int
    disk_limit_mb: int
    memory_limit_mb: int
    #: The turn's whole workspace, in MB, and its files (every entry): a watchdog
    #: stops the call past either (`workers.sandbox.watchdog`).
    workspace_limit_mb: int = DEFAULT_WORKSPACE_LIMIT_MB
    workspace_files: int = DEFAULT_WORKSPACE_FILES
    #: Cores per call (a cgroup CPU quota), and timeout x cpu_limit CPU seconds
    #: per process (RLIMIT_CPU): `workers.sandbox.limits`.
    cpu_limit: float = DEFAULT_CPU_LIMIT
    #: The largest arguments a call may be given (compact JSON, UTF-8 bytes).
    max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES


@dataclass(frozen=True, kw_only=True, slots=True)
class _ToolBase:
    name: str
    description: str
    parameters: Mapping[str, Any]
    scope: str
    timeout_seconds: float
    #: The tool file, for error messages.
    source: Path
    #: Kept out of the agent's list, found with `search_tools` (a pin lists it).
    deferred: bool = False
    #: Listed even when the agent has more tools than `max_listed_tools`.
    always_listed: bool = False

    def listing(self) -> dict[str, Any]:
        """What the model is given: name, description, parameters."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class DeclaredTool(_ToolBase):
    """A command the sandbox runs; `command` already has `{package}` replaced."""

    command: tuple[str, ...]
    input: InputMode

    kind: Literal["sandbox"] = "sandbox"


@dataclass(frozen=True, kw_only=True, slots=True)
class ServiceTool(_ToolBase):
    """An HTTP POST to `service`'s granted URL + `path`."""

    service: str
    path: str

    kind: Literal["service"] = "service"


@dataclass(frozen=True, kw_only=True, slots=True)
class PluginTool(_ToolBase):
    """A plugin's registered tool. `name` is the final name `<slug>__<key>`.

    `timeout_seconds` (from `_ToolBase`) is 30 s or the raised floor (seed 002
    "Limits"), the same for every tool of one plugin.
    """

    #: The plugin's slug.
    plugin: str
    #: The registry key, e.g. "get_forecast".
    key: str
    #: The call's memory limit in MB (128, or the raised floor).
    memory_limit_mb: int
    #: The plugin's derived permissions (the same for all its tools).
    permissions: tuple[str, ...]

    kind: Literal["plugin"] = "plugin"


Tool = DeclaredTool | ServiceTool | PluginTool


@dataclass(frozen=True, kw_only=True, slots=True)
class Plugin:
    """One `[[plugins]]` entry with its `plugin.toml` and `plugin.lock.json` loaded."""

    slug: str
    #: Host folder holding plugin.toml.
    package_dir: Path
    #: Relative paths inside `package_dir`, run in this order.
    sources: tuple[str, ...]
    #: Source path -> sha256 hex, as the lock records them.
    sources_sha256: Mapping[str, str]
    #: As written; str values may be "env:NAME" (resolved only by plugin workers).
    settings: Mapping[str, Any]
    #: "host:port" entries from deployment.toml: the only private addresses host.fetch may reach.
    private_egress: tuple[str, ...]
    #: manifest.egress entries ("host" or "host:port").
    egress: tuple[str, ...]
    #: Derived from the sources, sorted, e.g. ("host:fetch", "host:workspace:write").
    permissions: tuple[str, ...]
    timeout_seconds: float
    memory_limit_mb: int
    #: Final name -> tool, in registration order.
    tools: Mapping[str, PluginTool]
    lock_path: Path

    def __repr__(self) -> str:
        # Settings values may be literal secrets: never print them.
        return (
            f"Plugin(slug={self.slug!r}, package_dir={str(self.package_dir)!r}, "
            f"settings={sorted(self.settings)!r}, tools={list(self.tools)!r}, "
            f"permissions={list(self.permissions)!r})"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class McpSettings:
    """The deployment's `[mcp]`: bearer tokens of `vessel-workers mcp --http`.

    `tokens` pairs the NAME of each `env:NAME` (the variable holding one token)
    with the owner its calls run as; the tokens themselves are read only where
    the MCP server starts.
    """

    tokens: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Platform:
    """The deployment's `[platform]`: where host namespaces owned by the platform go.

    Values as written (`env:NAME` unresolved); only plugin workers resolve them.
    """

    url: str
    headers: Mapping[str, str]

    def __repr__(self) -> str:
        # The URL and header values may carry secrets: never print them.
        return f"Platform(url=<hidden>, headers={sorted(self.headers)!r})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Grant:
    """A deployment's grant of one service, values as written (`env:NAME` unresolved).

    Resolution happens only in service workers (`workers.service.secrets`).
    """

    name: str
    url: str
    headers: Mapping[str, str]

    def __repr__(self) -> str:
        # Header values may be literal secrets: never print them.
        return f"Grant(name={self.name!r}, url=<hidden>, headers={sorted(self.headers)!r})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Access:
    """An agent's `[agents.access]` and `max_listed_tools`, names already checked.

    `tools` None is "all"; otherwise the final names the agent may use. A name
    outside `tools`, or in `deny`, is neither listed, searchable nor callable.
    """

    tools: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()
    pin: frozenset[str] = frozenset()
    max_listed_tools: int = DEFAULT_MAX_LISTED_TOOLS

    def refusal(self, name: str) -> str | None:
        """Why the agent may not use its tool `name`, or None."""
        if name in self.deny:
            return "[agents.access] deny names it"
        if self.tools is not None and name not in self.tools:
            return "it is not in [agents.access] tools"
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Agent:
    """One `[[agents]]` entry with its package loaded."""

    id: str
    #: Host folder of the agent package, mounted read-only at /agent.
    package_dir: Path
    settings: AgentSettings
    tools: Mapping[str, Tool]
    #: Sandbox path -> host folder, mounted read-only.
    mounts: Mapping[str, Path]
    grants: Mapping[str, Grant]
    #: Calls of this agent that may run at once, across all workers and hosts.
    max_concurrent_calls: int
    access: Access = field(default_factory=Access)

    def tool(self, name: str) -> Tool:
        """The tool the agent may call as `name`; UnknownTool if none (or access denies it)."""
        found = self.tools.get(name)
        if found is None:
            known = ", ".join(sorted(self.usable())) or "none"
            raise UnknownTool(f"agent {self.id!r} has no tool {name!r} (its tools: {known})")
        refusal = self.access.refusal(name)
        if refusal is not None:
            raise UnknownTool(f"agent {self.id!r} may not call tool {name!r}: {refusal}")
        return found

    def usable(self) -> list[str]:
        """The final names the agent may call, in catalogue order (access applied)."""
        return [name for name in self.tools if self.access.refusal(name) is None]

    def catalogue(self) -> list[dict[str, Any]]:
        """Every tool the agent may call, in catalogue order, before the list's limit
        and flags apply (`broker.catalogue` gives the list the model is given)."""
        return [self.tools[name].listing() for name in self.usable()]


@dataclass(frozen=True, kw_only=True, slots=True)
class Deployment:
    """A validated `deployment.toml` with every agent loaded."""

    path: Path
    agents: Mapping[str, Agent] = field(default_factory=dict)
    #: Slug -> plugin, in `[[plugins]]` order; installed for every agent.
    plugins: Mapping[str, Plugin] = field(default_factory=dict)
    platform: Platform | None = None
    mcp: McpSettings | None = None

    def agent(self, agent_id: str) -> Agent:
        try:
            return self.agents[agent_id]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise UnknownAgent(f"{self.path}: no agent {agent_id!r} (agents: {known})") from None
