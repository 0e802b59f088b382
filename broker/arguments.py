"""The model's arguments: the checks both sides make before any schema or tool sees them.

    submit_problem(tool, raw, max_bytes)   at submit: why the call is refused, or None
    decode_arguments(tool, raw, max_bytes) at the worker: the decoded value, or RefusedCall

`raw` is JSON text as the model wrote it (str or bytes) or an already decoded
value. Each refusal is a `RefusedCall` whose text tells the model what to fix:

- size: the UTF-8 length of the text, or of the compact JSON text of a
  decoded value, is at most the agent's `max_argument_bytes`;
- depth: at most `MAX_ARGUMENT_DEPTH` nested objects and arrays, checked
  iteratively (deeper values make the JSON parser and the schema validator
  recurse past Python's limit);
- JSON only: `NaN`, `Infinity` and `-Infinity` (as text, or as decoded
  floats), numbers too large for a double, and integers longer than Python
  reads (`sys.get_int_max_str_digits()`, 4300 digits by default) are refused
  with a text naming the problem.

The submit side checks text for size only (the worker parses it); a decoded
value is walked there too, so that nothing the model sent can make encoding
the call's message raise.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from broker.constants import MAX_ARGUMENT_DEPTH
from broker.errors import RefusedCall

__all__ = [
    "argument_bytes",
    "decode_arguments",
    "not_an_object",
    "submit_problem",
    "too_deep",
    "too_large",
]


#: Built once: `json.dumps` with options makes a new encoder at every call.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def too_large(tool: str, size: int, max_bytes: int) -> str:
    return (
        f"{tool}: the arguments are {size} bytes; at most {max_bytes} bytes may be given; "
        f"call {tool} again with smaller arguments."
    )


def too_deep(tool: str) -> str:
    return (
        f"{tool}: the arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep; "
        f"call {tool} again with flatter arguments."
    )


def _not_json(tool: str, what: str) -> RefusedCall:
    return RefusedCall(
        f"{tool}: the arguments hold {what}, which is not JSON; call {tool} again with valid JSON."
    )


def _too_many_digits(tool: str) -> RefusedCall:
    limit = sys.get_int_max_str_digits()
    return RefusedCall(
        f"{tool}: the arguments hold an integer of more than {limit} digits, more than can be "
        f"read; call {tool} again with smaller numbers (or the number as a string)."
    )


def _too_big_number(tool: str, text: str) -> RefusedCall:
    shown = text if len(text) <= 24 else text[:20] + "..."
    return RefusedCall(
        f"{tool}: the arguments hold the number {shown}, too large to read; "
        f"call {tool} again with smaller numbers (or the number as a string)."
    )


def not_an_object(tool: str) -> RefusedCall:
    return RefusedCall(
        f"{tool}: the arguments must be a JSON object; call {tool} again with valid JSON."
    )


def _constant_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _check_value(tool: str, value: object) -> None:
    """Walk a decoded value without recursion: depth, non-finite floats, huge ints, types."""
    digits = sys.get_int_max_str_digits()
    # Below this many bits an int has fewer digits than the limit (log10(2) < 0.302).
    safe_bits = 3 * digits
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_ARGUMENT_DEPTH:
                raise RefusedCall(too_deep(tool))
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            if depth > MAX_ARGUMENT_DEPTH:
                raise RefusedCall(too_deep(tool))
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _not_json(tool, _constant_name(item))
        elif isinstance(item, int):
            if digits and not isinstance(item, bool) and item.bit_length() > safe_bits:
                try:
                    str(item)
                except ValueError:
                    raise _too_many_digits(tool) from None
        elif item is not None and not isinstance(item, str):
            raise not_an_object(tool)


def argument_bytes(tool: str, raw: object) -> int:
    """The size of the arguments: UTF-8 bytes of the text, or of the compact JSON of a value.

    A value must have passed `_check_value`; one JSON cannot encode (a key
    of another type) is refused as not an object.
    """
    if isinstance(raw, bytes):
        return len(raw)
    if isinstance(raw, str):
        return len(raw.encode("utf-8", "surrogatepass"))
    try:
        text = _COMPACT.encode(raw)
    except (TypeError, ValueError):
        raise not_an_object(tool) from None
    return len(text.encode("utf-8", "surrogatepass"))


def submit_problem(tool: str, raw: object, *, max_bytes: int) -> str | None:
    """Why the call must be refused at submit (the text the model sees), or None."""
    try:
        if not isinstance(raw, str | bytes):
            _check_value(tool, raw)
        size = argument_bytes(tool, raw)
    except RefusedCall as exc:
        return exc.model_text
    if size > max_bytes:
        return too_large(tool, size, max_bytes)
    return None


class _Refused(Exception):
    """Raised inside the JSON parser's hooks; carries the refusal out."""

    def __init__(self, refusal: RefusedCall) -> None:
        self.refusal = refusal


def _loads(tool: str, raw: str | bytes) -> object:
    def constant(name: str) -> Any:
        raise _Refused(_not_json(tool, name))

    def integer(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise _Refused(_too_many_digits(tool)) from None

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):  # 1e400
            raise _Refused(_too_big_number(tool, text))
        return value

    try:
        return json.loads(raw, parse_constant=constant, parse_int=integer, parse_float=number)
    except _Refused as exc:
        raise exc.refusal from None
    except RecursionError:
        raise RefusedCall(too_deep(tool)) from None
    except ValueError:  # not JSON text at all (UnicodeDecodeError included)
        raise not_an_object(tool) from None


def decode_arguments(tool: str, raw: object, *, max_bytes: int) -> object:
    """The arguments as a value (not yet known to be an object), or `RefusedCall`."""
    if isinstance(raw, str | bytes):
        size = argument_bytes(tool, raw)
        if size > max_bytes:
            raise RefusedCall(too_large(tool, size, max_bytes))
        value = _loads(tool, raw)
        _check_value(tool, value)
        return value
    _check_value(tool, raw)
    size = argument_bytes(tool, raw)
    if size > max_bytes:
        raise RefusedCall(too_large(tool, size, max_bytes))
    return raw
