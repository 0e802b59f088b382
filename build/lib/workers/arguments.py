"""Checking the model's arguments before anything runs (seeds 000 and 001).

The same rules for declared and service tools: a JSON object, valid against the
tool's `parameters`. A refusal raises `RefusedCall` with the text the model sees.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from broker.errors import RefusedCall
from broker.model import DeclaredTool, Tool

__all__ = ["args_flags", "parse_arguments"]


def _not_an_object(tool: str) -> RefusedCall:
    return RefusedCall(
        f"{tool}: the arguments must be a JSON object; call {tool} again with valid JSON."
    )


def parse_arguments(tool: Tool, raw: object) -> dict[str, Any]:
    """Return the arguments as a dict, or raise `RefusedCall` saying what is wrong.

    `raw` is either JSON text (as the model wrote it) or an already decoded value.
    """
    value: object = raw
    if isinstance(raw, str | bytes):
        try:
            value = json.loads(raw)
        except ValueError:
            raise _not_an_object(tool.name) from None
    if not isinstance(value, dict):
        raise _not_an_object(tool.name)
    validator = jsonschema.Draft202012Validator(dict(tool.parameters))
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(the arguments)"
        raise RefusedCall(
            f"{tool.name}: invalid arguments at {where}: {error.message}; "
            f"call {tool.name} again with arguments that match its parameters."
        )
    if isinstance(tool, DeclaredTool) and tool.input == "args":
        declared = set(tool.parameters.get("properties", {}) or {})
        unknown = sorted(set(value) - declared)
        if unknown:
            raise RefusedCall(
                f"{tool.name}: unknown argument {', '.join(unknown)}; "
                f"only {', '.join(sorted(declared)) or 'no arguments'} may be given."
            )
    return value


def args_flags(arguments: dict[str, Any]) -> list[str]:
    """Seed 000: each argument becomes `--name=value`, the value passed with str()."""
    return [f"--{name}={value}" for name, value in arguments.items()]
