"""A plugin folder's `plugin.toml`, and the limits a plugin's calls get.

    slug = "weather"               # [a-z][a-z0-9-]{0,31}
    sources = ["src/weather.ts"]   # .ts, .js or .mjs, inside the folder, run in this order
    timeout_seconds = 45           # optional: may only raise the floor
    memory_limit_mb = 256          # optional: may only raise the floor

Seed 002's limits are 30 s and 128 MB per call, raised to at least 60 s and
512 MB when the plugin derives `host:media:transcode`, and to at least 120 s
with `agentApi:plugins.write` (`limit_floors`). `plugin.toml` may set higher
values, never lower ones.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.constants import PLUGIN_MEMORY_LIMIT_MB, PLUGIN_SLUG_PATTERN, PLUGIN_TIMEOUT_SECONDS
from broker.loading.fields import Problems, Table, field_path
from broker.loading.limits import MAX_MEMORY_LIMIT_MB, MAX_TIMEOUT_SECONDS
from broker.loading.toml_file import read_toml

__all__ = [
    "FLOORS",
    "PLUGIN_FILE",
    "PLUGIN_KEYS",
    "SOURCE_SUFFIXES",
    "Floor",
    "PluginFile",
    "limit_floors",
    "limit_problems",
    "plugin_limits",
    "read_plugin_file",
]

PLUGIN_FILE = "plugin.toml"
PLUGIN_KEYS = frozenset({"slug", "sources", "timeout_seconds", "memory_limit_mb"})
#: Node runs these: TypeScript (types stripped, erasable syntax only) and JavaScript.
SOURCE_SUFFIXES = (".ts", ".js", ".mjs")


@dataclass(frozen=True, slots=True)
class Floor:
    """Seed 002: a derived permission that raises a call's limits."""

    permission: str
    timeout_seconds: float
    memory_limit_mb: int


#: Seed 002 "Limits": the floors each permission raises the limits to.
FLOORS: tuple[Floor, ...] = (
    Floor("host:media:transcode", 60.0, 512),
    Floor("agentApi:plugins.write", 120.0, PLUGIN_MEMORY_LIMIT_MB),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class PluginFile:
    """A read `plugin.toml`; `folder` is resolved, `shown` is as the user reaches it."""

    slug: str
    folder: Path
    shown: str
    sources: tuple[str, ...]
    #: As written (None: not set).
    timeout_seconds: float | None
    memory_limit_mb: int | None

    @property
    def file(self) -> str:
        """The plugin.toml path as shown in problem lines."""
        return str(Path(self.shown) / PLUGIN_FILE)


def _holds(permissions: Sequence[str], permission: str) -> bool:
    return any(p == permission or p.startswith(permission + ":") for p in permissions)


def limit_floors(permissions: Sequence[str]) -> tuple[float, int, list[str]]:
    """(timeout floor, memory floor, the permissions that raised them)."""
    timeout, memory, why = PLUGIN_TIMEOUT_SECONDS, PLUGIN_MEMORY_LIMIT_MB, []
    for floor in FLOORS:
        if _holds(permissions, floor.permission):
            timeout = max(timeout, floor.timeout_seconds)
            memory = max(memory, floor.memory_limit_mb)
            why.append(floor.permission)
    return timeout, memory, why


def limit_problems(plugin: PluginFile, permissions: Sequence[str]) -> list[tuple[str, str]]:
    """(field, message) for each `plugin.toml` limit below its floor."""
    timeout, memory, why = limit_floors(permissions)
    because = f" (raised by {', '.join(why)})" if why else ""
    found: list[tuple[str, str]] = []
    if plugin.timeout_seconds is not None and plugin.timeout_seconds < timeout:
        found.append(
            (
                "timeout_seconds",
                f"{plugin.timeout_seconds:g} is below this plugin's floor of {timeout:g} s"
                f"{because}: it may only raise the limit",
            )
        )
    if plugin.memory_limit_mb is not None and plugin.memory_limit_mb < memory:
        found.append(
            (
                "memory_limit_mb",
                f"{plugin.memory_limit_mb} is below this plugin's floor of {memory} MB"
                f"{because}: it may only raise the limit",
            )
        )
    return found


def plugin_limits(plugin: PluginFile, permissions: Sequence[str]) -> tuple[float, int]:
    """The (timeout_seconds, memory_limit_mb) of every call of the plugin."""
    timeout, memory, _ = limit_floors(permissions)
    return (
        max(timeout, plugin.timeout_seconds or 0.0),
        max(memory, plugin.memory_limit_mb or 0),
    )


def read_plugin_file(folder: Path, *, shown: str, problems: Problems) -> PluginFile | None:
    """`plugin.toml` of `folder`; None (each problem added) when it has problems."""
    found = len(problems)
    file = str(Path(shown) / PLUGIN_FILE)
    data = read_toml(folder / PLUGIN_FILE, shown=file, problems=problems)
    if data is None:
        return None
    table = Table(data, file=file, where="", keys=PLUGIN_KEYS, problems=problems)
    slug = table.string("slug", required=True)
    if slug is not None and not PLUGIN_SLUG_PATTERN.fullmatch(slug):
        table.problem(
            "slug",
            f"{slug!r} is not lowercase letters, digits and hyphens starting with a letter, "
            "up to 32 characters",
        )
    sources = _read_sources(table, folder)
    # The base floors here; the raised floors are checked once permissions are known.
    timeout = table.positive_number("timeout_seconds", default=None, maximum=MAX_TIMEOUT_SECONDS)
    memory = (
        table.positive_int("memory_limit_mb", default=0, maximum=MAX_MEMORY_LIMIT_MB)
        if table.has("memory_limit_mb")
        else None
    )
    partial = PluginFile(
        slug=slug or "",
        folder=folder.resolve(),
        shown=shown,
        sources=tuple(sources or ()),
        timeout_seconds=timeout,
        memory_limit_mb=memory or None,
    )
    for key, message in limit_problems(partial, ()):
        table.problem(key, message)
    if len(problems) > found or slug is None or sources is None:
        return None
    return partial


def _read_sources(table: Table, folder: Path) -> list[str] | None:
    entries = table.list_of_strings("sources", required=True)
    if entries is None:
        return None
    if not entries:
        table.problem("sources", "must list at least one source file")
        return None
    root = folder.resolve()
    found = len(table.problems)
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = field_path(table.field("sources"), index)

        def refuse(message: str, where: str = where) -> None:
            table.problems.add(table.file, where, message)

        normal = posixpath.normpath(entry)
        if posixpath.isabs(entry) or "\\" in entry:
            refuse(f"{entry!r} must be a path relative to the plugin folder")
            continue
        if not entry.endswith(SOURCE_SUFFIXES):
            refuse(f"{entry!r} must be TypeScript or JavaScript: {', '.join(SOURCE_SUFFIXES)}")
            continue
        if normal in seen:
            refuse(f"{entry!r} is listed twice (also sources[{seen[normal]}])")
            continue
        seen[normal] = index
        # Resolved, so a symlink pointing out of the folder is caught as well as "..".
        target = (root / entry).resolve()
        if not target.is_relative_to(root):
            refuse(f"{entry!r} is outside the plugin folder")
        elif not target.is_file():
            what = "is not a file" if target.exists() else "does not exist"
            refuse(f"{entry!r} {what} in the plugin folder")
    if len(table.problems) > found:
        return None
    return [posixpath.normpath(e) for e in entries]
