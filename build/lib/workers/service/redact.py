"""Seed 001: a granted header value of eight or more characters that appears in
the response is replaced with `[redacted]` before the model sees it.

Redaction runs on the final text (after a JSON body is re-indented), so a value
the service hid behind `\\u` escapes is caught once decoded. The JSON-escaped
spellings of each value are redacted too: re-indenting writes a value holding a
quote or a backslash in that form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = ["MIN_REDACTED_CHARS", "REDACTED", "Redactor"]

#: Seed 001: shorter values are too likely to occur by chance to be hidden.
MIN_REDACTED_CHARS = 8
REDACTED = "[redacted]"


def _spellings(value: str) -> set[str]:
    return {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
    }


class Redactor:
    """Replaces each of a fixed set of values wherever it appears; thread-safe (immutable)."""

    __slots__ = ("_count", "_pattern")

    def __init__(self, values: Iterable[str]) -> None:
        spellings: set[str] = set()
        count = 0
        for value in set(values):
            if len(value) >= MIN_REDACTED_CHARS:
                count += 1
                spellings |= _spellings(value)
        self._count = count
        # Longest first: when one value contains another, the whole of it goes.
        ordered = sorted(spellings, key=lambda s: (-len(s), s))
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)

    def __repr__(self) -> str:
        return f"Redactor(<{self._count} values>)"
