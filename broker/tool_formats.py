"""The tool list in each model API's own tool format.

    openai      Chat Completions function tools:
                {"type": "function", "function": {name, description, parameters}}
    anthropic   Messages API tools: {name, description, input_schema}
    mcp         Model Context Protocol `tools/list` entries: {name, description, inputSchema}

All three APIs refuse a tool name that does not match `^[a-zA-Z0-9_-]{1,64}$`
(OpenAI and Anthropic say so; MCP clients pass the name on to one of them), so a
final name outside it is an error naming it rather than a list the API rejects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from broker.catalogue import Catalogue
from broker.errors import ConfigError
from broker.model import Deployment

__all__ = ["FORMATS", "TOOL_NAME_PATTERN", "Format", "InvalidToolName", "in_format", "listed"]

Format = Literal["openai", "anthropic", "mcp"]
FORMATS: tuple[Format, ...] = ("openai", "anthropic", "mcp")

#: What OpenAI's and Anthropic's APIs accept as a tool name (64 characters at most).
TOOL_NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class InvalidToolName(ConfigError):
    """A final tool name the model APIs would refuse."""


def _one(entry: Mapping[str, Any], fmt: Format) -> dict[str, Any]:
    name = str(entry["name"])
    if TOOL_NAME_PATTERN.fullmatch(name) is None:
        raise InvalidToolName(
            f"tool name {name!r} ({len(name)} characters) is refused by the model APIs: "
            "a name must be 1 to 64 letters, digits, '_' or '-'"
        )
    description = str(entry.get("description", ""))
    schema = dict(entry.get("parameters") or {"type": "object"})
    if fmt == "openai":
        return {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": schema},
        }
    if fmt == "anthropic":
        return {"name": name, "description": description, "input_schema": schema}
    if fmt == "mcp":
        return {"name": name, "description": description, "inputSchema": schema}
    raise ValueError(f"unknown tool format {fmt!r} (formats: {', '.join(FORMATS)})")


def in_format(listing: Iterable[Mapping[str, Any]], fmt: Format) -> list[dict[str, Any]]:
    """`listing` (`{name, description, parameters}` entries) in `fmt`; InvalidToolName."""
    return [_one(entry, fmt) for entry in listing]


def listed(deployment: Deployment, agent_id: str) -> list[dict[str, Any]]:
    """The tool list the model is given (`{name, description, parameters}`).

    The catalogue's listed tools, with `search_tools` and `call_tool` when some
    are not listed (`broker.catalogue`). UnknownAgent for an agent it does not have.
    """
    return Catalogue.of(deployment).listed(agent_id)
