"""The plugin's sources run once, confined, to read what they register.

`register_sources` is the publish check's run (and a plugin worker's start-up
check against the lock): the sources evaluated in a fresh isolate of a
confined runtime process, exactly as before a call, but with the host API
refusing every call ("the host API is not available while registering"),
within `REGISTER_TIMEOUT_SECONDS` and the base memory limit. The registry
comes back described (types, values that are plain JSON, which source
registered each key); the rules are applied by `publish.py`.
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.constants import PLUGIN_MEMORY_LIMIT_MB
from workers.plugin.confine import PLUGIN_ROOT, Confinement
from workers.plugin.permissions import derive_permissions
from workers.plugin.process import DATA_MARGIN_BYTES, probe_data_bytes, run_once
from workers.plugin.stage import make_stage, node_binary, remove_stage
from workers.sandbox.limits import MIB

__all__ = ["REGISTER_TIMEOUT_SECONDS", "LoadFailure", "Registration", "register_sources"]

#: The sources' top level must register and return: 10 s is far beyond any
#: registration and bounds a `while (true) {}` at top level.
REGISTER_TIMEOUT_SECONDS = 10.0
#: The probe runs before the limit is known: 4 GiB holds it anywhere.
_PROBE_DATA_BYTES = 4096 * MIB


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadFailure:
    """The sources could not be evaluated: an exception, a syntax error, a limit."""

    #: "error", "timeout" or "memory".
    kind: str
    message: str
    #: The source (relative path) and line the error names, when it names one.
    file: str | None = None
    line: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Registration:
    """What the sources registered, as the runtime described it."""

    #: One entry per registry key, in registration order (see js/isolate.mjs `registry`).
    tools: tuple[Mapping[str, Any], ...] = ()
    #: The type of `globalThis.tools` at the end ("object" when usable).
    registry_type: str = "object"
    #: {"type", "value"} or {"type", "notJson"}; None when no source set one.
    manifest: Mapping[str, Any] | None = None
    #: The source that set `globalThis.manifest`, for problem lines.
    manifest_source: str | None = None
    failed: LoadFailure | None = None
    #: Derived statically from the source texts (`permissions.py`).
    permissions: tuple[str, ...] = field(default=())


@functools.lru_cache(maxsize=4)
def _probed(node: Path, stage: Path) -> int:
    probe = Confinement(node=node, stage=stage, data_bytes=_PROBE_DATA_BYTES)
    return probe_data_bytes(probe, heap_mb=PLUGIN_MEMORY_LIMIT_MB)


def _base_data_bytes(node: Path, stage: Path) -> int:
    """The probe's figure for `node`, measured once per process (it does not depend on
    the plugin: the probe loads no source)."""
    return _probed(node, _probe_stage())


@functools.lru_cache(maxsize=1)
def _probe_stage() -> Path:
    # An empty stage kept for the process's life (the probe runs no plugin code).
    stage = make_stage(Path("/"), ())
    atexit.register(remove_stage, stage)
    return stage


def register_sources(plugin_dir: Path, sources: Sequence[str]) -> Registration:
    """Run the sources of the plugin in `plugin_dir`, confined; OSError if no runtime can run."""
    texts = [(plugin_dir / s).read_text(encoding="utf-8", errors="replace") for s in sources]
    permissions = derive_permissions(texts)
    stage = make_stage(plugin_dir, sources)
    try:
        node = node_binary()
        base = _base_data_bytes(node, stage)
        confinement = Confinement(
            node=node,
            stage=stage,
            data_bytes=base + PLUGIN_MEMORY_LIMIT_MB * MIB + DATA_MARGIN_BYTES,
        )
        config = {
            "mode": "register",
            "root": PLUGIN_ROOT,
            "sources": list(sources),
            "heapMb": PLUGIN_MEMORY_LIMIT_MB,
            "registerTimeoutMs": int(REGISTER_TIMEOUT_SECONDS * 1000),
        }
        try:
            message = run_once(confinement, config, timeout=REGISTER_TIMEOUT_SECONDS + 5)
        except TimeoutError:
            message = {"failed": {"kind": "timeout", "message": "timed out"}}
    finally:
        remove_stage(stage)
    failed = message.get("failed")
    if isinstance(failed, dict):
        line = failed.get("line")
        return Registration(
            failed=LoadFailure(
                kind=str(failed.get("kind", "error")),
                message=str(failed.get("message", "")),
                file=str(failed["file"]) if isinstance(failed.get("file"), str) else None,
                line=line if isinstance(line, int) else None,
            ),
            permissions=permissions,
        )
    tools = message.get("tools")
    manifest = message.get("manifest")
    return Registration(
        tools=tuple(t for t in tools if isinstance(t, dict)) if isinstance(tools, list) else (),
        registry_type=str(message.get("registryType", "object")),
        manifest=manifest if isinstance(manifest, dict) else None,
        manifest_source=message.get("manifestSource") or None,
        permissions=permissions,
    )
