"""A service tool's `path`: appended to the granted URL, so it must stay a plain path.

Seed 001: it starts with "/" and has no ".." segment. A "?" or "#" would start
a query or fragment the grant may not have; a percent-encoded dot segment
(`%2e%2e`) or a backslash is read as ".." or "/" by some servers; spaces and
control characters would be re-encoded or split the request line.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["service_path_problem"]

_PRINTABLE_ASCII = re.compile(r"[\x21-\x7e]*")


def service_path_problem(path: str) -> str | None:
    """Why `path` cannot be a service tool's path, or None when it can."""
    if not path.startswith("/"):
        return 'must start with "/"'
    if not _PRINTABLE_ASCII.fullmatch(path):
        return "may hold only printable ASCII, without spaces or control characters"
    if "?" in path or "#" in path:
        return 'may not hold a query or fragment ("?" or "#")'
    if "\\" in path:
        return 'may not hold a backslash ("\\")'
    segments = unquote(path).split("/")
    if ".." in segments:
        return 'may not hold a ".." segment (percent-encoded or not)'
    if "." in segments:
        return 'may not hold a "." segment (percent-encoded or not)'
    return None
