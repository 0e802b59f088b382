"""Network entries of plugins: `manifest.egress` and `[[plugins]] private_egress`.

`manifest.egress` (the plugin's own list, read by the publish check) holds host
names or IP literals, each optionally with `:port`. `private_egress` (the
deployment's) holds `address:port` entries: the only loopback, private or
link-local addresses that plugin's `host.fetch` may reach. Nothing else: no
scheme, no path, no wildcard, no user info.
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["Endpoint", "egress_problem", "parse_endpoint", "private_egress_problem"]

# RFC 1123 labels: letters, digits and hyphens, not starting or ending with a hyphen.
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)", re.IGNORECASE)
_MAX_NAME = 253
_MAX_PORT = 65535

Endpoint = tuple[str, int | None]


def _split(entry: str) -> tuple[str, str | None] | str:
    """(host, port text or None), or why the entry cannot be split."""
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            return "an IPv6 literal in [ ] is not closed"
        host, rest = entry[1:end], entry[end + 1 :]
        if rest and not rest.startswith(":"):
            return "only :port may follow an IPv6 literal in [ ]"
        return host, (rest[1:] if rest else None)
    if entry.count(":") > 1:
        return "an IPv6 literal is written in [ ], e.g. [::1]:8123"
    host, _, port = entry.partition(":")
    return host, (port if ":" in entry else None)


def parse_endpoint(entry: str) -> Endpoint | str:
    """(lowercased host or address, port or None), or why `entry` is not one."""
    if not entry or any(c.isspace() or not c.isprintable() for c in entry):
        return "must be a host name or IP address, without spaces or control characters"
    if "/" in entry or "@" in entry or "*" in entry or "?" in entry or "#" in entry:
        return "must be a host name or IP address with an optional :port, nothing else"
    split = _split(entry)
    if isinstance(split, str):
        return split
    host, port_text = split
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) <= _MAX_PORT:
            return f"{port_text!r} is not a port (1 to {_MAX_PORT})"
        port = int(port_text)
    try:
        return str(ipaddress.ip_address(host)), port
    except ValueError:
        pass
    if entry.startswith("["):
        return f"{host!r} is not an IPv6 address"
    name = host.rstrip(".").lower() if host.endswith(".") else host.lower()
    labels = name.split(".")
    if len(name) > _MAX_NAME or not all(_LABEL.fullmatch(label) for label in labels):
        return f"{host!r} is not a host name (letters, digits, hyphens and dots) or IP address"
    if labels[-1].isdigit():
        return f"{host!r} is not a valid IP address"
    return name, port


def egress_problem(entry: object) -> str | None:
    """Why `entry` cannot be a `manifest.egress` entry, or None."""
    if not isinstance(entry, str):
        return f"must be a string (a host name), not {type(entry).__name__}"
    found = parse_endpoint(entry)
    return found if isinstance(found, str) else None


def private_egress_problem(entry: str) -> str | None:
    """Why `entry` cannot be a `private_egress` entry (`address:port`), or None."""
    found = parse_endpoint(entry)
    if isinstance(found, str):
        return found
    host, port = found
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return (
            f"{host!r} is a name: private_egress lists addresses (the address actually "
            "connected to is checked), e.g. 127.0.0.1:8123"
        )
    if port is None:
        return "must name a port, e.g. 127.0.0.1:8123"
    if address.is_global:
        return (
            f"{host} is a public address: private_egress only lists loopback, private or "
            "link-local ones (public hosts need only manifest.egress)"
        )
    return None
