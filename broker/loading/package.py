"""An agent package: `vessel.toml` (agent settings, `[tools] declared`) and its tool files."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from broker.constants import (
    DEFAULT_CPU_LIMIT,
    DEFAULT_DISK_LIMIT_MB,
    DEFAULT_MAX_ARGUMENT_BYTES,
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_TOOL_OUTPUT_CHARS,
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    DEFAULT_WORKDIR,
    DEFAULT_WORKSPACE_FILES,
    DEFAULT_WORKSPACE_LIMIT_MB,
    PLUGIN_MAX_ALWAYS_LISTED,
)
from broker.loading.fields import Problems, Table, field_path
from broker.loading.limits import (
    MAX_ARGUMENT_BYTES,
    MAX_CPU_LIMIT,
    MAX_DISK_LIMIT_MB,
    MAX_MEMORY_LIMIT_MB,
    MAX_TIMEOUT_SECONDS,
    MAX_TOOL_OUTPUT_CHARS,
    MAX_WORKSPACE_FILES,
    MAX_WORKSPACE_LIMIT_MB,
    MIN_CPU_LIMIT,
)
from broker.loading.sandbox_paths import workdir_problem
from broker.loading.toml_file import read_toml
from broker.loading.tool_file import load_tool_file
from broker.model import AgentSettings, Tool

__all__ = ["PACKAGE_FILE", "Package", "load_package"]

PACKAGE_FILE = "vessel.toml"

_SETTINGS_KEYS = frozenset(
    {
        "workdir",
        "tool_timeout_seconds",
        "tool_output_chars",
        "disk_limit_mb",
        "memory_limit_mb",
        "workspace_limit_mb",
        "workspace_files",
        "cpu_limit",
        "max_argument_bytes",
    }
)
_TOP_KEYS = _SETTINGS_KEYS | {"tools"}
_TOOLS_KEYS = frozenset({"declared"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Package:
    """A loaded package; `tools` keeps the order of `[tools] declared`."""

    settings: AgentSettings
    tools: dict[str, Tool]


def load_package(folder: Path, *, shown: str, problems: Problems) -> Package | None:
    """The package in `folder` (shown to the user as `shown`); None when it has problems."""
    found = len(problems)
    manifest = str(Path(shown) / PACKAGE_FILE)
    data = read_toml(folder / PACKAGE_FILE, shown=manifest, problems=problems)
    if data is None:
        return None
    table = Table(data, file=manifest, where="", keys=_TOP_KEYS, problems=problems)
    settings = _read_settings(table)
    # A bad tool_timeout_seconds is reported once; the tools fall back to the default.
    default_timeout = settings.tool_timeout_seconds if settings else DEFAULT_TOOL_TIMEOUT_SECONDS
    tools: dict[str, Tool] = {}
    for entry in _declared(table, folder):
        tool = load_tool_file(
            folder / entry,
            shown=str(Path(shown) / entry),
            default_timeout=default_timeout,
            problems=problems,
        )
        if tool is None:
            continue
        if tool.name in tools:
            problems.add(
                str(tool.source),
                "name",
                f"{tool.name!r} is already the name of the tool in {tools[tool.name].source}",
            )
            continue
        tools[tool.name] = tool
    _check_always_listed(tools, problems)
    if len(problems) > found or settings is None:
        return None
    return Package(settings=settings, tools=tools)


def _check_always_listed(tools: dict[str, Tool], problems: Problems) -> None:
    """Seed 002's rule for a plugin, per package: at most 3 `always_listed` tools."""
    listed = [tool for tool in tools.values() if tool.always_listed]
    for extra in listed[PLUGIN_MAX_ALWAYS_LISTED:]:
        first = ", ".join(t.name for t in listed[:PLUGIN_MAX_ALWAYS_LISTED])
        problems.add(
            str(extra.source),
            "always_listed",
            f"a package may have at most {PLUGIN_MAX_ALWAYS_LISTED} always_listed tools "
            f"(already: {first})",
        )


def _read_settings(table: Table) -> AgentSettings | None:
    workdir = table.string("workdir", default=DEFAULT_WORKDIR)
    if workdir is not None and (problem := workdir_problem(workdir)):
        table.problem("workdir", problem)
        workdir = None
    timeout = table.positive_number(
        "tool_timeout_seconds", default=DEFAULT_TOOL_TIMEOUT_SECONDS, maximum=MAX_TIMEOUT_SECONDS
    )
    output_chars = table.positive_int(
        "tool_output_chars", default=DEFAULT_TOOL_OUTPUT_CHARS, maximum=MAX_TOOL_OUTPUT_CHARS
    )
    disk = table.positive_int(
        "disk_limit_mb", default=DEFAULT_DISK_LIMIT_MB, maximum=MAX_DISK_LIMIT_MB
    )
    memory = table.positive_int(
        "memory_limit_mb", default=DEFAULT_MEMORY_LIMIT_MB, maximum=MAX_MEMORY_LIMIT_MB
    )
    workspace = table.positive_int(
        "workspace_limit_mb", default=DEFAULT_WORKSPACE_LIMIT_MB, maximum=MAX_WORKSPACE_LIMIT_MB
    )
    files = table.positive_int(
        "workspace_files", default=DEFAULT_WORKSPACE_FILES, maximum=MAX_WORKSPACE_FILES
    )
    cpu = table.positive_number("cpu_limit", default=DEFAULT_CPU_LIMIT, maximum=MAX_CPU_LIMIT)
    if cpu is not None and cpu < MIN_CPU_LIMIT:
        table.problem("cpu_limit", f"must be at least {MIN_CPU_LIMIT:g} (of a core), not {cpu:g}")
        cpu = None
    max_arguments = table.positive_int(
        "max_argument_bytes", default=DEFAULT_MAX_ARGUMENT_BYTES, maximum=MAX_ARGUMENT_BYTES
    )
    if (
        workdir is None
        or timeout is None
        or output_chars is None
        or disk is None
        or memory is None
        or workspace is None
        or files is None
        or cpu is None
        or max_arguments is None
    ):
        return None
    return AgentSettings(
        workdir=workdir,
        tool_timeout_seconds=timeout,
        tool_output_chars=output_chars,
        disk_limit_mb=disk,
        memory_limit_mb=memory,
        workspace_limit_mb=workspace,
        workspace_files=files,
        cpu_limit=cpu,
        max_argument_bytes=max_arguments,
    )


def _declared(table: Table, folder: Path) -> list[str]:
    """The relative path of each listed tool file that is inside the package and exists."""
    tools = table.table("tools", keys=_TOOLS_KEYS)
    if tools is None:
        return []
    entries = tools.list_of_strings("declared")
    if entries is None:
        return []
    root = folder.resolve()
    seen: dict[str, int] = {}
    usable: list[str] = []
    for index, entry in enumerate(entries):
        where = field_path(tools.field("declared"), index)
        normal = posixpath.normpath(entry)
        if posixpath.isabs(entry) or "\\" in entry:
            table.problems.add(
                table.file, where, f"{entry!r} must be a path relative to the package"
            )
            continue
        if normal in seen:
            table.problems.add(
                table.file,
                where,
                f"{entry!r} is listed twice (also tools.declared[{seen[normal]}])",
            )
            continue
        seen[normal] = index
        # Resolved, so a symlink pointing out of the package is caught as well as "..".
        target = (root / entry).resolve()
        if not target.is_relative_to(root):
            table.problems.add(table.file, where, f"{entry!r} is outside the package folder")
        elif not target.is_file():
            what = "is not a file" if target.exists() else "does not exist"
            table.problems.add(table.file, where, f"{entry!r} {what} in the package")
        else:
            usable.append(entry)
    return usable
