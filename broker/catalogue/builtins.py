"""The catalogue's two built-in tools: `search_tools` and `call_tool`.

They end the list whenever an agent has tools the model is not given
(deferred ones, or more than `max_listed_tools`): `search_tools` finds those
tools by what they do, `call_tool` runs one of them by name. Both are among
the seven built-in names (`broker.constants.BUILTIN_TOOLS`), which no
declared, service or plugin tool may take.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CALL_TOOL",
    "CATALOGUE_TOOLS",
    "SEARCH_DEFAULT_LIMIT",
    "SEARCH_MAX_LIMIT",
    "SEARCH_TOOLS",
    "builtin_listing",
]

SEARCH_TOOLS = "search_tools"
CALL_TOOL = "call_tool"
#: The built-ins the catalogue answers itself (the others are the vessel's).
CATALOGUE_TOOLS = frozenset({SEARCH_TOOLS, CALL_TOOL})

#: `search_tools`'s `limit`: 5 unless given, 1 to 20.
SEARCH_DEFAULT_LIMIT = 5
SEARCH_MAX_LIMIT = 20

_SEARCH: dict[str, Any] = {
    "name": SEARCH_TOOLS,
    "description": (
        "Find tools you can use that are not in your tool list. Describe in a few words what "
        "you want to do; returns the best matching tools with their names, descriptions and "
        "parameters. Run one with call_tool."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "Words for what the tool should do, e.g. 'weather forecast'",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": SEARCH_MAX_LIMIT,
                "description": f"How many tools to return at most (default {SEARCH_DEFAULT_LIMIT})",
            },
        },
        "required": ["query"],
    },
}

_CALL: dict[str, Any] = {
    "name": CALL_TOOL,
    "description": (
        "Run a tool that search_tools found. Give the tool's exact name and its arguments as "
        "an object matching the tool's parameters; returns that tool's result."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "name": {
                "type": "string",
                "description": "The tool's exact name, as search_tools returned it",
            },
            "arguments": {
                "type": "object",
                "description": "The tool's arguments, matching its parameters",
            },
        },
        "required": ["name", "arguments"],
    },
}


def _copy(entry: dict[str, Any]) -> dict[str, Any]:
    parameters = entry["parameters"]
    properties = {k: dict(v) for k, v in parameters["properties"].items()}
    return {
        "name": entry["name"],
        "description": entry["description"],
        "parameters": {
            **parameters,
            "properties": properties,
            "required": list(parameters["required"]),
        },
    }


def builtin_listing() -> list[dict[str, Any]]:
    """`search_tools` then `call_tool` as the model is given them (fresh copies)."""
    return [_copy(_SEARCH), _copy(_CALL)]
