"""The texts the model sees for a service call, word for word from seed 001.

Where the seed is silent this module decides, and says so:

- A JSON body is an object or an array that parses; it is re-indented with
  `json.dumps(indent=2, ensure_ascii=False)`. A bare scalar, or a body that does
  not parse, is passed as is. 4xx bodies are passed exactly as sent (the seed
  re-indents only the 2xx body).
- A body that is empty or only whitespace becomes `[HTTP <status>, empty]`.
- A service that closes the connection before its answer is complete (or that
  answers with something that is not HTTP) is `unreachable`: no usable answer
  reached the vessel, and a partial body must not pass for a whole one.
"""

from __future__ import annotations

import json
from typing import Any

from broker.protocol import CANCELLED_TEXT, format_seconds

__all__ = [
    "CANCELLED",
    "empty",
    "failed",
    "format_seconds",
    "no_answer",
    "render_body",
    "too_large",
    "unreachable",
]

#: The text of a call stopped because its turn was cancelled (as for declared tools).
CANCELLED = CANCELLED_TEXT

#: A re-indented body is given up (the body is passed as is) past this many
#: characters: deep nesting re-indents to the square of its size, and a 1 MB
#: body must not become hundreds of megabytes in a worker.
_REINDENT_LIMIT_CHARS = 3_000_000


def failed(tool: str, status: int) -> str:
    return f"{tool} failed (HTTP {status})"


def no_answer(tool: str, seconds: float) -> str:
    return f"{tool}: the service did not answer within {format_seconds(seconds)} s"


def unreachable(tool: str) -> str:
    return f"{tool}: the service is unreachable"


def too_large(tool: str) -> str:
    return f"{tool}: the service's answer was too large"


def empty(status: int) -> str:
    return f"[HTTP {status}, empty]"


def _no_constants(name: str) -> Any:
    # NaN and Infinity are not JSON; a body using them is passed as is.
    raise ValueError(name)


def _reindent(text: str) -> str | None:
    """`text` re-indented when it is a JSON object or array, else None."""
    if text.lstrip()[:1] not in ("{", "["):
        return None
    try:
        value = json.loads(text, parse_constant=_no_constants)
        pieces: list[str] = []
        size = 0
        encoder = json.JSONEncoder(indent=2, ensure_ascii=False)
        for piece in encoder.iterencode(value):
            size += len(piece)
            if size > _REINDENT_LIMIT_CHARS:
                return None
            pieces.append(piece)
    except (ValueError, RecursionError):
        return None
    return "".join(pieces)


def render_body(status: int, body: bytes) -> str:
    """What the model is shown of a 2xx or 4xx body (before redaction and cutting)."""
    text = body.decode("utf-8", errors="replace")
    if not text.strip():
        return empty(status)
    if 200 <= status < 300:
        reindented = _reindent(text)
        if reindented is not None:
            return reindented
    return text
