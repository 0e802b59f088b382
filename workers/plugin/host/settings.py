"""Resolving `env:NAME` in the plugins' settings and in `[platform]`, once, at start.

Only plugin workers do this (sandbox workers hold no secrets). As for service
workers' grants (`workers.service.secrets`), a variable that is missing or
empty stops the worker with `MissingSecret` naming every missing variable and
where it was named, never a value. A string value anywhere in the settings
(nested tables and lists included) that starts with `env:` is resolved.

`secrets` lists the resolved `env:` values of eight or more characters: the
runner redacts them from the plugin's results, as seed 001 does for grants.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from broker.constants import VESSEL_HEADER_PREFIX
from broker.errors import ConfigError, MissingSecret
from broker.model import Deployment, Platform
from workers.service.redact import MIN_REDACTED_CHARS
from workers.service.secrets import ENV_PREFIX

__all__ = [
    "ResolvedPlatform",
    "ResolvedSettings",
    "redactable",
    "resolve_platform",
    "resolve_settings",
]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110 field-value, as for grants: no CR, LF, NUL or non-ASCII.
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?")


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedSettings:
    """One plugin's settings with every `env:` value read."""

    slug: str
    values: Mapping[str, Any]
    #: The values read from the environment (what `secrets` redacts).
    from_env: tuple[str, ...]

    def __repr__(self) -> str:
        return f"ResolvedSettings(slug={self.slug!r}, keys={sorted(self.values)!r})"


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedPlatform:
    """`[platform]` with its `env:` values read: where platform namespaces are forwarded."""

    #: Without a trailing slash: the target is `url + "/host/" + chain`.
    url: str
    headers: Mapping[str, str]
    from_env: tuple[str, ...]

    def __repr__(self) -> str:
        return f"ResolvedPlatform(url=<hidden>, headers={sorted(self.headers)!r})"


class _Reader:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.missing: list[str] = []
        self.read: list[str] = []

    def value(self, value: str, where: str) -> str | None:
        if not value.startswith(ENV_PREFIX):
            return value
        name = value[len(ENV_PREFIX) :]
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{where}: {name!r} is not an environment variable name")
        found = self.environ.get(name)
        if not found:
            self.missing.append(f"{where}: environment variable {name} is not set (or is empty)")
            return None
        self.read.append(found)
        return found

    def tree(self, value: Any, where: str) -> Any:
        if isinstance(value, str):
            return self.value(value, where)
        if isinstance(value, Mapping):
            return {k: self.tree(v, f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.tree(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value


def resolve_settings(
    deployment: Deployment,
    plugins: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, ResolvedSettings]:
    """The settings of the given plugins (default: all), keyed by slug.

    Raises MissingSecret listing every missing variable at once.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    slugs = list(deployment.plugins) if plugins is None else list(plugins)
    resolved: dict[str, ResolvedSettings] = {}
    missing: list[str] = []
    for slug in slugs:
        plugin = deployment.plugins[slug]
        reader = _Reader(env)
        values = {
            key: reader.tree(value, f"plugin {slug!r}, setting {key!r}")
            for key, value in plugin.settings.items()
        }
        missing += reader.missing
        resolved[slug] = ResolvedSettings(slug=slug, values=values, from_env=tuple(reader.read))
    if missing:
        raise MissingSecret(
            "plugin workers cannot start without these variables:\n" + "\n".join(missing)
        )
    return resolved


def resolve_platform(
    platform: Platform | None, environ: Mapping[str, str] | None = None
) -> ResolvedPlatform | None:
    """`[platform]` resolved (None without one); raises MissingSecret or ConfigError."""
    if platform is None:
        return None
    reader = _Reader(os.environ if environ is None else environ)
    url = reader.value(platform.url, "[platform] url")
    headers: dict[str, str] = {}
    for header, raw in platform.headers.items():
        where = f"[platform] header {header!r}"
        if header.lower().startswith(VESSEL_HEADER_PREFIX):
            raise ConfigError(f"{where}: names starting with X-Vessel- are refused")
        value = reader.value(raw, where)
        if value is None:
            continue
        if not _HEADER_VALUE.fullmatch(value):
            raise ConfigError(
                f"{where}: the value is not a valid HTTP header value "
                "(printable ASCII, no line breaks, no leading or trailing space)"
            )
        headers[header] = value
    if reader.missing:
        raise MissingSecret(
            "plugin workers cannot start without these variables:\n" + "\n".join(reader.missing)
        )
    if url is None:  # [platform] without a url is refused by the loader first
        raise MissingSecret("[platform]: no url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        # Never quoted: the URL may carry credentials.
        raise ConfigError(
            "[platform] url: the URL is not http:// or https:// with a host and no query "
            "or fragment"
        )
    return ResolvedPlatform(url=url.rstrip("/"), headers=headers, from_env=tuple(reader.read))


def redactable(values: Sequence[str]) -> list[str]:
    """The values worth redacting (seed 001: eight characters or more)."""
    return [v for v in values if len(v) >= MIN_REDACTED_CHARS]
