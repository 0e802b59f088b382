"""`host.fetch({url, method?, headers?, body?})` -> `{status, headers, body}`, made by the worker.

The handler's runtime has no network; this is its only way out, and every
request crosses these steps in order (each refusal is one sentence naming what
was refused):

1. the request's form: `url` http or https with a host and no credentials,
   `method` one of `METHODS`, `headers` an object of strings (Host,
   Content-Length, Transfer-Encoding, Connection and other hop-by-hop headers
   are the worker's to write), `body` a string of at most `MAX_REQUEST_BYTES`;
2. the URL's host (and port, if the entry names one) is in the plugin's
   `manifest.egress` (`workers.plugin.host.egress`);
3. the host is resolved once, here, bounded by the call's time left, and every
   address must be public or in the deployment's `private_egress`;
4. the request is made to the first checked address: the URL carries the IP,
   the Host header carries the name, and for https the TLS SNI and certificate
   check use the name (httpx's `sni_hostname` extension). Nothing resolves the
   name again, so DNS cannot rebind around step 3.

One httpx client per worker process: an explicit `httpx.Timeout`, no
environment proxies, no redirects followed (a 3xx comes back as it is, with its
Location header, for the handler to decide), no cookies kept, no retries. For
https its transport keeps one connection pool per server name, so a kept-alive
connection whose certificate was checked for one name is never reused for
another name served from the same address. Every socket operation obeys the
call's deadline and cancel (`workers.service.transport.watching`).

The answer: `status`, `headers` (lower-case names, repeated headers joined with
", "), `body` (the bytes decoded as UTF-8, invalid sequences replaced; a gzip
or deflate coding undone). A body over `MAX_RESPONSE_BYTES` (declared or read)
is refused with a message saying so; nothing of it is returned.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import logging
import re
import socket
import threading
from collections import OrderedDict
from collections.abc import Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from workers.plugin.host.context import HostContext, HostFailed, HostRefused
from workers.plugin.host.egress import (
    IPAddress,
    Target,
    check_address,
    egress_allows,
    parse_target,
)
from workers.service.reading import (
    BodyTooLarge,
    ReadStopped,
    declared_length,
    decode_content,
    read_limited,
)
from workers.service.transport import SocketOption, build_transport, watching

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_RESPONSE_BYTES",
    "METHODS",
    "USER_AGENT",
    "Fetcher",
]

_log = logging.getLogger(__name__)

#: Seed 002 / issue: a response body over this is refused, and reading stops here.
MAX_RESPONSE_BYTES = 1_000_000
#: A request body over this is refused: it crossed the runtime's pipe as JSON already.
MAX_REQUEST_BYTES = 1_000_000
#: Request headers one fetch may set, and the bytes of all of them: far above
#: any API's needs, far below what would make a header block a payload.
MAX_HEADERS = 64
MAX_HEADER_BYTES = 32 * 1024
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: The worker writes these itself (Host from the URL, framing from the body).
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-connection",
    }
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t\x80-\xff]*")
USER_AGENT = "vessel-workers-plugin"

#: Per socket operation; the call's own deadline (30 s by default) is the real bound.
_TIMEOUT = httpx.Timeout(connect=10.0, read=30.0, write=30.0, pool=5.0)
_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=32, keepalive_expiry=1.5)
_SOCKET_OPTIONS: list[SocketOption] = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
#: https server names whose connection pools are kept (least recently used go).
_TLS_POOLS = 64
#: Name lookups run at once, each bounded by its call's time left.
_RESOLVERS = 8


#: Loggers that could print a URL or a header (a plugin's API key) below WARNING.
_LIBRARY_LOGGERS = ("httpx", "httpcore.connection", "httpcore.http11", "httpcore.proxy")


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


def _quiet_library_logs() -> None:
    # A plugin worker holds the plugins' secrets, which handlers put in URLs and
    # headers: httpx's INFO line and httpcore's DEBUG lines never reach a
    # handler, whatever level an operator turns on (as in service workers).
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _BelowWarning) for f in logger.filters):
            logger.addFilter(_BelowWarning())


def _no_cookies() -> CookieJar:
    # An empty allow-list refuses every domain: Set-Cookie is dropped, and no
    # Cookie header is added (one the handler writes itself is sent as written).
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


class _PoolPerName(httpx.BaseTransport):
    """Plain http through one pool; https through one pool per TLS server name."""

    def __init__(self) -> None:
        self._plain = build_transport(limits=_LIMITS, socket_options=_SOCKET_OPTIONS)
        self._tls: OrderedDict[str, httpx.HTTPTransport] = OrderedDict()
        self._lock = threading.Lock()

    def _for(self, request: httpx.Request) -> httpx.BaseTransport:
        name = request.extensions.get("sni_hostname")
        if request.url.scheme != "https" or not name:
            return self._plain
        old: httpx.HTTPTransport | None = None
        with self._lock:
            transport = self._tls.get(name)
            if transport is None:
                transport = build_transport(limits=_LIMITS, socket_options=_SOCKET_OPTIONS)
                self._tls[name] = transport
                if len(self._tls) > _TLS_POOLS:
                    _, old = self._tls.popitem(last=False)
            else:
                self._tls.move_to_end(name)
        if old is not None:
            old.close()  # its idle connections; one in use finishes on its own
        return transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._for(request).handle_request(request)

    def close(self) -> None:
        with self._lock:
            pools, self._tls = list(self._tls.values()), OrderedDict()
        self._plain.close()
        for pool in pools:
            pool.close()


def _refuse(what: str) -> HostRefused:
    return HostRefused(f"host.fetch refused: {what}")


def _request_fields(args: list[Any]) -> tuple[object, str, dict[str, str], bytes | None]:
    if len(args) != 1 or not isinstance(args[0], Mapping):
        raise _refuse("it takes one object {url, method?, headers?, body?}")
    spec = args[0]
    unknown = sorted(set(spec) - {"url", "method", "headers", "body"})
    if unknown:
        raise _refuse(f"unknown field {unknown[0]!r} (fields: url, method, headers, body)")
    url = spec.get("url")
    method = spec.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise _refuse(f"method must be one of {', '.join(sorted(METHODS))}")
    raw_headers = spec.get("headers") or {}
    if not isinstance(raw_headers, Mapping):
        raise _refuse("headers must be an object of strings")
    if len(raw_headers) > MAX_HEADERS:
        raise _refuse(f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    size = 0
    for name, value in raw_headers.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise _refuse(f"{str(name)[:80]!r} is not a header name")
        if name.lower() in _RESERVED_HEADERS:
            raise _refuse(f"the {name} header is set by the worker, not the plugin")
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            raise _refuse(f"header {name}: the value must be a string without line breaks")
        size += len(name) + len(value)
        headers[name] = value
    if size > MAX_HEADER_BYTES:
        raise _refuse(f"the headers are larger than {MAX_HEADER_BYTES} bytes")
    body = spec.get("body")
    data: bytes | None = None
    if body is not None:
        if not isinstance(body, str):
            raise _refuse("body must be a string (JSON.stringify an object first)")
        data = body.encode("utf-8", "surrogatepass")
        if len(data) > MAX_REQUEST_BYTES:
            raise _refuse(f"the request body is larger than {MAX_REQUEST_BYTES:,} bytes")
    return url, method.upper(), headers, data


def _joined(headers: httpx.Headers) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers.multi_items():
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


class Fetcher:
    """`host.fetch` for every call of a worker process; thread-safe, one httpx client."""

    def __init__(self) -> None:
        _quiet_library_logs()
        self._transport = _PoolPerName()
        self._client = httpx.Client(
            transport=self._transport,
            timeout=_TIMEOUT,
            follow_redirects=False,
            trust_env=False,
            cookies=_no_cookies(),
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        )
        self._resolver = concurrent.futures.ThreadPoolExecutor(
            _RESOLVERS, thread_name_prefix="vessel-plugin-dns"
        )

    @property
    def client(self) -> httpx.Client:
        """The process's httpx client (the platform forwarder uses it too)."""
        return self._client

    def close(self) -> None:
        self._client.close()
        self._resolver.shutdown(wait=False, cancel_futures=True)

    def _resolve(self, context: HostContext, target: Target) -> list[IPAddress]:
        if target.ip is not None:
            return [target.ip]
        left = context.seconds_left()
        if left <= 0:
            raise HostFailed("host.fetch failed: the call's time limit was reached")
        future = self._resolver.submit(
            socket.getaddrinfo, target.host, target.port, type=socket.SOCK_STREAM
        )
        try:
            infos = future.result(timeout=left)
        except concurrent.futures.TimeoutError:
            raise HostFailed(
                f"host.fetch failed: resolving {target.host} took longer than the call's time"
            ) from None
        except (OSError, UnicodeError) as exc:
            raise HostFailed(
                f"host.fetch failed: {target.host} cannot be resolved ({exc})"
            ) from None
        found: list[IPAddress] = []
        for info in infos:
            ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            if ip not in found:
                found.append(ip)
        if not found:
            raise HostFailed(f"host.fetch failed: {target.host} resolves to no address")
        return found

    def fetch(self, context: HostContext, args: list[Any]) -> dict[str, Any]:
        url, method, headers, body = _request_fields(args)
        target = parse_target(url)
        plugin = context.plugin
        if not egress_allows(plugin.egress, target):
            where = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
            raise _refuse(f"{where} is not in this plugin's egress list")
        addresses = self._resolve(context, target)
        for ip in addresses:
            check_address(target, ip, plugin.private_egress, resolved=target.ip is None)
        return self._exchange(
            context, target, addresses[0], method=method, headers=headers, body=body
        )

    def _exchange(
        self,
        context: HostContext,
        target: Target,
        ip: IPAddress,
        *,
        method: str,
        headers: dict[str, str],
        body: bytes | None,
    ) -> dict[str, Any]:
        left = context.seconds_left()
        if left <= 0:
            raise HostFailed("host.fetch failed: the call's time limit was reached")
        url = httpx.URL(scheme=target.scheme, host=str(ip), port=target.port).copy_with(
            raw_path=target.target.encode("ascii")
        )
        extensions: dict[str, Any] = {"timeout": httpx.Timeout(min(left, 30.0)).as_dict()}
        if target.scheme == "https" and target.ip is None:
            extensions["sni_hostname"] = target.host
        request = self._client.build_request(
            method, url, headers={**headers, "Host": target.authority}, content=body
        )
        request.extensions.update(extensions)
        what = f"{method} {target.host}"
        try:
            with watching(context.cancel.is_set, context.deadline):
                response = self._client.send(request, stream=True)
                try:
                    declared = declared_length(response.headers)
                    if declared is not None and declared > MAX_RESPONSE_BYTES:
                        raise BodyTooLarge
                    raw = read_limited(
                        response.iter_raw(),
                        limit=MAX_RESPONSE_BYTES,
                        stop=context.cancel.is_set,
                    )
                    data = decode_content(
                        raw, response.headers.get("content-encoding"), limit=MAX_RESPONSE_BYTES
                    )
                finally:
                    response.close()
        except BodyTooLarge:
            raise HostFailed(
                f"host.fetch failed: the answer of {what} is larger than "
                f"{MAX_RESPONSE_BYTES:,} bytes (nothing of it was kept)"
            ) from None
        except ReadStopped:
            raise HostFailed("host.fetch failed: the call was cancelled") from None
        except httpx.TimeoutException:
            raise HostFailed(f"host.fetch failed: {what} did not answer in time") from None
        except httpx.HTTPError as exc:
            if context.cancel.is_set():
                raise HostFailed("host.fetch failed: the call was cancelled") from None
            # The reason names nothing of the host: a refused connect, a
            # certificate that does not match the name, a reset.
            reason = str(exc)[:200] or type(exc).__name__
            raise HostFailed(f"host.fetch failed: {what}: {reason}") from None
        response_headers = _joined(response.headers)
        response_headers.pop("content-encoding", None)  # undone above
        if "content-length" in response_headers:
            response_headers["content-length"] = str(len(data))
        return {
            "status": response.status_code,
            "headers": response_headers,
            "body": data.decode("utf-8", "replace"),
        }
