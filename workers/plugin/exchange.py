"""One call's conversation with its runtime process: the call out, host calls answered, the end.

    exchange(...) -> send {"op": "call", ...}
        -> each {"op": "host", ...} line answered by HostBridge.call on the host pool
        -> the call's {"op": "done", ...} line (or a synthetic one: timeout, cancelled, lost)

The runtime enforces the time limit itself; the worker gives up on a process
`KILL_GRACE_SECONDS` after it (the caller then kills it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from typing import Any

from workers.plugin.host.context import HostBridge, HostContext, HostFailed, HostRefused
from workers.plugin.process import ProtocolError, RuntimeEnded, RuntimeProcess

__all__ = [
    "KILL_GRACE_SECONDS",
    "MAX_HOST_CALLS",
    "MAX_PENDING_HOST_CALLS",
    "exchange",
]

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

_log = logging.getLogger(__name__)


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


def exchange(
    process: RuntimeProcess,
    context: HostContext,
    arguments: dict[str, Any],
    cancel: threading.Event | None,
    *,
    bridge: HostBridge,
    host_pool: concurrent.futures.ThreadPoolExecutor,
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
            return _lost(process, context)
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
                host_pool.submit(_answer, bridge, process, context, message, counts)
            else:
                _send_answer(process, context, message, {"error": refusal})


def _lost(process: RuntimeProcess, context: HostContext) -> dict[str, Any]:
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


def _send_answer(
    process: RuntimeProcess, context: HostContext, message: dict[str, Any], body: dict[str, Any]
) -> None:
    answer = {"op": "answer", "callId": context.call_id, "id": message.get("id"), **body}
    try:
        process.send(answer)
    except (ValueError, TypeError):
        chain = message.get("chain")
        with contextlib.suppress(RuntimeEnded):
            process.send(
                {
                    **{k: answer[k] for k in ("op", "callId", "id")},
                    "error": f"host.{chain}: the answer is not JSON",
                }
            )
    except RuntimeEnded:
        pass


def _answer(
    bridge: HostBridge,
    process: RuntimeProcess,
    context: HostContext,
    message: dict[str, Any],
    counts: _HostCounts,
) -> None:
    """Answer one `host.<chain>(...)` with the bridge's value or its refusal, then count it."""
    try:
        chain = message.get("chain")
        args = message.get("args")
        if not isinstance(chain, str) or not isinstance(args, list):
            _send_answer(process, context, message, {"error": "host: a malformed host call"})
            return
        if context.cancel.is_set():
            return
        try:
            # The chain exactly as the handler called it: the bridge checks it
            # against the derived permissions, so no built name widens them.
            body: dict[str, Any] = {"value": bridge.call(context, chain, args)}
        except (HostRefused, HostFailed) as exc:
            body = {"error": str(exc)}
        except Exception:
            _log.exception("plugin %s: host.%s failed", context.tool.plugin, chain)
            body = {"error": f"host.{chain}: the worker failed to answer"}
        _send_answer(process, context, message, body)
    finally:
        counts.done()
