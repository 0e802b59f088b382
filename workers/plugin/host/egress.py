"""Where `host.fetch` may go: the plugin's egress list, then the address actually dialled.

Two checks, in this order (Stripe smokescreen's lesson: a name is only a claim,
the address connected to is what matters):

1. The URL's host must be an entry of the plugin's `manifest.egress` (exactly,
   case-insensitive, no wildcards); an entry with `:port` also fixes the port.
2. The host is resolved once, here, and *every* address it resolves to must be
   public, or be named `address:port` in the deployment's `private_egress` for
   that plugin. The request is then made to the checked address (never to the
   name again), so a DNS answer that changes between the check and the connect
   (rebinding) cannot move the call inward.

"Not public" is: loopback, private (RFC 1918), link-local (169.254/16, fe80::/10:
the cloud metadata endpoints 169.254.169.254 and fd00:ec2::254 are named as
such), unique-local (fc00::/7), CGNAT / shared (100.64/10), multicast,
unspecified, reserved and anything else Python's `ipaddress` does not call
global. IPv4 addresses embedded in IPv6 (::ffff:a.b.c.d, 6to4, Teredo, NAT64
64:ff9b::/96) are judged as the IPv4 address they carry.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from workers.plugin.host.context import HostRefused

__all__ = [
    "MAX_URL_CHARS",
    "METADATA_ADDRESSES",
    "IPAddress",
    "Target",
    "address_class",
    "check_address",
    "egress_allows",
    "format_address",
    "parse_target",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Cloud instance metadata endpoints (AWS, GCP, Azure, OpenStack; AWS's IPv6;
#: Alibaba's): the usual target of a server-side request forgery.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
#: Longest URL accepted: a URL this long is a payload, not an address.
MAX_URL_CHARS = 8192
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Target:
    """The parts of a fetch URL that the checks and the connection need."""

    scheme: str
    #: Lower-case ASCII host name (IDNA) or IP literal, without brackets.
    host: str
    port: int
    #: The Host header: host, and :port when not the scheme's default.
    authority: str
    #: The path and query as sent (`/` when empty).
    target: str
    ip: IPAddress | None


def _refuse(what: str) -> HostRefused:
    return HostRefused(f"host.fetch refused: {what}")


def parse_target(url: object) -> Target:
    """Check the URL's form (http or https, a host, no credentials) and split it."""
    if not isinstance(url, str) or not url:
        raise _refuse("`url` must be a non-empty string")
    if len(url) > MAX_URL_CHARS:
        raise _refuse(f"the URL is longer than {MAX_URL_CHARS} characters")
    try:
        parsed = httpx.URL(url)
        raw_host = parsed.raw_host.decode("ascii")
        port = parsed.port
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:
        raise _refuse(f"{url[:200]!r} is not a valid URL ({exc})") from None
    if parsed.scheme not in _DEFAULT_PORTS:
        raise _refuse(f"only http and https URLs may be fetched, not {parsed.scheme or 'none'!r}")
    host = raw_host.lower().rstrip(".")
    if not host:
        raise _refuse(f"{url[:200]!r} has no host")
    if parsed.userinfo:
        raise _refuse("URLs with credentials (user:password@) are not fetched; send a header")
    ip: IPAddress | None
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    else:
        host = str(ip)
    effective = port if port is not None else _DEFAULT_PORTS[parsed.scheme]
    shown = f"[{host}]" if ip is not None and ip.version == 6 else host
    default = port is None or port == _DEFAULT_PORTS[parsed.scheme]
    authority = shown if default else f"{shown}:{port}"
    target = parsed.raw_path.decode("ascii") or "/"
    return Target(
        scheme=parsed.scheme, host=host, port=effective, authority=authority, target=target, ip=ip
    )


def _split_entry(entry: str) -> tuple[str, int | None]:
    """An egress entry as (host, port or None): `host`, `host:port`, `[v6]:port`, `v6`."""
    text = entry.strip().lower().rstrip(".")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""  # a bare name, or a bare IPv6 literal
    with contextlib.suppress(ValueError):
        host = str(ipaddress.ip_address(host))
    return host, (int(port) if port.isdigit() else None)


def egress_allows(egress: Sequence[str], target: Target) -> bool:
    """True if an entry names the target's host (and its port, if the entry has one)."""
    for entry in egress:
        host, port = _split_entry(entry)
        if host == target.host and (port is None or port == target.port):
            return True
    return False


def _embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_class(ip: IPAddress) -> str | None:
    """What makes `ip` not public ("a loopback address", ...), or None if it is public."""
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    inner = _embedded_v4(ip)
    if inner is not None:
        found = address_class(inner)
        return None if found is None else f"{found[:-8]} address (inside an IPv6 one)"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a shared (CGNAT) address"
    if isinstance(ip, ipaddress.IPv6Address) and ip in ipaddress.ip_network("fc00::/7"):
        return "a unique-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved or not ip.is_global:
        return "a reserved address"
    return None


def format_address(ip: IPAddress, port: int) -> str:
    """`a.b.c.d:port` or `[v6]:port`, as `private_egress` entries are written."""
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _private_allowed(private_egress: Sequence[str], ip: IPAddress, port: int) -> bool:
    for entry in private_egress:
        host, entry_port = _split_entry(entry)
        if entry_port == port and host == str(ip):
            return True
    return False


def check_address(
    target: Target, ip: IPAddress, private_egress: Sequence[str], *, resolved: bool
) -> None:
    """Refuse `ip` (what `target.host` resolved to) unless public or in `private_egress`."""
    found = address_class(ip)
    if found is None or _private_allowed(private_egress, ip, target.port):
        return
    where = format_address(ip, target.port)
    how = f"{target.host} resolves to {ip}, {found}" if resolved else f"{ip} is {found}"
    raise _refuse(f"{how}, and {where} is not in this plugin's private_egress")
