"""Checking the model's arguments before anything runs (seeds 000 and 001).

The same rules for every tool: JSON no larger than the agent's
`max_argument_bytes`, nested at most `MAX_ARGUMENT_DEPTH` levels, with no
`NaN` or `Infinity` (`broker.arguments`, also applied at submit); a JSON
object. Declared and service tools' arguments must also be valid against the
tool's `parameters`; plugin tools (seed 002) get any JSON object, since their
handler is told the input is not validated against the schema. A refusal
raises `RefusedCall` with the text the model sees.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from broker.arguments import decode_arguments, not_an_object, too_deep
from broker.constants import DEFAULT_MAX_ARGUMENT_BYTES
from broker.errors import RefusedCall
from broker.model import DeclaredTool, PluginTool, Tool

__all__ = ["args_flags", "parse_arguments"]


def parse_arguments(
    tool: Tool, raw: object, *, max_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES
) -> dict[str, Any]:
    """Return the arguments as a dict, or raise `RefusedCall` saying what is wrong.

    `raw` is either JSON text (as the model wrote it) or an already decoded value;
    `max_bytes` is the agent's `max_argument_bytes`.
    """
    value = decode_arguments(tool.name, raw, max_bytes=max_bytes)
    if not isinstance(value, dict):
        raise not_an_object(tool.name)
    if isinstance(tool, PluginTool):
        # Seed 002: the handler gets the model's object as it is, not checked
        # against the schema ("check what you depend on").
        return value
    validator = jsonschema.Draft202012Validator(dict(tool.parameters))
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except RecursionError:
        # A schema that refers to itself ($ref) recurses per level of the
        # value too: past the depth check, it is still the value's depth.
        raise RefusedCall(too_deep(tool.name)) from None
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
