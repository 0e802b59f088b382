"""`deployment.toml`: the agents, each with its package, mounts and service grants;
the plugins installed for every agent (`plugins.py`) and `[platform]` (`platform.py`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from broker.constants import AGENT_ID_PATTERN, DEFAULT_MAX_CONCURRENT_CALLS
from broker.loading.access import read_access
from broker.loading.fields import Problems, Table, field_path, type_name
from broker.loading.grants import read_grant
from broker.loading.host_folders import exposed_folder_problem
from broker.loading.limits import MAX_CONCURRENT_CALLS
from broker.loading.mcp import read_mcp
from broker.loading.mounts import read_mounts
from broker.loading.package import PACKAGE_FILE, Package, load_package
from broker.loading.platform import read_platform
from broker.loading.plugins import load_plugin, read_plugin_entries
from broker.loading.toml_file import read_toml
from broker.model import Agent, Deployment, Grant, Plugin, ServiceTool, Tool

__all__ = ["AGENT_KEYS", "DEPLOYMENT_KEYS", "read_deployment"]

DEPLOYMENT_KEYS = frozenset({"agents", "plugins", "platform", "mcp"})
AGENT_KEYS = frozenset(
    {"id", "package", "max_concurrent_calls", "mounts", "services", "access", "max_listed_tools"}
)


def read_deployment(
    path: Path, problems: Problems, *, lock_dir: Path | None = None
) -> Deployment | None:
    """The deployment at `path`; None when anything in it or its packages is wrong.

    `lock_dir`: where the plugins' locks are (`<lock_dir>/<slug>.lock.json`);
    None: each plugin's own folder (`plugin.lock.json`).
    """
    shown = str(path)
    data = read_toml(path, shown=shown, problems=problems)
    if data is None:
        return None
    top = Table(data, file=shown, where="", keys=DEPLOYMENT_KEYS, problems=problems)
    platform = read_platform(top)
    mcp = read_mcp(top)
    plugins: dict[str, Plugin] = {}
    for entry in read_plugin_entries(top, path) or ():
        plugin = load_plugin(entry, deployment=path, lock_dir=lock_dir, problems=problems)
        if plugin is not None:
            plugins[plugin.slug] = plugin
    if not top.has("agents"):
        top.problem("agents", "missing: declare at least one [[agents]] entry")
        return None
    entries = top.data["agents"]
    if not isinstance(entries, list):
        top.problem("agents", f"must be a list of tables ([[agents]]), not {type_name(entries)}")
        return None
    bad = [(i, e) for i, e in enumerate(entries) if not isinstance(e, dict)]
    for index, entry in bad:
        where = field_path("agents", index)
        problems.add(shown, where, f"must be a table ([[agents]]), not {type_name(entry)}")
    if bad:
        return None
    if not entries:
        top.problem("agents", "must declare at least one agent")
        return None
    # One package may serve several agents: load it once, report its problems once.
    packages: dict[Path, Package | None] = {}
    agents: dict[str, Agent] = {}
    ids: dict[str, int] = {}
    for index, entry in enumerate(entries):
        table = Table(
            entry,
            file=shown,
            where=field_path("agents", index),
            keys=AGENT_KEYS,
            problems=problems,
        )
        agent = _read_agent(table, path=path, ids=ids, index=index, packages=packages)
        if agent is not None:
            agent = _with_plugins(table, agent, plugins)
            # Access names final names: read once the agent has every tool.
            access = read_access(table, agent)
            if access is not None:
                agents[agent.id] = replace(agent, access=access)
    if problems:
        return None
    return Deployment(path=path, agents=agents, plugins=plugins, platform=platform, mcp=mcp)


def _with_plugins(table: Table, agent: Agent, plugins: dict[str, Plugin]) -> Agent:
    """`agent` with every plugin's tools after its package's, in `[[plugins]]` order."""
    if not plugins:
        return agent
    tools: dict[str, Tool] = dict(agent.tools)
    for plugin in plugins.values():
        for name, tool in plugin.tools.items():
            if name in tools:
                table.problem(
                    "package",
                    f"its tool {name!r} ({tools[name].source}) has the final name of plugin "
                    f"{plugin.slug!r}'s tool {tool.key!r} ({tool.source})",
                )
                continue
            tools[name] = tool
    return Agent(
        id=agent.id,
        package_dir=agent.package_dir,
        settings=agent.settings,
        tools=tools,
        mounts=agent.mounts,
        grants=agent.grants,
        max_concurrent_calls=agent.max_concurrent_calls,
    )


def _read_agent(
    table: Table,
    *,
    path: Path,
    ids: dict[str, int],
    index: int,
    packages: dict[Path, Package | None],
) -> Agent | None:
    found = len(table.problems)
    base = path.parent
    agent_id = table.string("id", required=True)
    if agent_id is not None:
        if not AGENT_ID_PATTERN.fullmatch(agent_id):
            table.problem(
                "id",
                f"{agent_id!r} is not lowercase letters, digits and hyphens starting with a "
                "letter, up to 63 characters",
            )
        elif agent_id in ids:
            table.problem("id", f"{agent_id!r} is already the id of agents[{ids[agent_id]}]")
        else:
            ids[agent_id] = index
    max_calls = table.positive_int(
        "max_concurrent_calls", default=DEFAULT_MAX_CONCURRENT_CALLS, maximum=MAX_CONCURRENT_CALLS
    )
    package_dir, package = _read_package(table, path, packages)
    mounts = read_mounts(table, base, path.resolve())
    grants = _read_grants(table)
    if package is not None and grants is not None:
        _match_services(table, package, grants)
    if (
        len(table.problems) > found
        # A package shared with an earlier agent had its problems reported there.
        or package is None
        or package_dir is None
        or agent_id is None
        or max_calls is None
        or mounts is None
        or grants is None
    ):
        return None
    return Agent(
        id=agent_id,
        package_dir=package_dir,
        settings=package.settings,
        tools=dict(package.tools),
        mounts=mounts,
        grants=grants,
        max_concurrent_calls=max_calls,
    )


def _read_package(
    table: Table, path: Path, packages: dict[Path, Package | None]
) -> tuple[Path | None, Package | None]:
    package = table.string("package", required=True)
    if package is None:
        return None, None
    folder = path.parent / package
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        table.problem("package", f"{str(folder)!r} {what}")
        return None, None
    resolved = folder.resolve()
    # The package is bound at /agent: whatever it holds, a tool can read.
    exposed = exposed_folder_problem(resolved, path.resolve())
    if exposed is not None:
        table.problem("package", f"{package!r} {exposed}")
        return None, None
    if not (folder / PACKAGE_FILE).is_file():
        table.problem("package", f"{str(folder)!r} has no {PACKAGE_FILE}")
        return None, None
    if resolved not in packages:
        packages[resolved] = load_package(folder, shown=str(folder), problems=table.problems)
    return resolved, packages[resolved]


def _read_grants(table: Table) -> dict[str, Grant] | None:
    if not table.has("services"):
        return {}
    raw = table.mapping("services")
    if raw is None:
        return None
    found = len(table.problems)
    grants: dict[str, Grant] = {}
    for name in raw:
        grant = read_grant(table, name)
        if grant is not None:
            grants[name] = grant
    if len(table.problems) > found:
        return None
    return grants


def _match_services(table: Table, package: Package, grants: dict[str, Grant]) -> None:
    """Seed 001: the services the tools name and the grants match exactly."""
    used: dict[str, ServiceTool] = {}
    for tool in package.tools.values():
        if isinstance(tool, ServiceTool):
            used.setdefault(tool.service, tool)
    services = table.field("services")
    for service, tool in used.items():
        if service not in grants:
            table.problems.add(
                table.file,
                field_path(services, service),
                f"missing grant: tool {tool.name!r} ({tool.source}) uses service {service!r}",
            )
    for service in grants:
        if service not in used:
            table.problems.add(
                table.file,
                field_path(services, service),
                f"unused grant: no tool of the package uses service {service!r}",
            )
