"""`search_tools` and `call_tool` at submit: answered here, or turned into the real call.

    routed = route_call(deployment, agent, tool, arguments)
    None      not a catalogue built-in: submit it as it is
    Answer    search_tools' answer (or a refusal): stored as the call's result, no worker
    Route     call_tool's tool and arguments: submitted exactly as a direct call of
              that tool (its lane, fairness, caps and limits; the result names it)

The arguments are read as a worker reads a tool's (`broker.arguments`): JSON
text or a decoded value, within the agent's `max_argument_bytes`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from broker.arguments import decode_arguments
from broker.catalogue.builtins import (
    CALL_TOOL,
    CATALOGUE_TOOLS,
    SEARCH_DEFAULT_LIMIT,
    SEARCH_MAX_LIMIT,
    SEARCH_TOOLS,
)
from broker.catalogue.catalogue import AgentCatalogue, Catalogue
from broker.errors import RefusedCall
from broker.model import Deployment
from broker.result import ToolResult

__all__ = ["Answer", "Route", "route_call", "search_text"]


@dataclass(frozen=True, slots=True)
class Answer:
    """A built-in's result, made at submit."""

    tool: str
    output: str
    is_error: bool = False
    #: "ok", or "refused" for arguments or a name the built-in cannot take.
    outcome: str = "ok"
    duration_ms: float = 0.0

    def result(self, call_id: str, agent: str) -> ToolResult:
        return ToolResult(
            call_id=call_id,
            agent=agent,
            tool=self.tool,
            is_error=self.is_error,
            output=self.output,
            duration_ms=self.duration_ms,
            outcome=self.outcome,
        )


@dataclass(frozen=True, slots=True)
class Route:
    """call_tool's real call: submit `tool` with `arguments` (a decoded JSON object)."""

    tool: str
    arguments: Any


def _refused(tool: str, what: str, again: str) -> Answer:
    return Answer(tool, f"{tool}: {what}; call {tool} again with {again}.", True, "refused")


_SEARCH_AGAIN = '{"query": "a few words for what you need"}'
_CALL_AGAIN = '{"name": "<a name search_tools returned>", "arguments": {...}}'


def search_text(entry: AgentCatalogue, query: str, limit: int, max_chars: int) -> str:
    """What the model sees of a search: a JSON array of matches, or a text saying none."""
    found = entry.search(query, limit)
    if not found:
        close = entry.suggest(query)
        hint = (
            f" Words the tools use that are close to yours: {', '.join(close)}."
            if close
            else " Try other words: what you want done, or the kind of thing it works on."
        )
        if not entry.placement.with_builtins:
            return (
                "No tool matches: every tool you can use is already in your tool list; "
                "call it by its name."
            )
        return f"No tool matches {query!r}.{hint}"
    text = json.dumps(found, ensure_ascii=False)
    # Fewer matches rather than a cut JSON text past the agent's output limit.
    while len(text) > max_chars and len(found) > 1:
        found.pop()
        text = json.dumps(found, ensure_ascii=False)
    return text


def _search(entry: AgentCatalogue, value: Any) -> Answer:
    if not isinstance(value, dict):
        return _refused(SEARCH_TOOLS, "the arguments must be a JSON object", _SEARCH_AGAIN)
    query = value.get("query")
    if not isinstance(query, str) or not query.strip():
        return _refused(SEARCH_TOOLS, '"query" must be a non-empty string', _SEARCH_AGAIN)
    limit = value.get("limit", SEARCH_DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= SEARCH_MAX_LIMIT:
        return _refused(
            SEARCH_TOOLS,
            f'"limit" must be an integer from 1 to {SEARCH_MAX_LIMIT}, not {json.dumps(limit)}',
            f'"limit" left out (it is {SEARCH_DEFAULT_LIMIT}) or within 1 to {SEARCH_MAX_LIMIT}',
        )
    max_chars = entry.agent.settings.tool_output_chars
    return Answer(SEARCH_TOOLS, search_text(entry, query, limit, max_chars))


def _not_callable(name: str) -> Answer:
    return Answer(
        CALL_TOOL,
        f"call_tool: there is no tool {name!r} you can call. Use search_tools to find the "
        "tool you need, then call call_tool with the exact name it returns.",
        True,
        "refused",
    )


def _call(entry: AgentCatalogue, value: Any) -> Answer | Route:
    if not isinstance(value, dict):
        return _refused(CALL_TOOL, "the arguments must be a JSON object", _CALL_AGAIN)
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return _refused(CALL_TOOL, '"name" must be the name of a tool', _CALL_AGAIN)
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return _refused(CALL_TOOL, '"arguments" must be a JSON object', _CALL_AGAIN)
    if name == SEARCH_TOOLS:
        return _search(entry, arguments)
    agent = entry.agent
    if name not in agent.tools or agent.access.refusal(name) is not None:
        return _not_callable(name)
    return Route(name, arguments)


def route_call(
    deployment: Deployment, agent_id: str, tool: str, arguments: Any
) -> Answer | Route | None:
    """What submit does with a call of `tool` (see the module's docstring).

    UnknownAgent for an agent the deployment does not have.
    """
    if tool not in CATALOGUE_TOOLS:
        return None
    started = time.perf_counter()
    entry = Catalogue.of(deployment).agent(agent_id)
    try:
        value = decode_arguments(tool, arguments, max_bytes=entry.agent.settings.max_argument_bytes)
    except RefusedCall as exc:
        return Answer(tool, str(exc), True, "refused")
    routed = _search(entry, value) if tool == SEARCH_TOOLS else _call(entry, value)
    if isinstance(routed, Answer):
        elapsed = round((time.perf_counter() - started) * 1000, 3)
        return Answer(routed.tool, routed.output, routed.is_error, routed.outcome, elapsed)
    return routed
