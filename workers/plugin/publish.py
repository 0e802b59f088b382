"""The publish check's rules (seed 002's table, issue 16) and the lock they produce.

One `FILE: FIELD: problem` per broken rule, FILE the source that registered
the tool (or set the manifest), FIELD `tools.<key>[.<field>]` or
`manifest.egress[i]`:

- the key matches `^[a-z][a-z0-9_]{0,63}$`;
- a registration is an object: a bare function fails;
- `description` is required and not empty;
- `handler` is required and a function;
- `parameters` is optional (default `{"type": "object", "properties": {}}`),
  plain JSON, a valid JSON Schema (jsonschema's meta-schema) of type object;
- `alwaysListed` and `deferred` are booleans, not both true; at most 3 tools
  of a plugin are `alwaysListed`;
- `manifest.egress` is a list of host names or IP literals, each optionally
  with `:port`, nothing else; `manifest` holds nothing but `egress`;
- `plugin.toml`'s limits may only raise the floors the permissions set.

A final name `<slug>__<key>` equal to a built-in tool's is dropped with a
warning, and the check still passes.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.constants import (
    BUILTIN_TOOLS,
    DEFAULT_PARAMETERS,
    PLUGIN_MAX_ALWAYS_LISTED,
    PLUGIN_TOOL_KEY_PATTERN,
)
from broker.errors import Problem
from broker.loading.egress import egress_problem
from broker.loading.fields import Problems, field_path
from broker.loading.lock import Lock, LockedTool, sources_sha256
from broker.loading.parameters import schema_error
from broker.loading.plugin import PluginFile, limit_problems, plugin_limits, read_plugin_file
from broker.model import Plugin
from workers.plugin.registration import Registration, register_sources

__all__ = ["MANIFEST_KEYS", "Published", "lock_mismatch", "publish"]

MANIFEST_KEYS = frozenset({"egress"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Published:
    """The check's verdict: a lock to write when there are no problems."""

    lock: Lock | None
    problems: tuple[Problem, ...] = ()
    #: `FILE: FIELD: warning` lines (dropped tools); they do not fail the check.
    warnings: tuple[str, ...] = field(default=())


def _path(where: str, steps: Sequence[Any]) -> str:
    for step in steps:
        where = field_path(where, step)
    return where


class _Check:
    def __init__(self, plugin: PluginFile) -> None:
        self.plugin = plugin
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def file(self, source: str | None) -> str:
        return str(Path(self.plugin.shown) / source) if source else self.plugin.file

    def add(self, source: str | None, where: str, message: str) -> None:
        self.problems.append(Problem(file=self.file(source), field=where, message=message))


def _described(entry: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    found = entry.get(name)
    return found if isinstance(found, dict) else {"type": "undefined"}


def _tool(check: _Check, entry: Mapping[str, Any], listed: list[str]) -> LockedTool | None:
    key = str(entry.get("key", ""))
    source = str(entry.get("source") or "") or None
    where = field_path("tools", key)
    before = len(check.problems)
    if not PLUGIN_TOOL_KEY_PATTERN.fullmatch(key):
        check.add(
            source,
            where,
            "a tool's name is lowercase letters, digits and underscores starting with a "
            "letter, up to 64 characters",
        )
    if "error" in entry:
        check.add(source, where, f"reading the registration threw: {entry['error']}")
        return None
    kind = entry.get("type")
    if kind == "function":
        check.add(
            source,
            where,
            "a bare function is not a registration: register { description, parameters, handler }",
        )
        return None
    if kind != "object":
        check.add(source, where, f"must be an object {{ description, handler, ... }}, not {kind}")
        return None
    threw = False
    for name in ("description", "handler", "parameters", "alwaysListed", "deferred"):
        if "error" in _described(entry, name):
            check.add(source, field_path(where, name), f"reading it threw: {entry[name]['error']}")
            threw = True
    if threw:
        return None
    description = _described(entry, "description")
    text = description.get("value")
    if description.get("type") == "undefined":
        check.add(source, field_path(where, "description"), "missing: a description is required")
    elif not isinstance(text, str):
        check.add(
            source,
            field_path(where, "description"),
            f"must be a string, not {description.get('type')}",
        )
    elif not text.strip():
        check.add(source, field_path(where, "description"), "must not be empty")
    handler = _described(entry, "handler").get("type")
    if handler == "undefined":
        check.add(source, field_path(where, "handler"), "missing: a handler function is required")
    elif handler != "function":
        check.add(source, field_path(where, "handler"), f"must be a function, not {handler}")
    parameters = _parameters(check, source, where, _described(entry, "parameters"))
    flags: dict[str, bool] = {}
    for name in ("alwaysListed", "deferred"):
        flag = _described(entry, name)
        if flag.get("type") == "undefined":
            flags[name] = False
        elif flag.get("type") != "boolean":
            check.add(source, field_path(where, name), f"must be true or false, not {flag['type']}")
        else:
            flags[name] = bool(flag.get("value"))
    if flags.get("alwaysListed") and flags.get("deferred"):
        check.add(
            source,
            where,
            "sets both deferred and alwaysListed: a tool cannot be both kept out of the "
            "list and always in it",
        )
    elif flags.get("alwaysListed"):
        listed.append(key)
        if len(listed) > PLUGIN_MAX_ALWAYS_LISTED:
            check.add(
                source,
                field_path(where, "alwaysListed"),
                f"a plugin may have at most {PLUGIN_MAX_ALWAYS_LISTED} alwaysListed tools "
                f"(already: {', '.join(listed[:PLUGIN_MAX_ALWAYS_LISTED])})",
            )
    if len(check.problems) > before or parameters is None or not isinstance(text, str):
        return None
    return LockedTool(
        key=key,
        name=f"{check.plugin.slug}__{key}",
        description=text,
        parameters=parameters,
        always_listed=flags["alwaysListed"],
        deferred=flags["deferred"],
        source=source or "",
    )


def _parameters(
    check: _Check, source: str | None, where: str, described: Mapping[str, Any]
) -> dict[str, Any] | None:
    at = field_path(where, "parameters")
    if described.get("type") == "undefined":
        return copy.deepcopy(DEFAULT_PARAMETERS)
    if "notJson" in described:
        steps, message = described["notJson"]
        check.add(source, _path(at, steps), f"{message}: parameters must be plain JSON")
        return None
    schema = described.get("value")
    if not isinstance(schema, dict):
        check.add(source, at, f"must be a JSON Schema object, not {described.get('type')}")
        return None
    error = schema_error(schema, at)
    if error is not None:
        check.add(source, error[0], error[1])
        return None
    if schema.get("type") != "object":
        check.add(
            source,
            field_path(at, "type"),
            f'must be "object" (the input is one JSON object), not {schema.get("type")!r}',
        )
        return None
    return schema


def _egress(check: _Check, registration: Registration) -> tuple[str, ...] | None:
    manifest = registration.manifest
    source = registration.manifest_source
    if manifest is None:
        return ()
    if "notJson" in manifest:
        steps, message = manifest["notJson"]
        check.add(source, _path("manifest", steps), f"{message}: the manifest must be plain JSON")
        return None
    value = manifest.get("value")
    if not isinstance(value, dict):
        check.add(source, "manifest", f"must be an object {{ egress }}, not {manifest.get('type')}")
        return None
    for key in value:
        if key not in MANIFEST_KEYS:
            close = difflib.get_close_matches(key, sorted(MANIFEST_KEYS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            check.add(
                source, field_path("manifest", key), f"unknown key (known keys: egress){hint}"
            )
    egress = value.get("egress", [])
    if not isinstance(egress, list):
        check.add(source, "manifest.egress", "must be a list of host names")
        return None
    before = len(check.problems)
    for index, entry in enumerate(egress):
        problem = egress_problem(entry)
        if problem is not None:
            check.add(source, field_path("manifest.egress", index), problem)
    if len(check.problems) > before:
        return None
    return tuple(str(e) for e in egress)


def publish(plugin: PluginFile, registration: Registration) -> Published:
    """Apply every rule to `registration`; the lock when nothing is wrong."""
    check = _Check(plugin)
    failed = registration.failed
    if failed is not None:
        if failed.kind == "timeout":
            check.add(None, "sources", "the sources did not finish registering within 10 s")
        elif failed.kind == "memory":
            check.add(None, "sources", f"registering ran out of memory ({failed.message})")
        else:
            at = f"line {failed.line}" if failed.line else "(file)"
            check.add(failed.file, at, failed.message)
        return Published(lock=None, problems=tuple(check.problems))
    if registration.registry_type != "object":
        check.add(
            plugin.sources[-1],
            "tools",
            f"globalThis.tools must stay an object, not {registration.registry_type}",
        )
    listed: list[str] = []
    tools: list[LockedTool] = []
    dropped: list[tuple[str, str]] = []
    for entry in registration.tools:
        tool = _tool(check, entry, listed)
        if tool is None:
            continue
        if tool.name in BUILTIN_TOOLS:
            reason = f"its final name {tool.name!r} is a built-in tool's"
            dropped.append((tool.name, reason))
            file = check.file(tool.source)
            check.warnings.append(f"{file}: tools.{tool.key}: warning: dropped: {reason}")
            continue
        tools.append(tool)
    egress = _egress(check, registration)
    for key, message in limit_problems(plugin, registration.permissions):
        check.add(None, key, message)
    if check.problems or egress is None:
        return Published(lock=None, problems=tuple(check.problems), warnings=tuple(check.warnings))
    sha256 = sources_sha256(plugin.folder, plugin.sources)
    timeout, memory = plugin_limits(plugin, registration.permissions)
    lock = Lock(
        slug=plugin.slug,
        sources=tuple(sha256.items()),
        egress=egress,
        permissions=registration.permissions,
        timeout_seconds=timeout,
        memory_limit_mb=memory,
        tools=tuple(tools),
        dropped=tuple(dropped),
    )
    return Published(lock=lock, warnings=tuple(check.warnings))


def lock_mismatch(plugin: Plugin) -> str | None:
    """Why the plugin's sources, run now, no longer register what its lock says; None if they do.

    A plugin worker calls this at start for each plugin and refuses to start on
    a mismatch (issue 16: "plugin workers run the registration themselves at
    start and refuse a lock that does not match"). Raises OSError if no runtime
    can run here.
    """
    problems = Problems()
    plugin_file = read_plugin_file(
        plugin.package_dir, shown=str(plugin.package_dir), problems=problems
    )
    if plugin_file is None:
        return "; ".join(str(p) for p in problems.as_list())
    published = publish(plugin_file, register_sources(plugin.package_dir, plugin.sources))
    if published.lock is None:
        return "; ".join(str(p) for p in published.problems)
    lock = published.lock
    if lock.permissions != plugin.permissions:
        return f"the sources derive {list(lock.permissions)}, the lock {list(plugin.permissions)}"
    if lock.egress != plugin.egress:
        return f"the sources' egress is {list(lock.egress)}, the lock's {list(plugin.egress)}"
    found = {t.name: t for t in lock.tools}
    if list(found) != list(plugin.tools):
        return f"the sources register {list(found)}, the lock {list(plugin.tools)}"
    for name, tool in plugin.tools.items():
        now = found[name]
        if (now.description, dict(now.parameters), now.always_listed, now.deferred) != (
            tool.description,
            dict(tool.parameters),
            tool.always_listed,
            tool.deferred,
        ):
            return f"{name} is registered differently than the lock says"
    return None
