"""Reading a response body without ever holding more than the cap.

Seed 001 refuses a body over 1,000,000 bytes: a declared `Content-Length` over
the cap is refused before a byte is read, and a body without one (chunked, or
read to the close) is read in the chunks the socket gives and dropped as soon
as it passes the cap. The caller's `stop` is checked after every chunk, which is
how the whole-call deadline and cancellation reach a server that drips bytes.

The request asks for `Accept-Encoding: identity`; a server that compresses
anyway gets gzip/deflate decoded here, with the output bounded by the same cap
(a small gzip bomb must not become a gigabyte).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping

__all__ = [
    "BodyTooLarge",
    "ReadStopped",
    "declared_length",
    "decode_content",
    "read_limited",
]


class BodyTooLarge(Exception):
    """The body (declared, read, or decompressed) is over the cap."""


class ReadStopped(Exception):
    """`stop()` said the call is over (deadline passed or cancelled)."""


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The `Content-Length` as an int, or None when absent or not a plain number."""
    raw = headers.get("content-length")
    if raw is None:
        return None
    raw = raw.strip()
    return int(raw) if raw.isdigit() else None


def read_limited(chunks: Iterable[bytes], *, limit: int, stop: Callable[[], bool]) -> bytes:
    """Join `chunks`, raising `BodyTooLarge` past `limit` bytes, `ReadStopped` on `stop()`."""
    parts: list[bytes] = []
    size = 0
    for chunk in chunks:
        if stop():
            raise ReadStopped
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
    return b"".join(parts)


def decode_content(body: bytes, encoding: str | None, *, limit: int) -> bytes:
    """Undo a gzip or deflate `Content-Encoding`, never producing more than `limit` bytes.

    Any other coding is passed as is (decoded later as UTF-8 with replacement):
    the service was asked for identity and chose otherwise.
    """
    coding = (encoding or "").strip().lower()
    if coding in ("gzip", "x-gzip"):
        wbits = zlib.MAX_WBITS | 16
    elif coding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        return body
    try:
        out = _inflate(body, wbits, limit)
    except zlib.error:
        if coding != "deflate":
            return body
        # Some servers send raw deflate without the zlib header.
        try:
            out = _inflate(body, -zlib.MAX_WBITS, limit)
        except zlib.error:
            return body
    return out


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyTooLarge
    return out
