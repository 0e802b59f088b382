"""`PluginRunner`: plugin calls, each in a fresh state of a warm, confined runtime process.

    PluginRunner.run(call) -> a warm RuntimeProcess of the tool's plugin (pool.py; one call at once)
        -> the call runs in a fresh vm context (or a fresh isolate: js/runtime.mjs)
        -> host.<chain>(...) lines answered by HostBridge.call (exchange.py)
        -> {"op": "done"} -> ToolResult (outcome.py)

A call that hits a limit (time, memory) or breaks the protocol takes its
process down: it is killed and replaced (off the call's path), and no other
call sees it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from broker.model import Agent, Deployment, PluginTool
from broker.protocol import CANCELLED_TEXT, Initiator, ToolResult
from workers.plugin.confine import PLUGIN_ROOT, Confinement
from workers.plugin.exchange import (
    KILL_GRACE_SECONDS,
    MAX_HOST_CALLS,
    MAX_PENDING_HOST_CALLS,
    exchange,
)
from workers.plugin.host.context import HostBridge, HostContext
from workers.plugin.outcome import memory_text, outcome
from workers.plugin.pool import RuntimePool, Slots, Spawner
from workers.plugin.process import DATA_MARGIN_BYTES, probe_data_bytes
from workers.plugin.stage import make_stage, node_binary, remove_stage, remove_stale_stages
from workers.sandbox.limits import MIB
from workers.service.redact import Redactor

__all__ = [
    "HOST_THREADS",
    "KILL_GRACE_SECONDS",
    "MAX_HOST_CALLS",
    "MAX_PENDING_HOST_CALLS",
    "PluginRunner",
    "memory_text",
]

#: Host calls answered at once per runner (a handler may await several fetches).
HOST_THREADS = 16
#: The probe runs before the limit is known: 4 GiB holds it anywhere.
_PROBE_DATA_BYTES = 4096 * MIB
#: What a call's `done` says when the process must not serve another call.
_UNHEALTHY = ("timeout", "memory", "cancelled", "lost")


def _shut_down(
    pool: RuntimePool, host_pool: concurrent.futures.ThreadPoolExecutor, stages: list[Path]
) -> None:
    pool.close()
    host_pool.shutdown(wait=False, cancel_futures=True)
    for stage in stages:
        remove_stage(stage)


class PluginRunner:
    """Runs plugin tools; one per plugin worker process. Thread-safe."""

    def __init__(self, deployment: Deployment, bridge: HostBridge, *, warm: bool = True) -> None:
        self.deployment = deployment
        self.bridge = bridge
        self._pool = RuntimePool(Spawner())
        self._slots = self._pool.slots
        #: slug -> why its calls cannot run (a stage that failed, no runtime here).
        self._unavailable: dict[str, str] = {}
        self._stages: list[Path] = []
        self._redactors: dict[str, Redactor] = {}
        self._host_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=HOST_THREADS, thread_name_prefix="vessel-plugin-host"
        )
        if deployment.plugins:
            remove_stale_stages()
            self._prepare(warm=warm)
        # A runner dropped without close() still kills its processes.
        self._finalizer = weakref.finalize(
            self, _shut_down, self._pool, self._host_pool, self._stages
        )

    def _prepare(self, *, warm: bool) -> None:
        try:
            node = node_binary()
        except OSError as exc:
            for slug in self.deployment.plugins:
                self._unavailable[slug] = str(exc)
            return
        base: int | None = None
        for slug, plugin in self.deployment.plugins.items():
            try:
                stage = make_stage(plugin.package_dir, plugin.sources, plugin.sources_sha256)
            except OSError as exc:
                self._unavailable[slug] = f"{exc}; run vessel-workers check"
                continue
            self._stages.append(stage)
            try:
                if base is None:
                    probe = Confinement(node=node, stage=stage, data_bytes=_PROBE_DATA_BYTES)
                    base = self._pool.spawner.submit(
                        functools.partial(probe_data_bytes, probe, heap_mb=plugin.memory_limit_mb)
                    ).result()
            except (OSError, TimeoutError) as exc:
                for other in self.deployment.plugins:
                    self._unavailable.setdefault(other, f"the plugin runtime cannot start: {exc}")
                return
            data = base + plugin.memory_limit_mb * MIB + DATA_MARGIN_BYTES
            self._slots[slug] = Slots(
                plugin=plugin,
                confinement=Confinement(node=node, stage=stage, data_bytes=data),
                config={
                    "mode": "serve",
                    "root": PLUGIN_ROOT,
                    "sources": list(plugin.sources),
                    "heapMb": plugin.memory_limit_mb,
                },
                idle=[],
            )
            self._redactors[slug] = Redactor(self.bridge.secrets(slug))
            if warm:
                self._pool.warm_up(self._slots[slug])

    def close(self) -> None:
        """Kill every runtime process and remove the stages (idempotent)."""
        self._finalizer()

    def run(
        self,
        *,
        call_id: str,
        agent: Agent,
        tool: PluginTool,
        arguments: dict[str, Any],
        owner: str,
        turn: str | None,
        initiator: Initiator,
        cancel: threading.Event | None = None,
    ) -> ToolResult:
        started = time.monotonic()
        logs: list[dict[str, Any]] = []

        def result(**fields: Any) -> ToolResult:
            return ToolResult(
                call_id=call_id,
                agent=agent.id,
                tool=tool.name,
                duration_ms=round((time.monotonic() - started) * 1000, 3),
                logs=tuple(logs),
                **fields,
            )

        def failed(text: str, outcome: str = "error") -> ToolResult:
            return result(is_error=True, output=text, outcome=outcome)

        if cancel is not None and cancel.is_set():
            return failed(CANCELLED_TEXT, "cancelled")
        slug = tool.plugin
        if slug in self._unavailable:
            return failed(f"{tool.name}: [plugin runtime unavailable: {self._unavailable[slug]}]")
        slots = self._slots.get(slug)
        if slots is None:
            return failed(f"{tool.name}: this worker has no plugin {slug!r}")
        try:
            process = self._pool.take(slots)
        except (OSError, concurrent.futures.CancelledError) as exc:
            return failed(f"{tool.name}: [plugin runtime error: {exc}]")
        ended = threading.Event()
        context = HostContext(
            call_id=call_id,
            agent=agent,
            tool=tool,
            plugin=slots.plugin,
            owner=owner,
            turn=turn,
            initiator=initiator,
            deadline=started + tool.timeout_seconds,
            cancel=ended,
        )
        healthy = False
        try:
            done = exchange(
                process, context, arguments, cancel, bridge=self.bridge, host_pool=self._host_pool
            )
            healthy = done.get("kind") not in _UNHEALTHY
        finally:
            ended.set()
            self._pool.give(slots, process, healthy=healthy)
            with contextlib.suppress(Exception):
                logs.extend(self.bridge.logs(call_id))
        redact = self._redactors.get(slug) or Redactor(())
        return outcome(tool, agent, done, redact=redact, failed=failed, result=result)
