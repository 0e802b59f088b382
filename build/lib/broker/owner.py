"""The turn's owner, as seed 001's `X-Vessel-Owner` carries it.

`<app>/<user>` for an app caller, `<issuer>|<subject>` for a token caller. The
text becomes an HTTP header value, so it is checked here, on the enqueue side,
before any worker sees it.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_OWNER", "check_owner"]

#: Who `vessel-workers call` acts for when no --owner is given.
DEFAULT_OWNER = "cli/local"

# Printable ASCII without separators that would make the form ambiguous; no
# CR/LF, so the value can never split a header.
_APP_USER = re.compile(r"[^\s/|]+/[^\s/|]+")
_ISSUER_SUBJECT = re.compile(r"[^\s|]+\|[^\s|]+")
_MAX_LENGTH = 512


def check_owner(owner: str) -> str:
    """Return `owner` if it has one of the two forms, else raise ValueError saying why."""
    if len(owner) > _MAX_LENGTH:
        raise ValueError(f"owner is {len(owner)} characters long; at most {_MAX_LENGTH}")
    if not owner.isascii() or not owner.isprintable():
        raise ValueError("owner must be printable ASCII (it is sent as an HTTP header)")
    if _APP_USER.fullmatch(owner) or _ISSUER_SUBJECT.fullmatch(owner):
        return owner
    raise ValueError(
        f"owner {owner!r} is neither <app>/<user> (an app caller) "
        "nor <issuer>|<subject> (a token caller)"
    )
