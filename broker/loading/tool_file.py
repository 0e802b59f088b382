"""One tool file (seed 000 declared tools, seed 001 service tools) into a `Tool`."""

from __future__ import annotations

from pathlib import Path

from broker.constants import (
    BUILTIN_TOOLS,
    DEFAULT_INPUT,
    DEFAULT_SCOPE,
    INPUT_MODES,
    PACKAGE_PATH,
    SERVICE_NAME_PATTERN,
    TOOL_NAME_PATTERN,
)
from broker.loading.fields import Problems, Table, field_path
from broker.loading.limits import MAX_TIMEOUT_SECONDS
from broker.loading.parameters import read_parameters
from broker.loading.service_path import service_path_problem
from broker.loading.toml_file import read_toml
from broker.model import DeclaredTool, ServiceTool, Tool

__all__ = ["PACKAGE_PLACEHOLDER", "TOOL_KEYS", "load_tool_file"]

TOOL_KEYS = frozenset(
    {
        "name",
        "description",
        "command",
        "service",
        "path",
        "parameters",
        "input",
        "timeout_seconds",
        "scope",
        "deferred",
        "always_listed",
    }
)
#: Seed 000: `{package}` in a command is the agent folder's path in the sandbox.
PACKAGE_PLACEHOLDER = "{package}"
_MAX_NAME_CHARS = 63


def load_tool_file(
    path: Path, *, shown: str, default_timeout: float, problems: Problems
) -> Tool | None:
    """The tool in `path`, or None when it has problems (each added to `problems`)."""
    data = read_toml(path, shown=shown, problems=problems)
    if data is None:
        return None
    found = len(problems)
    table = Table(data, file=shown, where="", keys=TOOL_KEYS, problems=problems)
    name = _read_name(table)
    description = table.string("description", required=True)
    scope = table.string("scope", default=DEFAULT_SCOPE)
    timeout = table.positive_number(
        "timeout_seconds", default=default_timeout, maximum=MAX_TIMEOUT_SECONDS
    )
    mode = _read_input(table)
    flags = _read_flags(table)
    has_command, has_service = table.has("command"), table.has("service")
    if has_command and has_service:
        table.problem("service", "a tool sets exactly one of command or service, not both")
    elif not has_command and not has_service:
        table.problem("command", "missing: a tool sets exactly one of command or service")
    parameters = read_parameters(table, args_mode=has_command and mode == "args")
    if has_command and not has_service and table.has("path"):
        table.problem("path", "is for service tools only (this tool sets command)")

    command = _read_command(table) if has_command and not has_service else None
    service = _read_service(table) if has_service and not has_command else None
    service_path = _read_service_path(table) if has_service and not has_command else None
    if (
        len(problems) > found
        or name is None
        or description is None
        or scope is None
        or timeout is None
        or parameters is None
        or flags is None
    ):
        return None
    deferred, always_listed = flags
    if command is not None:
        return DeclaredTool(
            name=name,
            description=description,
            parameters=parameters,
            scope=scope,
            timeout_seconds=timeout,
            source=Path(shown),
            command=command,
            input="args" if mode == "args" else "json-stdin",
            deferred=deferred,
            always_listed=always_listed,
        )
    if service is not None and service_path is not None:
        # Seed 001: `input` has no effect on a service tool; it was checked, and is dropped.
        return ServiceTool(
            name=name,
            description=description,
            parameters=parameters,
            scope=scope,
            timeout_seconds=timeout,
            source=Path(shown),
            service=service,
            path=service_path,
            deferred=deferred,
            always_listed=always_listed,
        )
    return None


def _read_name(table: Table) -> str | None:
    name = table.string("name", required=True)
    if name is None:
        return None
    if len(name) > _MAX_NAME_CHARS:
        table.problem("name", f"{name!r} is longer than {_MAX_NAME_CHARS} characters")
    elif not TOOL_NAME_PATTERN.fullmatch(name):
        table.problem(
            "name",
            f"{name!r} is not lowercase letters, digits and underscores starting with a letter",
        )
    elif name in BUILTIN_TOOLS:
        table.problem("name", f"{name!r} is the name of a built-in tool")
    else:
        return name
    return None


def _read_flags(table: Table) -> tuple[bool, bool] | None:
    """(deferred, always_listed): the catalogue's flags, seed 002's rules for plugin tools."""
    deferred = table.boolean("deferred", default=False)
    always_listed = table.boolean("always_listed", default=False)
    if deferred is None or always_listed is None:
        return None
    if deferred and always_listed:
        table.problem(
            "always_listed",
            "a tool sets at most one of deferred and always_listed: it cannot be both kept "
            "out of the list and always in it",
        )
        return None
    return deferred, always_listed


def _read_input(table: Table) -> str | None:
    mode = table.string("input", default=DEFAULT_INPUT)
    if mode is not None and mode not in INPUT_MODES:
        modes = " or ".join(sorted(INPUT_MODES, reverse=True))
        table.problem("input", f"must be {modes}, not {mode!r}")
        return None
    return mode


def _read_command(table: Table) -> tuple[str, ...] | None:
    command = table.list_of_strings("command")
    if command is None:
        return None
    if not command:
        table.problem("command", "must name at least the program to run")
        return None
    bad = [i for i, word in enumerate(command) if "\x00" in word]
    for index in bad:
        where = field_path(table.field("command"), index)
        table.problems.add(table.file, where, "holds a NUL character")
    if bad:
        return None
    return tuple(word.replace(PACKAGE_PLACEHOLDER, PACKAGE_PATH) for word in command)


def _read_service(table: Table) -> str | None:
    service = table.string("service")
    if service is not None and not SERVICE_NAME_PATTERN.fullmatch(service):
        table.problem(
            "service",
            f"{service!r} is not lowercase letters, digits and hyphens starting with a letter",
        )
        return None
    return service


def _read_service_path(table: Table) -> str | None:
    path = table.string("path", required=True)
    if path is None:
        return None
    problem = service_path_problem(path)
    if problem is not None:
        table.problem("path", problem)
        return None
    return path
