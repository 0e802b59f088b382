"""Resolving the grants' `env:NAME` values, once, when a service worker starts.

Seed 001: `url` and header values may be `env:NAME`; they are passed into the
worker's environment and resolved when it starts. A variable that is missing (or
empty, which is what Compose passes for a variable unset on the host) stops the
worker with `MissingSecret`, naming the variable, the agent and the service.
No message here ever contains a value: the names say enough to fix it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from broker.constants import VESSEL_HEADER_PREFIX
from broker.errors import ConfigError, MissingSecret
from broker.model import Deployment, Grant

__all__ = ["ENV_PREFIX", "ResolvedGrant", "resolve_grant", "resolve_grants"]

#: Seed 001: a value written `env:NAME` is read from the worker's environment.
ENV_PREFIX = "env:"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110 field-value: visible ASCII, space and tab. Anything else (CR, LF,
# NUL, non-ASCII) could split a header or make httpx refuse every call later.
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?")


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedGrant:
    """One agent's grant of one service with every `env:` value read."""

    agent: str
    service: str
    #: The granted URL without a trailing slash, so `url + tool.path` is the target.
    url: str
    #: Header name -> value, as sent with every call.
    headers: Mapping[str, str]

    def __repr__(self) -> str:
        # The URL may come from a secret variable and the values are secrets.
        return (
            f"ResolvedGrant(agent={self.agent!r}, service={self.service!r}, "
            f"url=<hidden>, headers={sorted(self.headers)!r})"
        )


def _read(value: str, *, environ: Mapping[str, str], where: str, missing: list[str]) -> str | None:
    """The value itself, or the variable's value for `env:NAME`; None when missing."""
    if not value.startswith(ENV_PREFIX):
        return value
    name = value[len(ENV_PREFIX) :]
    if not _ENV_NAME.fullmatch(name):
        raise ConfigError(f"{where}: {name!r} is not an environment variable name")
    found = environ.get(name)
    if not found:
        missing.append(f"{where}: environment variable {name} is not set (or is empty)")
        return None
    return found


def _check_url(url: str, *, where: str) -> None:
    # The loader checks literal URLs; an env: URL is seen only here. The message
    # never quotes the URL: it may carry credentials.
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
        or "?" in url
        or "#" in url
    ):
        raise ConfigError(
            f"{where}: the URL is not http:// or https:// with a host and no query or fragment"
        )


def resolve_grant(agent: str, grant: Grant, environ: Mapping[str, str]) -> ResolvedGrant:
    """Resolve one grant; raise `MissingSecret` listing every missing variable."""
    base = f"agent {agent!r}, service {grant.name!r}"
    missing: list[str] = []
    url = _read(grant.url, environ=environ, where=f"{base}, url", missing=missing)
    headers: dict[str, str] = {}
    for header, raw in grant.headers.items():
        where = f"{base}, header {header!r}"
        if header.lower().startswith(VESSEL_HEADER_PREFIX):
            raise ConfigError(f"{where}: names starting with X-Vessel- are refused")
        value = _read(raw, environ=environ, where=where, missing=missing)
        if value is None:
            continue
        if not _HEADER_VALUE.fullmatch(value):
            raise ConfigError(
                f"{where}: the value is not a valid HTTP header value "
                "(printable ASCII, no line breaks, no leading or trailing space)"
            )
        headers[header] = value
    if missing or url is None:  # a missing url is always in `missing`
        raise MissingSecret("\n".join(missing) or f"{base}, url: not set")
    _check_url(url, where=f"{base}, url")
    return ResolvedGrant(agent=agent, service=grant.name, url=url.rstrip("/"), headers=headers)


def resolve_grants(
    deployment: Deployment,
    agents: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[tuple[str, str], ResolvedGrant]:
    """Every grant of the given agents (default: all), keyed by (agent id, service).

    All missing variables are reported at once, so an operator fixes them in
    one go rather than one restart per variable.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    ids = list(deployment.agents) if agents is None else list(agents)
    resolved: dict[tuple[str, str], ResolvedGrant] = {}
    missing: list[str] = []
    for agent_id in ids:
        agent = deployment.agent(agent_id)
        for name, grant in agent.grants.items():
            try:
                resolved[(agent.id, name)] = resolve_grant(agent.id, grant, env)
            except MissingSecret as exc:
                missing.append(str(exc))
    if missing:
        raise MissingSecret(
            "service workers cannot start without these variables:\n" + "\n".join(missing)
        )
    return resolved
