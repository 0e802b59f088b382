"""`[agents.services.<name>]`: a deployment's grant of one service (seed 001).

Values stay as written (`env:NAME` unresolved): only service workers resolve
them (workers/service/secrets.py). What can be checked here is checked here,
so `check` finds it before a worker starts.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from broker.constants import SERVICE_NAME_PATTERN, VESSEL_HEADER_PREFIX
from broker.loading.fields import Table, field_path, type_name
from broker.model import Grant

__all__ = ["ENV_PREFIX", "GRANT_KEYS", "read_grant", "url_problem"]

GRANT_KEYS = frozenset({"url", "headers"})
#: Seed 001: `url` and header values may be `env:NAME`, read where service workers run.
ENV_PREFIX = "env:"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110 token: the characters a header name may hold.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 9110 field-value, as workers/service/secrets.py checks resolved values:
# visible ASCII, inner spaces and tabs; never CR or LF, which would split a header.
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?")


def url_problem(url: str) -> str | None:
    """Why a literal `url` cannot be a grant's URL, or None. Never quotes the URL."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "may not hold spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number in range
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    del port
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https:// (or be env:NAME)"
    if not parts.hostname:
        return "has no host"
    if "?" in url or "#" in url:
        return "may not have a query or fragment"
    if "@" in parts.netloc:
        # Credentials belong in a header (which may be env:NAME), not in the URL.
        return "may not hold credentials (user@host); send them in a header"
    return None


def _env_problem(value: str) -> str | None:
    name = value[len(ENV_PREFIX) :]
    if not _ENV_NAME.fullmatch(name):
        return f"{name!r} is not an environment variable name (letters, digits, _)"
    return None


def read_grant(table: Table, name: str) -> Grant | None:
    """The grant under `services.<name>` of `table` (an agent); None when it has problems."""
    where = field_path(table.field("services"), name)
    found = len(table.problems)
    if not SERVICE_NAME_PATTERN.fullmatch(name):
        table.problems.add(
            table.file,
            where,
            "a service name is lowercase letters, digits and hyphens starting with a letter",
        )
    raw = table.data["services"][name]
    if not isinstance(raw, dict):
        table.problems.add(table.file, where, f"must be a table, not {type_name(raw)}")
        return None
    grant = Table(raw, file=table.file, where=where, keys=GRANT_KEYS, problems=table.problems)
    url = grant.string("url", required=True)
    if url is not None:
        problem = _env_problem(url) if url.startswith(ENV_PREFIX) else url_problem(url)
        if problem is not None:
            grant.problem("url", problem)
    headers = _read_headers(grant)
    if len(table.problems) > found or url is None or headers is None:
        return None
    return Grant(name=name, url=url, headers=headers)


def _read_headers(grant: Table) -> dict[str, str] | None:
    if not grant.has("headers"):
        return {}
    raw = grant.mapping("headers")
    if raw is None:
        return None
    where = grant.field("headers")
    found = len(grant.problems)
    seen: dict[str, str] = {}
    for header, value in raw.items():
        at = field_path(where, header)

        def refuse(message: str, at: str = at) -> None:
            grant.problems.add(grant.file, at, message)

        if not _HEADER_NAME.fullmatch(header):
            refuse("is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
        elif header.lower().startswith(VESSEL_HEADER_PREFIX):
            refuse("names starting with X-Vessel- are refused (the vessel sets them)")
        elif header.lower() in seen:
            refuse(f"repeats the header {seen[header.lower()]!r} (names ignore case)")
        if not isinstance(value, str):
            refuse(f"must be a string, not {type_name(value)}")
            continue
        seen.setdefault(header.lower(), header)
        if value.startswith(ENV_PREFIX):
            problem = _env_problem(value)
            if problem is not None:
                refuse(problem)
        elif "\r" in value or "\n" in value:
            refuse("may not hold a line break (CR or LF)")
        elif not _HEADER_VALUE.fullmatch(value):
            refuse(
                "is not a valid HTTP header value (printable ASCII, "
                "no leading or trailing space, not empty)"
            )
    if len(grant.problems) > found:
        return None
    return {str(k): str(v) for k, v in raw.items()}
