"""`host.crypto`: random UUIDs, random bytes and SHA digests, from the worker's CSPRNG.

randomUUID()              -> "1b4e28ba-2fa1-41d2-883f-0016d3cca427" (version 4)
randomBytes(n)            -> n random bytes as a base64 string (0 <= n <= MAX_RANDOM_BYTES)
digest(algorithm, data)   -> lower-case hex; algorithm "SHA-1", "SHA-256",
                             "SHA-384" or "SHA-512" (case and the dash optional);
                             data a string, hashed as its UTF-8 bytes
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid
from typing import Any

from workers.plugin.host.context import HostRefused

__all__ = ["ALGORITHMS", "MAX_DIGEST_CHARS", "MAX_RANDOM_BYTES", "crypto_call"]

#: Random bytes per call: enough for any key or nonce, small enough that a loop
#: of calls cannot fill the result pipe faster than it drains.
MAX_RANDOM_BYTES = 65_536
#: Characters one digest may hash: the argument crossed the runtime's pipe as JSON.
MAX_DIGEST_CHARS = 4_000_000
ALGORITHMS = {"sha1": "sha1", "sha256": "sha256", "sha384": "sha384", "sha512": "sha512"}


def _random_bytes(args: list[Any]) -> str:
    n = args[0] if len(args) == 1 else None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_RANDOM_BYTES:
        raise HostRefused(
            f"host.crypto.randomBytes refused: it takes one whole number from 0 to "
            f"{MAX_RANDOM_BYTES:,}"
        )
    return base64.b64encode(secrets.token_bytes(n)).decode("ascii")


def _digest(args: list[Any]) -> str:
    if len(args) != 2 or not isinstance(args[0], str) or not isinstance(args[1], str):
        raise HostRefused("host.crypto.digest refused: it takes (algorithm, data), two strings")
    name = ALGORITHMS.get(args[0].lower().replace("-", ""))
    if name is None:
        raise HostRefused(
            f"host.crypto.digest refused: {args[0][:40]!r} is not SHA-1, SHA-256, SHA-384 "
            "or SHA-512"
        )
    if len(args[1]) > MAX_DIGEST_CHARS:
        raise HostRefused(
            f"host.crypto.digest refused: data is longer than {MAX_DIGEST_CHARS:,} characters"
        )
    return hashlib.new(name, args[1].encode("utf-8", "surrogatepass")).hexdigest()


def crypto_call(method: str, args: list[Any]) -> str:
    """Answer `host.crypto.<method>(...args)`."""
    if method == "randomUUID":
        if args:
            raise HostRefused("host.crypto.randomUUID refused: it takes no arguments")
        return str(uuid.uuid4())
    if method == "randomBytes":
        return _random_bytes(args)
    if method == "digest":
        return _digest(args)
    raise HostRefused(
        f"host.crypto.{method} refused: host.crypto has randomUUID, randomBytes and digest"
    )
