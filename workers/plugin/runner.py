"""`PluginRunner`: plugin calls, each in a fresh isolate of a warm, confined runtime process.

    PluginRunner.run(call) -> a warm RuntimeProcess of the tool's plugin (one call at a time)
        -> its waiting isolate (a worker thread, sources already evaluated) runs the handler
        -> host.<chain>(...) lines answered by HostBridge.call on a thread pool
        -> {"op": "done"} -> ToolResult; the process starts its next isolate at once

A process serves one call at a time; the pool of each plugin grows to the
number of calls at once and keeps at least one process warm. A call that hits
a limit (time, memory) or breaks the protocol takes its process down: it is
killed and replaced (off the call's path), and no other call sees it.

Results (seed 002, issue 16):

- the return value as JSON text (`undefined` -> `null`), cut to the agent's
  `tool_output_chars`, with the plugin's secrets redacted;
- a throw or a rejected promise: `<final name>: <message>` (no stack);
- a value JSON cannot hold (BigInt, a cycle, a function): `<final name>: the
  result is not JSON: <why>`;
- the time limit: `[timed out after N s]`;
- the memory limit: `<final name>: [memory limit of N MB reached]`.

Every runtime process is spawned by one long-lived thread (`_Spawner`), since
bwrap's --die-with-parent fires when the spawning thread ends.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from broker.model import Agent, Deployment, Plugin, PluginTool
from broker.protocol import CANCELLED_TEXT, Initiator, ToolResult
from workers.output import cut_output
from workers.plugin.confine import PLUGIN_ROOT, Confinement
from workers.plugin.host.context import HostBridge, HostContext, HostFailed, HostRefused
from workers.plugin.process import (
    DATA_MARGIN_BYTES,
    ProtocolError,
    RuntimeEnded,
    RuntimeProcess,
    probe_data_bytes,
)
from workers.plugin.stage import make_stage, node_binary, remove_stage, remove_stale_stages
from workers.sandbox.limits import MIB
from workers.sandbox.runner import timed_out_text
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
#: Host calls of one call waiting for an answer at once: beyond this a call is
#: refused at once (a loop of un-awaited host calls would otherwise queue
#: without bound in the worker).
MAX_PENDING_HOST_CALLS = 64
#: Host calls of one call in all: 10,000 is far beyond any handler's need.
MAX_HOST_CALLS = 10_000
#: The runtime enforces the time limit itself (it ends the isolate); the
#: worker kills the whole process if no answer came this long after it.
KILL_GRACE_SECONDS = 2.0
#: The isolate sends this many characters beyond tool_output_chars, so a
#: secret straddling the cut is still whole when redaction runs.
_REDACT_MARGIN_CHARS = 4096
_TICK = 0.05
#: The probe runs before the limit is known: 4 GiB holds it anywhere.
_PROBE_DATA_BYTES = 4096 * MIB

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


def memory_text(limit_mb: int) -> str:
    return f"[memory limit of {limit_mb} MB reached]"


def _shut_down(
    slots: dict[str, _Slots],
    spawner: _Spawner,
    host_pool: concurrent.futures.ThreadPoolExecutor,
    stages: list[Path],
) -> None:
    idle = [p for s in slots.values() for p in s.idle]
    for each in slots.values():
        each.idle.clear()
    for process in idle:
        process.kill()
    spawner.close()
    host_pool.shutdown(wait=False, cancel_futures=True)
    for stage in stages:
        remove_stage(stage)


class _HostCounts:
    """The host calls of one plugin call: how many wait, how many there were."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending = 0
        self.total = 0

    def admit(self) -> str | None:
        """None if one more host call may go to the bridge, else why not."""
        with self._lock:
            if self.total >= MAX_HOST_CALLS:
                return f"host: a call may make at most {MAX_HOST_CALLS} host calls"
            if self.pending >= MAX_PENDING_HOST_CALLS:
                return f"host: at most {MAX_PENDING_HOST_CALLS} host calls may wait at once"
            self.total += 1
            self.pending += 1
            return None

    def done(self) -> None:
        with self._lock:
            self.pending -= 1


class _Spawner:
    """One long-lived thread that starts every runtime process (see the module docstring)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = (
            queue.Queue()
        )
        self._thread = threading.Thread(
            target=self._loop, name="vessel-plugin-spawner", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)

    def submit(self, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)


@dataclass(slots=True)
class _Slots:
    """The runtime processes of one plugin: the idle ones, and how to start one."""

    plugin: Plugin
    confinement: Confinement
    config: dict[str, Any]
    idle: list[RuntimeProcess]
    warming: int = 0


class PluginRunner:
    """Runs plugin tools; one per plugin worker process. Thread-safe."""

    def __init__(self, deployment: Deployment, bridge: HostBridge, *, warm: bool = True) -> None:
        self.deployment = deployment
        self.bridge = bridge
        self._lock = threading.Lock()
        self._closed = False
        self._slots: dict[str, _Slots] = {}
        #: slug -> why its calls cannot run (a stage that failed, no runtime here).
        self._unavailable: dict[str, str] = {}
        self._stages: list[Path] = []
        self._redactors: dict[str, Redactor] = {}
        self._spawner = _Spawner()
        self._host_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=HOST_THREADS, thread_name_prefix="vessel-plugin-host"
        )
        if deployment.plugins:
            remove_stale_stages()
            self._prepare(warm=warm)
        # A runner dropped without close() still kills its processes.
        self._finalizer = weakref.finalize(
            self, _shut_down, self._slots, self._spawner, self._host_pool, self._stages
        )

    # --- set-up ------------------------------------------------------------

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
                    base = self._spawner.submit(
                        functools.partial(probe_data_bytes, probe, heap_mb=plugin.memory_limit_mb)
                    ).result()
            except (OSError, TimeoutError) as exc:
                for other in self.deployment.plugins:
                    self._unavailable.setdefault(other, f"the plugin runtime cannot start: {exc}")
                return
            data = base + plugin.memory_limit_mb * MIB + DATA_MARGIN_BYTES
            self._slots[slug] = _Slots(
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
                self._warm_up(self._slots[slug])

    def _start(self, slots: _Slots) -> RuntimeProcess:
        return self._spawner.submit(
            lambda: RuntimeProcess.start(slots.confinement, slots.config)
        ).result()

    def _warm_up(self, slots: _Slots) -> None:
        """Start one process for `slots` off the caller's path, unless one is idle or coming."""
        with self._lock:
            if self._closed or slots.idle or slots.warming:
                return
            slots.warming += 1

        def started(future: concurrent.futures.Future[RuntimeProcess]) -> None:
            with self._lock:
                slots.warming -= 1
                if future.exception() is not None:
                    _log.warning(
                        "plugin %s: a runtime did not start: %s",
                        slots.plugin.slug,
                        future.exception(),
                    )
                    return
                process = future.result()
                if not self._closed:
                    slots.idle.append(process)
                    return
            process.kill()

        self._spawner.submit(
            lambda: RuntimeProcess.start(slots.confinement, slots.config)
        ).add_done_callback(started)

    def _take(self, slots: _Slots) -> RuntimeProcess:
        with self._lock:
            while slots.idle:
                process = slots.idle.pop()
                if process.alive():
                    return process
                process.kill()
        return self._start(slots)

    def _give(self, slots: _Slots, process: RuntimeProcess, *, healthy: bool) -> None:
        if healthy and process.alive():
            with self._lock:
                if not self._closed:
                    slots.idle.append(process)
                    return
        process.kill()
        self._warm_up(slots)

    def close(self) -> None:
        """Kill every runtime process and remove the stages (idempotent)."""
        with self._lock:
            self._closed = True
        self._finalizer()

    # --- the call ------------------------------------------------------------

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
            process = self._take(slots)
        except (OSError, concurrent.futures.CancelledError) as exc:
            return failed(f"{tool.name}: [plugin runtime error: {exc}]")
        ended = threading.Event()
        deadline = started + tool.timeout_seconds
        context = HostContext(
            call_id=call_id,
            agent=agent,
            tool=tool,
            plugin=slots.plugin,
            owner=owner,
            turn=turn,
            initiator=initiator,
            deadline=deadline,
            cancel=ended,
        )
        healthy = False
        try:
            done = self._exchange(process, context, arguments, cancel)
            healthy = done.get("kind") not in ("timeout", "memory", "cancelled", "lost")
        finally:
            ended.set()
            self._give(slots, process, healthy=healthy)
            with contextlib.suppress(Exception):
                logs.extend(self.bridge.logs(call_id))
        return self._result(tool, agent, done, failed, result)

    def _exchange(
        self,
        process: RuntimeProcess,
        context: HostContext,
        arguments: dict[str, Any],
        cancel: threading.Event | None,
    ) -> dict[str, Any]:
        """Send the call, answer its host calls, return its `done` message (or a synthetic one)."""
        tool = context.tool
        keep = context.agent.settings.tool_output_chars + _REDACT_MARGIN_CHARS
        timeout_ms = max(1, int((context.deadline - time.monotonic()) * 1000))
        try:
            process.send(
                {
                    "op": "call",
                    "callId": context.call_id,
                    "key": tool.key,
                    "input": arguments,
                    "context": {
                        "callId": context.call_id,
                        "initiator": context.initiator.to_message(),
                    },
                    "timeoutMs": timeout_ms,
                    "keepChars": keep,
                }
            )
        except (ValueError, TypeError):
            return {"kind": "error", "message": "the arguments are not JSON"}
        except RuntimeEnded:
            return {"kind": "lost", "message": "the runtime process ended before the call"}
        process.calls += 1
        hard_deadline = context.deadline + KILL_GRACE_SECONDS
        counts = _HostCounts()
        while True:
            if cancel is not None and cancel.is_set():
                return {"kind": "cancelled"}
            now = time.monotonic()
            if now >= hard_deadline:
                return {"kind": "timeout"}
            try:
                message = process.read(min(hard_deadline, now + _TICK))
            except RuntimeEnded:
                return self._lost(process, context)
            except ProtocolError as exc:
                _log.warning("plugin %s: %s", tool.plugin, exc)
                return {"kind": "lost", "message": "the runtime broke its protocol"}
            if message is None:
                continue
            op = message.get("op")
            if op == "done":
                if message.get("callId") != context.call_id:
                    continue  # a stale line (an earlier call's): never this call's end
                return message
            if op == "host":
                refusal = counts.admit()
                if refusal is None:
                    self._host_pool.submit(self._answer, process, context, message, counts)
                else:
                    self._refuse(process, context, message, refusal)

    def _lost(self, process: RuntimeProcess, context: HostContext) -> dict[str, Any]:
        """The process died mid-call: out of memory (the usual cause) or killed from inside."""
        with contextlib.suppress(Exception):
            process.popen.wait(timeout=1.0)
        tail = process.stderr_tail()
        _log.warning(
            "plugin %s: runtime ended mid-call %s (status %s): %s",
            context.tool.plugin,
            context.call_id,
            process.popen.returncode,
            tail[-500:].strip(),
        )
        if "out of memory" in tail.lower() or "allocation failed" in tail.lower():
            return {"kind": "memory"}
        return {"kind": "lost", "message": "the plugin's runtime ended during the call"}

    def _refuse(
        self, process: RuntimeProcess, context: HostContext, message: dict[str, Any], why: str
    ) -> None:
        answer = {"op": "answer", "callId": context.call_id, "id": message.get("id"), "error": why}
        with contextlib.suppress(RuntimeEnded, ValueError, TypeError):
            process.send(answer)

    def _answer(
        self,
        process: RuntimeProcess,
        context: HostContext,
        message: dict[str, Any],
        counts: _HostCounts,
    ) -> None:
        """Answer one `host.<chain>(...)`, then count it as answered."""
        try:
            self._answer_one(process, context, message)
        finally:
            counts.done()

    def _answer_one(
        self, process: RuntimeProcess, context: HostContext, message: dict[str, Any]
    ) -> None:
        """Answer one `host.<chain>(...)` with the bridge's value or its refusal."""
        chain = message.get("chain")
        args = message.get("args")
        answer: dict[str, Any] = {
            "op": "answer",
            "callId": context.call_id,
            "id": message.get("id"),
        }
        if not isinstance(chain, str) or not isinstance(args, list):
            answer["error"] = "host: a malformed host call"
        elif context.cancel.is_set():
            return
        else:
            try:
                # The chain exactly as the handler called it: the bridge checks it
                # against the derived permissions, so no built name widens them.
                answer["value"] = self.bridge.call(context, chain, args)
            except (HostRefused, HostFailed) as exc:
                answer["error"] = str(exc)
            except Exception:
                _log.exception("plugin %s: host.%s failed", context.tool.plugin, chain)
                answer["error"] = f"host.{chain}: the worker failed to answer"
        try:
            process.send(answer)
        except (ValueError, TypeError):
            process.send(
                {
                    **{k: answer[k] for k in ("op", "callId", "id")},
                    "error": f"host.{chain}: the answer is not JSON",
                }
            )
        except RuntimeEnded:
            pass

    def _result(
        self,
        tool: PluginTool,
        agent: Agent,
        done: dict[str, Any],
        failed: Callable[..., ToolResult],
        result: Callable[..., ToolResult],
    ) -> ToolResult:
        redact = self._redactors.get(tool.plugin) or Redactor(())
        kind = done.get("kind")
        if done.get("ok") is True and isinstance(done.get("text"), str):
            text = redact(done["text"])
            total = done.get("total")
            sent = len(done["text"])
            beyond = total - sent if isinstance(total, int) and total > sent else 0
            output, dropped = cut_output(
                text, agent.settings.tool_output_chars, already_dropped=beyond
            )
            return result(is_error=False, output=output, dropped_chars=dropped, outcome="ok")
        message = redact(str(done.get("message", "")))
        if kind == "timeout":
            return failed(timed_out_text(tool.timeout_seconds), "timeout")
        if kind == "memory":
            return failed(f"{tool.name}: {memory_text(tool.memory_limit_mb)}", "killed")
        if kind == "cancelled":
            return failed(CANCELLED_TEXT, "cancelled")
        if kind == "serialize":
            return failed(f"{tool.name}: the result is not JSON: {message}")
        if kind == "load":
            return failed(f"{tool.name}: the plugin's sources failed to load: {message}")
        if kind == "lost":
            return failed(f"{tool.name}: [{message}]", "killed")
        return failed(f"{tool.name}: {message}")
