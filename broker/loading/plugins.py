"""`[[plugins]]` in deployment.toml: plugins installed for every agent of the deployment.

    [[plugins]]
    package = "plugins/weather"          # relative to the deployment; holds plugin.toml
    private_egress = ["127.0.0.1:8123"]  # the only private addresses host.fetch may reach
    [plugins.settings]                   # str, int, float or bool; strings may be env:NAME
    units = "metric"
    api_key = "env:WEATHER_KEY"

Each plugin's registry comes from its `plugin.lock.json` (`lock.py`), never
from running its sources: loading never runs JavaScript.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.constants import BUILTIN_TOOLS, DEFAULT_SCOPE
from broker.loading.egress import private_egress_problem
from broker.loading.fields import Problems, Table, field_path, type_name
from broker.loading.grants import ENV_PREFIX, env_problem
from broker.loading.lock import lock_path, read_lock, sources_sha256, stale_reason
from broker.loading.plugin import (
    PLUGIN_FILE,
    PluginFile,
    limit_problems,
    plugin_limits,
    read_plugin_file,
)
from broker.model import Plugin, PluginTool

__all__ = [
    "PLUGIN_ENTRY_KEYS",
    "PluginEntry",
    "check_command",
    "load_plugin",
    "read_plugin_entries",
]

PLUGIN_ENTRY_KEYS = frozenset({"package", "settings", "private_egress"})


@dataclass(frozen=True, kw_only=True, slots=True)
class PluginEntry:
    """One `[[plugins]]` entry with its plugin.toml read (the lock not yet)."""

    where: str
    plugin_file: PluginFile
    settings: Mapping[str, Any]
    private_egress: tuple[str, ...]


def check_command(deployment: Path) -> str:
    """The command that writes the locks of `deployment`'s plugins."""
    return f"vessel-workers check -d {deployment}"


def _folder_problem(folder: Path, deployment_file: Path) -> str | None:
    """Why the plugin folder would show the runtime what it must not see, or None.

    The rule of agent packages and data mounts (to be merged with the shared
    helper in broker/loading when it lands).
    """
    if folder == Path(folder.anchor):
        return "is the host's root folder: name the plugin's own folder"
    if deployment_file.is_relative_to(folder):
        return "holds the deployment file, whose grants and settings may hold secrets"
    return None


def read_plugin_entries(top: Table, path: Path) -> list[PluginEntry] | None:
    """Every `[[plugins]]` entry of `top`; None when one has problems ([] when absent)."""
    if not top.has("plugins"):
        return []
    entries = top.data["plugins"]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        what = type_name(entries)
        top.problem("plugins", f"must be a list of tables ([[plugins]]), not {what}")
        return None
    found = len(top.problems)
    slugs: dict[str, int] = {}
    read: list[PluginEntry] = []
    for index, raw in enumerate(entries):
        table = Table(
            raw,
            file=top.file,
            where=field_path("plugins", index),
            keys=PLUGIN_ENTRY_KEYS,
            problems=top.problems,
        )
        entry = _read_entry(table, path)
        if entry is None:
            continue
        slug = entry.plugin_file.slug
        if slug in slugs:
            table.problem(
                "package", f"plugin {slug!r} is already installed by plugins[{slugs[slug]}]"
            )
            continue
        slugs[slug] = index
        read.append(entry)
    if len(top.problems) > found:
        return None
    return read


def _read_entry(table: Table, path: Path) -> PluginEntry | None:
    found = len(table.problems)
    package = table.string("package", required=True)
    settings = _read_settings(table)
    private = _read_private_egress(table)
    if package is None:
        return None
    folder = path.parent / package
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        table.problem("package", f"{str(folder)!r} {what}")
        return None
    exposed = _folder_problem(folder.resolve(), path.resolve())
    if exposed is not None:
        table.problem("package", f"{package!r} {exposed}")
        return None
    if not (folder / PLUGIN_FILE).is_file():
        table.problem("package", f"{str(folder)!r} has no {PLUGIN_FILE}")
        return None
    plugin_file = read_plugin_file(folder, shown=str(folder), problems=table.problems)
    if len(table.problems) > found or plugin_file is None or settings is None or private is None:
        return None
    return PluginEntry(
        where=table.where, plugin_file=plugin_file, settings=settings, private_egress=private
    )


def _read_settings(table: Table) -> dict[str, Any] | None:
    if not table.has("settings"):
        return {}
    raw = table.mapping("settings")
    if raw is None:
        return None
    found = len(table.problems)
    for key, value in raw.items():
        at = field_path(table.field("settings"), key)
        if not isinstance(value, str | int | float | bool):
            table.problems.add(
                table.file,
                at,
                f"must be a string, a number or a boolean, not {type_name(value)}",
            )
        elif isinstance(value, str) and value.startswith(ENV_PREFIX):
            problem = env_problem(value)
            if problem is not None:
                table.problems.add(table.file, at, problem)
    if len(table.problems) > found:
        return None
    return raw


def _read_private_egress(table: Table) -> tuple[str, ...] | None:
    entries = table.list_of_strings("private_egress")
    if entries is None:
        return None if table.has("private_egress") else ()
    found = len(table.problems)
    for index, entry in enumerate(entries):
        problem = private_egress_problem(entry)
        if problem is not None:
            where = field_path(table.field("private_egress"), index)
            table.problems.add(table.file, where, problem)
    if len(table.problems) > found:
        return None
    return tuple(entries)


def load_plugin(
    entry: PluginEntry, *, deployment: Path, lock_dir: Path | None, problems: Problems
) -> Plugin | None:
    """The plugin of `entry` with its lock read and checked; None (problems added) if not."""
    plugin_file = entry.plugin_file
    found = len(problems)
    command = check_command(deployment)
    path = lock_path(plugin_file.folder, plugin_file.slug, lock_dir)
    shown = str(lock_path(Path(plugin_file.shown), plugin_file.slug, lock_dir))
    lock = read_lock(path, shown=shown, command=command, problems=problems)
    if lock is None:
        return None
    try:
        sha256 = sources_sha256(plugin_file.folder, plugin_file.sources)
    except OSError as exc:
        problems.add(plugin_file.file, "sources", f"cannot be read: {exc.strerror or exc}")
        return None
    for key, message in limit_problems(plugin_file, lock.permissions):
        problems.add(plugin_file.file, key, message)
    limits = plugin_limits(plugin_file, lock.permissions)
    stale = stale_reason(lock, slug=plugin_file.slug, sha256=sha256, limits=limits)
    if stale is not None:
        problems.add(shown, "(file)", f"stale: {stale}; run {command}")
    if len(problems) > found:
        return None
    timeout, memory = limits
    tools: dict[str, PluginTool] = {}
    for index, locked in enumerate(lock.tools):
        if locked.name != f"{plugin_file.slug}__{locked.key}" or locked.name in BUILTIN_TOOLS:
            problems.add(shown, f"tools[{index}].name", f"is not a valid name; run {command}")
            continue
        tools[locked.name] = PluginTool(
            name=locked.name,
            description=locked.description,
            parameters=locked.parameters,
            scope=DEFAULT_SCOPE,
            timeout_seconds=timeout,
            source=Path(plugin_file.shown) / locked.source,
            plugin=plugin_file.slug,
            key=locked.key,
            deferred=locked.deferred,
            always_listed=locked.always_listed,
            memory_limit_mb=memory,
            permissions=lock.permissions,
        )
    if len(problems) > found:
        return None
    return Plugin(
        slug=plugin_file.slug,
        package_dir=plugin_file.folder,
        sources=plugin_file.sources,
        sources_sha256=sha256,
        settings=dict(entry.settings),
        private_egress=entry.private_egress,
        egress=lock.egress,
        permissions=lock.permissions,
        timeout_seconds=timeout,
        memory_limit_mb=memory,
        tools=tools,
        lock_path=path,
    )
