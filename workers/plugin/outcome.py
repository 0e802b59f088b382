"""What a plugin call's `done` message becomes: the ToolResult the model reads (seed 002, issue 16).

- the return value as JSON text (`undefined` -> `null`), cut to the agent's
  `tool_output_chars`, with the plugin's secrets redacted;
- a throw or a rejected promise: `<final name>: <message>` (no stack);
- a value JSON cannot hold (BigInt, a cycle, a function): `<final name>: the
  result is not JSON: <why>`;
- the time limit: `[timed out after N s]`;
- the memory limit: `<final name>: [memory limit of N MB reached]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.model import Agent, PluginTool
from broker.protocol import CANCELLED_TEXT, ToolResult
from workers.output import cut_output
from workers.sandbox.runner import timed_out_text
from workers.service.redact import Redactor

__all__ = ["memory_text", "outcome"]


def memory_text(limit_mb: int) -> str:
    return f"[memory limit of {limit_mb} MB reached]"


def outcome(
    tool: PluginTool,
    agent: Agent,
    done: dict[str, Any],
    *,
    redact: Redactor,
    failed: Callable[..., ToolResult],
    result: Callable[..., ToolResult],
) -> ToolResult:
    """The result of `done`; `failed(text, outcome)` and `result(**fields)` build it."""
    kind = done.get("kind")
    if done.get("ok") is True and isinstance(done.get("text"), str):
        text = redact(done["text"])
        total = done.get("total")
        # `total` is JavaScript's length: UTF-16 code units. Compare it with the
        # sent text's length in the same units, or every character outside the
        # BMP (an emoji: 2 units, 1 Python character) reads as one dropped.
        sent = len(done["text"].encode("utf-16-le", "surrogatepass")) // 2
        beyond = total - sent if isinstance(total, int) and total > sent else 0
        output, dropped = cut_output(text, agent.settings.tool_output_chars, already_dropped=beyond)
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
