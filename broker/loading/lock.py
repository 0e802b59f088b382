"""`plugin.lock.json`: the registry of a plugin, written by `check`, read by every loader.

Loading never runs JavaScript: the publish check (`vessel-workers check`) runs
the sources once, confined, and writes down what they register (each tool's
final name, description, parameters and flags), the egress list, the derived
permissions, the call limits and the sources' sha256. A client host, `tools`
and the catalogue read only this file. A missing lock, or one that no longer
matches the sources or `plugin.toml`, is a problem naming the command to run.

    {"lock_version": 1, "slug": "weather",
     "sources": [{"path": "src/weather.ts", "sha256": "<hex>"}],
     "egress": ["api.open-meteo.com"], "permissions": ["host:fetch"],
     "timeout_seconds": 30, "memory_limit_mb": 128,
     "tools": [{"key": "get_forecast", "name": "weather__get_forecast",
                "description": "...", "parameters": {...},
                "alwaysListed": false, "deferred": false, "source": "src/weather.ts"}],
     "dropped": [{"name": "weather__web_search", "reason": "..."}]}
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.loading.fields import Problems
from broker.loading.toml_file import FILE_FIELD, MAX_FILE_BYTES

__all__ = [
    "LOCK_FILE",
    "LOCK_VERSION",
    "Lock",
    "LockedTool",
    "lock_path",
    "read_lock",
    "sources_sha256",
    "stale_reason",
    "write_lock",
]

LOCK_FILE = "plugin.lock.json"
LOCK_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class LockedTool:
    """One registered tool as the lock records it."""

    key: str
    name: str
    description: str
    parameters: Mapping[str, Any]
    always_listed: bool
    deferred: bool
    #: The source file that registered it (relative to the plugin folder).
    source: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "alwaysListed": self.always_listed,
            "deferred": self.deferred,
            "source": self.source,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Lock:
    """A plugin's recorded registry."""

    slug: str
    #: (relative path, sha256 hex), in run order.
    sources: tuple[tuple[str, str], ...]
    egress: tuple[str, ...]
    permissions: tuple[str, ...]
    timeout_seconds: float
    memory_limit_mb: int
    tools: tuple[LockedTool, ...]
    #: (final name, why it was dropped).
    dropped: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        timeout = self.timeout_seconds
        return {
            "lock_version": LOCK_VERSION,
            "slug": self.slug,
            "sources": [{"path": p, "sha256": h} for p, h in self.sources],
            "egress": list(self.egress),
            "permissions": list(self.permissions),
            "timeout_seconds": int(timeout) if float(timeout).is_integer() else timeout,
            "memory_limit_mb": self.memory_limit_mb,
            "tools": [t.to_json() for t in self.tools],
            "dropped": [{"name": n, "reason": r} for n, r in self.dropped],
        }


def lock_path(folder: Path, slug: str, lock_dir: Path | None) -> Path:
    """Where the lock of the plugin in `folder` is: its folder, or `<lock_dir>/<slug>.lock.json`."""
    return folder / LOCK_FILE if lock_dir is None else lock_dir / f"{slug}.lock.json"


def sources_sha256(folder: Path, sources: Sequence[str]) -> dict[str, str]:
    """Relative path -> sha256 hex of each source (OSError if one cannot be read)."""
    return {s: hashlib.sha256((folder / s).read_bytes()).hexdigest() for s in sources}


def write_lock(path: Path, lock: Lock) -> None:
    """Write `lock` to `path` atomically (a reader sees the old file or the new one)."""
    text = json.dumps(lock.to_json(), indent=2, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class _Bad(Exception):
    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    at = f"{where}.{key}" if where else key
    if key not in data:
        raise _Bad(at, "missing")
    value = data[key]
    if isinstance(value, bool) and kind not in (bool, (bool,)):
        raise _Bad(at, "has the wrong type")
    if not isinstance(value, kind):
        raise _Bad(at, "has the wrong type")
    return value


def _strings(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    items = _get(data, key, list, "")
    if not all(isinstance(i, str) for i in items):
        raise _Bad(key, "must be a list of strings")
    return tuple(items)


def _parse(data: Any) -> Lock:
    if not isinstance(data, dict):
        raise _Bad(FILE_FIELD, "is not a JSON object")
    if data.get("lock_version") != LOCK_VERSION:
        raise _Bad("lock_version", f"must be {LOCK_VERSION}")
    sources = []
    for index, entry in enumerate(_get(data, "sources", list, "")):
        where = f"sources[{index}]"
        if not isinstance(entry, dict):
            raise _Bad(where, "must be an object")
        sources.append((_get(entry, "path", str, where), _get(entry, "sha256", str, where)))
    tools = []
    for index, entry in enumerate(_get(data, "tools", list, "")):
        where = f"tools[{index}]"
        if not isinstance(entry, dict):
            raise _Bad(where, "must be an object")
        tools.append(
            LockedTool(
                key=_get(entry, "key", str, where),
                name=_get(entry, "name", str, where),
                description=_get(entry, "description", str, where),
                parameters=_get(entry, "parameters", dict, where),
                always_listed=_get(entry, "alwaysListed", bool, where),
                deferred=_get(entry, "deferred", bool, where),
                source=_get(entry, "source", str, where),
            )
        )
    dropped = []
    for index, entry in enumerate(data.get("dropped", [])):
        where = f"dropped[{index}]"
        if not isinstance(entry, dict):
            raise _Bad(where, "must be an object")
        dropped.append((_get(entry, "name", str, where), _get(entry, "reason", str, where)))
    return Lock(
        slug=_get(data, "slug", str, ""),
        sources=tuple(sources),
        egress=_strings(data, "egress"),
        permissions=_strings(data, "permissions"),
        timeout_seconds=float(_get(data, "timeout_seconds", (int, float), "")),
        memory_limit_mb=_get(data, "memory_limit_mb", int, ""),
        tools=tuple(tools),
        dropped=tuple(dropped),
    )


def read_lock(path: Path, *, shown: str, command: str, problems: Problems) -> Lock | None:
    """The lock at `path`; None (one problem added, naming `command`) if absent or unreadable."""
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        problems.add(shown, FILE_FIELD, f"no lock: the plugin was not checked; run {command}")
        return None
    except OSError as exc:
        problems.add(shown, FILE_FIELD, f"cannot be read: {exc.strerror or exc}")
        return None
    if len(raw) > MAX_FILE_BYTES:
        problems.add(shown, FILE_FIELD, f"is larger than {MAX_FILE_BYTES} bytes")
        return None
    try:
        return _parse(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        problems.add(shown, FILE_FIELD, f"is not a valid lock (not JSON); run {command}")
    except _Bad as exc:
        problems.add(shown, exc.field, f"{exc.message}: not a valid lock; run {command}")
    return None


def stale_reason(
    lock: Lock,
    *,
    slug: str,
    sha256: Mapping[str, str],
    limits: tuple[float, int],
) -> str | None:
    """Why `lock` no longer matches the plugin (slug, sources, their sha256, limits), or None."""
    if lock.slug != slug:
        return f"it is the lock of plugin {lock.slug!r}, not {slug!r}"
    if [p for p, _ in lock.sources] != list(sha256):
        return "plugin.toml lists other sources than the lock"
    for path, digest in lock.sources:
        if sha256[path] != digest:
            return f"{path} changed since the lock was written"
    if (lock.timeout_seconds, lock.memory_limit_mb) != limits:
        return "plugin.toml sets other limits than the lock"
    return None
