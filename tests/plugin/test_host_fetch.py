"""`host.fetch` against real HTTP servers on 127.0.0.1: what goes out, and the hostile
catalogue (egress, private addresses, names resolving inward, redirects, floods)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

from workers.plugin.host import HostFailed, HostRefused

from .host_support import Handler, Server, host_setup, http_server, make_plugin


@pytest.fixture
def server() -> Any:
    with http_server() as running:
        yield running


def allowed(server: Server, **kwargs: Any) -> Any:
    """A host where the server's address is in both egress and private_egress."""
    where = f"127.0.0.1:{server.port}"
    return host_setup(make_plugin(egress=(where,), private_egress=(where,), **kwargs))


def test_a_fetch_goes_out_and_comes_back(server: Server) -> None:
    server.answer("/v1/forecast", 200, b'{"daily": 1}', {"Content-Type": "application/json"})
    with allowed(server) as setup:
        answer = setup.call(
            "fetch",
            {
                "url": f"http://127.0.0.1:{server.port}/v1/forecast?latitude=1",
                "method": "POST",
                "headers": {"X-Api-Key": "abc", "Content-Type": "application/json"},
                "body": json.dumps({"q": 1}),
            },
        )
    assert answer["status"] == 200
    assert answer["body"] == '{"daily": 1}'
    assert answer["headers"]["content-type"] == "application/json"
    seen = server.seen[0]
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/forecast?latitude=1", b'{"q": 1}')
    assert seen.headers["x-api-key"] == "abc"
    assert seen.headers["host"] == f"127.0.0.1:{server.port}"


@pytest.mark.hostile
def test_a_host_not_in_egress_is_refused(server: Server) -> None:
    with allowed(server) as setup, pytest.raises(HostRefused) as caught:
        setup.call("fetch", {"url": "https://api.example.org/v1"})
    assert str(caught.value) == (
        "host.fetch refused: api.example.org is not in this plugin's egress list"
    )
    assert not server.seen


@pytest.mark.hostile
def test_a_port_other_than_the_entry_names_is_refused(server: Server) -> None:
    with allowed(server) as setup, pytest.raises(HostRefused, match="not in this plugin's egress"):
        setup.call("fetch", {"url": f"http://127.0.0.1:{server.port + 1}/"})


@pytest.mark.hostile
def test_loopback_not_in_private_egress_is_refused(server: Server) -> None:
    plugin = make_plugin(egress=("127.0.0.1",))
    with host_setup(plugin) as setup, pytest.raises(HostRefused) as caught:
        setup.call("fetch", {"url": f"http://127.0.0.1:{server.port}/"})
    assert str(caught.value) == (
        f"host.fetch refused: 127.0.0.1 is a loopback address, and 127.0.0.1:{server.port} "
        "is not in this plugin's private_egress"
    )
    assert not server.seen


@pytest.mark.hostile
def test_a_name_that_resolves_to_a_private_address_is_refused(server: Server) -> None:
    plugin = make_plugin(egress=("localhost",))
    with host_setup(plugin) as setup, pytest.raises(HostRefused) as caught:
        setup.call("fetch", {"url": f"http://localhost:{server.port}/"})
    assert str(caught.value).startswith(
        "host.fetch refused: localhost resolves to 127.0.0.1, a loopback address, and "
    )
    assert not server.seen


def test_a_name_allowed_inward_keeps_its_host_header(server: Server) -> None:
    server.answer("/", 200, b"hi")
    plugin = make_plugin(
        egress=(f"localhost:{server.port}",), private_egress=(f"127.0.0.1:{server.port}",)
    )
    with host_setup(plugin) as setup:
        assert setup.call("fetch", {"url": f"http://localhost:{server.port}/"})["body"] == "hi"
    assert server.seen[0].headers["host"] == f"localhost:{server.port}"


@pytest.mark.hostile
def test_the_name_is_resolved_once_and_the_checked_address_is_dialled(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rebinding DNS server cannot be had on 127.0.0.1 alone: the resolver is
    # replaced for one name, answering the allowed address first and a
    # forbidden one afterwards. The request must reach the first, and the
    # name must be looked up once.
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.test":
            lookups.append(host)
            address = "127.0.0.1" if len(lookups) == 1 else "169.254.169.254"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    server.answer("/", 200, b"reached")
    plugin = make_plugin(egress=("rebind.test",), private_egress=(f"127.0.0.1:{server.port}",))
    with host_setup(plugin) as setup:
        answer = setup.call("fetch", {"url": f"http://rebind.test:{server.port}/"})
    assert answer["body"] == "reached"
    assert lookups == ["rebind.test"]
    assert server.seen[0].headers["host"] == f"rebind.test:{server.port}"


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("http://169.254.169.254/latest/meta-data/", "a cloud metadata address"),
        ("http://[fd00:ec2::254]/latest/meta-data/", "a cloud metadata address"),
        ("http://10.1.2.3/", "a private address"),
        ("http://100.64.0.1/", "a shared (CGNAT) address"),
        ("http://[::1]/", "a loopback address"),
        ("http://[fe80::1]/", "a link-local address"),
        ("http://[fc00::1]/", "a unique-local address"),
        ("http://224.0.0.1/", "a multicast address"),
        ("http://0.0.0.0/", "an unspecified address"),
        ("http://[::ffff:127.0.0.1]/", "a loopback address (inside an IPv6 one)"),
    ],
)
def test_private_and_metadata_literals_are_refused(url: str, what: str) -> None:
    host = url.split("/")[2].strip("[]")
    plugin = make_plugin(egress=(host if ":" not in host else f"[{host}]",))
    with host_setup(plugin) as setup, pytest.raises(HostRefused) as caught:
        setup.call("fetch", {"url": url})
    assert what in str(caught.value)


@pytest.mark.hostile
def test_a_redirect_inward_is_returned_not_followed(server: Server) -> None:
    server.answer("/go", 302, b"", {"Location": "http://169.254.169.254/latest/meta-data/"})
    with allowed(server) as setup:
        answer = setup.call("fetch", {"url": f"http://127.0.0.1:{server.port}/go"})
    assert answer["status"] == 302
    assert answer["headers"]["location"] == "http://169.254.169.254/latest/meta-data/"
    assert [s.path for s in server.seen] == ["/go"]


@pytest.mark.hostile
@pytest.mark.parametrize("declared", [True, False])
def test_a_10_mb_answer_is_refused(server: Server, declared: bool) -> None:
    big = b"x" * 10_000_000

    def flood(handler: Handler) -> None:
        handler.send_response(200)
        if declared:
            handler.send_header("Content-Length", str(len(big)))
        else:
            handler.send_header("Connection", "close")
        handler.end_headers()
        for i in range(0, len(big), 1 << 16):
            handler.wfile.write(big[i : i + (1 << 16)])

    server.routes["/big"] = flood
    with allowed(server) as setup, pytest.raises(HostFailed) as caught:
        setup.call("fetch", {"url": f"http://127.0.0.1:{server.port}/big"})
    assert "larger than 1,000,000 bytes" in str(caught.value)


@pytest.mark.hostile
def test_cookies_are_never_kept(server: Server) -> None:
    server.answer("/", 200, b"", {"Set-Cookie": "session=stolen; Path=/"})
    with allowed(server) as setup:
        for _ in range(2):
            setup.call("fetch", {"url": f"http://127.0.0.1:{server.port}/"})
    assert "cookie" not in server.seen[1].headers


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"url": "file:///etc/passwd"}, "only http and https"),
        ({"url": "http://user:pw@127.0.0.1/"}, "credentials"),
        ({"url": "http://127.0.0.1/", "headers": {"Host": "internal"}}, "set by the worker"),
        ({"url": "http://127.0.0.1/", "headers": {"X-A": "a\r\nX-B: b"}}, "line breaks"),
        ({"url": "http://127.0.0.1/", "method": "CONNECT"}, "method must be"),
        ({"url": "http://127.0.0.1/", "body": {"a": 1}}, "body must be a string"),
        ({"url": "http://127.0.0.1/", "proxy": "x"}, "unknown field"),
    ],
)
def test_malformed_requests_are_refused(spec: dict[str, Any], match: str) -> None:
    plugin = make_plugin(egress=("127.0.0.1",), private_egress=("127.0.0.1:80",))
    with host_setup(plugin) as setup, pytest.raises(HostRefused, match=match):
        setup.call("fetch", spec)


def _slow(handler: Handler) -> None:
    time.sleep(3)
    handler.reply(200, b"late")


@pytest.mark.hostile
def test_the_calls_time_left_bounds_a_fetch(server: Server) -> None:
    server.routes["/slow"] = _slow
    # The server answers after 3 s: an answer would mean the limit did not hold.
    with allowed(server) as setup, pytest.raises(HostFailed, match="did not answer in time"):
        setup.call("fetch", {"url": f"http://127.0.0.1:{server.port}/slow"}, seconds=0.5)


def test_a_cancelled_call_stops_its_fetch(server: Server) -> None:
    server.routes["/slow"] = _slow
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with allowed(server) as setup, pytest.raises(HostFailed, match="cancelled"):
        setup.call("fetch", {"url": f"http://127.0.0.1:{server.port}/slow"}, cancel=cancel)


@pytest.mark.hostile
def test_every_address_a_name_resolves_to_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # A public first answer must not hide a private second one (a client trying
    # them in turn would reach it once the first fails).
    real = socket.getaddrinfo

    def mixed(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "mixed.test":
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port)),
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", mixed)
    expected = r"mixed\.test resolves to 10\.0\.0\.7, a private address"
    with (
        host_setup(make_plugin(egress=("mixed.test",))) as setup,
        pytest.raises(HostRefused, match=expected),
    ):
        setup.call("fetch", {"url": "http://mixed.test/"})
