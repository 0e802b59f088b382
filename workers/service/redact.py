"""Seed 001: a granted header value of eight or more characters that appears in
the response is replaced with `[redacted]` before the model sees it.

A hostile service can spell a value many ways, so each value is matched in
every spelling a reader could turn back into it, at every status and whatever
the body's shape (redaction runs on the final text, re-indented or not):

- spelled: the value character by character, each character as itself (in
  either case: the match is case-insensitive), as any JSON escape of it
  (`\\u0061`, `\\u0041`, `\\u00E9`…, a surrogate pair beyond U+FFFF, `\\"`, `\\/`,
  `\\n`…, with up to seven backslashes for escapes of escapes), or as the
  percent-encoding of its UTF-8 bytes (`%61`, `%e2%82%ac`, either case; `+` for
  a space), freely mixed;
- base64 of its UTF-8 bytes, standard or URL-safe (or mixed), padded or not,
  `/` also as JSON's `\\/`: at each of the three byte alignments the value can
  have inside a longer base64 text, the characters that depend on the value's
  bytes only (the stable middle), plus the last character and its padding
  where the value ends the encoded data;
- hex of its UTF-8 bytes, in either case.

Each form is one compiled pattern over every value, built once per grant set
(`Redactor` is immutable, so one serves every thread); a call costs three
regex passes over the text. Measured on a 1 MB body with two values: 30 ms
for ordinary JSON, 85 ms for a body made of `\\u0073` escapes, 125 ms at worst
(a megabyte of backslashes, each the possible start of an escape).

Not caught: encodings of encodings other than JSON escapes of JSON escapes
(the base64 of the hex of a value), base64 broken over lines, hex with
separators or `\\x` prefixes, HTML entities,
and any transformation a reader cannot undo without knowing it (a hash, a
cipher). A service that wants to leak a value it was sent can always do so;
redaction stops the accidental echo and the obvious disguises.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable

__all__ = ["MIN_REDACTED_CHARS", "REDACTED", "Redactor"]

#: Seed 001: shorter values are too likely to occur by chance to be hidden.
MIN_REDACTED_CHARS = 8
REDACTED = "[redacted]"

#: Backslashes an escaped character may carry: 1 (JSON in a body), 3 (JSON
#: text in a JSON string), 7 (one level more). A bound, not `*`: a run of a
#: million backslashes must not cost a scan of the run at each of its positions.
_MAX_BACKSLASHES = 7
#: After an escape's first backslash (the option's lead, below).
_MORE_BACKSLASHES = rf"\\{{0,{_MAX_BACKSLASHES - 1}}}"

#: JSON's two-character escapes (RFC 8259 section 7), by the character they stand for.
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r"}
_SHORT_ESCAPES["\t"] = "t"

# Speed. A form's pattern is an alternation whose branches each start with
# one plain character, and no IGNORECASE flag is used (cases are spelled
# out). Python's regex engine then jumps straight to the positions holding
# one of those characters and skips each branch on its first character; with
# the flag, or branches starting with a group or a look-behind, it tries
# every branch at every position (measured: 5 to 30 times slower on a 1 MB
# body). The price is a copy of a value's pattern per way its first character
# starts (`s`, `S`, a backslash, `%`): compiling costs about 1 ms per
# character of a value, paid once per grant set.

#: One way to spell one character: its first character (a plain character,
#: which the pattern's set matches) and the pattern of the rest.
_Option = tuple[str, str]


def _any_case(text: str) -> str:
    """Hex digits `text` as a pattern matching them in either case."""
    return "".join(f"[{c}{c.upper()}]" if c in "abcdef" else c for c in text)


def _json_escapes(char: str) -> list[_Option]:
    """The JSON escapes standing for `char` (`\\u00e9`, `\\u00E9`, `\\\\\\u00e9`, `\\n`...)."""
    code = ord(char)
    if code > 0xFFFF:
        high = 0xD800 + ((code - 0x10000) >> 10)
        low = 0xDC00 + ((code - 0x10000) & 0x3FF)
        hexes = f"u{_any_case(f'{high:04x}')}\\\\{_MORE_BACKSLASHES}u{_any_case(f'{low:04x}')}"
    else:
        hexes = "u" + _any_case(f"{code:04x}")
    escapes = [("\\", _MORE_BACKSLASHES + hexes)]
    if char in _SHORT_ESCAPES:
        escapes.append(("\\", _MORE_BACKSLASHES + re.escape(_SHORT_ESCAPES[char])))
    return escapes


def _spelled_char(char: str) -> list[_Option]:
    """Every spelling of one character of a value."""
    # Both cases' escapes: `\\u0041` is an A, and the match ignores case.
    cases = sorted({c for c in (char, char.lower(), char.upper()) if len(c) == 1})
    options: list[_Option] = [(c, "") for c in cases]
    for case in cases:
        options += _json_escapes(case)
    encoded = char.encode("utf-8", "surrogatepass")
    percent = "%".join(_any_case(f"{byte:02x}") for byte in encoded)
    options.append(("%", percent))
    if char == " ":
        options.append(("+", ""))  # application/x-www-form-urlencoded
    return options


def _base64_char(char: str) -> list[_Option]:
    if char in "+-":
        return [("+", ""), ("-", "")]
    if char in "/_":
        return [("/", ""), ("_", ""), ("\\", _MORE_BACKSLASHES + "/")]
    return [(char, "")]


def _hex_char(char: str) -> list[_Option]:
    return [(c, "") for c in sorted({char, char.upper()})]


def _alternatives(options: list[_Option]) -> str:
    patterns = [re.escape(lead) + rest for lead, rest in options]
    return patterns[0] if len(patterns) == 1 else "(?:" + "|".join(patterns) + ")"


def _branches(chars: list[list[_Option]], tail: str = "") -> list[str]:
    """A sequence of characters (each with its options) as branches led by a plain character."""
    leads: dict[str, list[str]] = {}
    for lead, rest in chars[0]:
        leads.setdefault(lead, []).append(rest)
    after = "".join(_alternatives(o) for o in chars[1:]) + tail
    branches = []
    for lead, rests in leads.items():
        first = "" if rests == [""] else "(?:" + "|".join(rests) + ")"
        branches.append(re.escape(lead) + first + after)
    return branches


def _spelled(value: str) -> list[str]:
    return _branches([_spelled_char(c) for c in value])


def _base64(value: str) -> list[str]:
    """The stable middle of the value's base64 at each byte alignment (0, 1, 2 bytes before)."""
    data = value.encode("utf-8", "surrogatepass")
    bits = 8 * len(data)
    branches: list[str] = []
    for before in range(3):
        encoded = base64.b64encode(bytes(before) + data).decode("ascii")
        # Character i holds bits [6i, 6i + 6): keep those inside the value's bits.
        start = -(-8 * before // 6)
        end = (8 * before + bits) // 6
        last = encoded[end:].rstrip("=")
        # Where the value ends the data, its last character is fixed too.
        tail = f"(?:{_alternatives(_base64_char(last))}=*)?" if last else ""
        branches += _branches([_base64_char(c) for c in encoded[start:end]], tail)
    return branches


def _hex(value: str) -> list[str]:
    return _branches([_hex_char(c) for c in value.encode("utf-8", "surrogatepass").hex()])


def _compile(branches: list[str]) -> re.Pattern[str] | None:
    return re.compile("|".join(branches)) if branches else None


class Redactor:
    """Replaces each of a fixed set of values, in every form, wherever it appears.

    Thread-safe (immutable). Values shorter than `MIN_REDACTED_CHARS` are kept.
    """

    __slots__ = ("_count", "_patterns")

    def __init__(self, values: Iterable[str]) -> None:
        # Longest first: when one value contains another, the whole of it goes
        # (alternation takes the first branch that matches, not the longest).
        kept = sorted(
            {v for v in values if len(v) >= MIN_REDACTED_CHARS}, key=lambda v: (-len(v), v)
        )
        self._count = len(kept)
        patterns = [
            _compile([b for v in kept for b in _spelled(v)]),
            _compile([b for v in kept for b in _base64(v)]),
            _compile([b for v in kept for b in _hex(v)]),
        ]
        self._patterns = tuple(p for p in patterns if p is not None)

    def __call__(self, text: str) -> str:
        for pattern in self._patterns:
            text = pattern.sub(REDACTED, text)
        return text

    def __repr__(self) -> str:
        return f"Redactor(<{self._count} values>)"
