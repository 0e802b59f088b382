"""The request the application receives (seed 001), as the server saw it."""

from __future__ import annotations

import json

import pytest

PATH = "/agent-tools/lookup"


def test_request_line_body_and_headers(http_server, make_caller, token):
    http_server.answer(PATH, 200, b"{}")
    make_caller(http_server.url).call({"id": "A-1042"})
    [got] = http_server.received
    assert got.method == "POST"
    assert got.path == PATH
    assert got.body == b'{"id": "A-1042"}'
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-internal-token"] == token
    assert got.headers["x-vessel-owner"] == "web/alice"
    assert got.headers["x-vessel-agent"] == "records-agent"
    assert got.headers["x-vessel-tool"] == "lookup"
    assert got.headers["host"] == http_server.url.removeprefix("http://")
    # Asked for identity, so the body cap is a cap on bytes.
    assert got.headers["accept-encoding"] == "identity"
    assert "cookie" not in got.headers


@pytest.mark.parametrize("owner", ["web/alice", "https://issuer.example|user-42", "app-1/u.ser_2"])
def test_owner_formats_as_received(http_server, make_caller, owner):
    http_server.answer(PATH, 200, b"{}")
    make_caller(http_server.url).call(owner=owner)
    assert http_server.received[0].headers["x-vessel-owner"] == owner


def test_every_grant_header_is_sent_as_written(http_server, make_caller):
    http_server.answer(PATH, 200, b"{}")
    headers = {"X-Internal-Token": "abc", "Authorization": "Bearer xyz-123456", "X-Tenant": "t1"}
    make_caller(http_server.url, headers=headers).call()
    items = dict(http_server.received[0].header_items)
    for name, value in headers.items():
        assert items[name] == value


def test_grant_cannot_override_content_type(http_server, make_caller):
    http_server.answer(PATH, 200, b"{}")
    make_caller(http_server.url, headers={"Content-Type": "text/plain"}).call()
    assert http_server.received[0].headers["content-type"] == "application/json"


def test_url_with_a_path_and_trailing_slash(http_server, make_caller):
    http_server.answer("/base" + PATH, 200, b"ok")
    result = make_caller(http_server.url + "/base/").call()
    assert result.output == "ok"
    assert http_server.received[0].path == "/base" + PATH


def test_non_ascii_arguments_are_valid_json(http_server, make_caller):
    http_server.answer(PATH, 200, b"{}")
    arguments = {"id": "Zwölf \u2603", "nested": {"list": [1, 2.5, None, True]}}
    make_caller(http_server.url).call(arguments)
    assert json.loads(http_server.received[0].body) == arguments


def test_cookies_are_never_kept(http_server, make_caller):
    http_server.answer(PATH, 200, b"{}", {"Set-Cookie": "session=abc123; Path=/"})
    setup = make_caller(http_server.url)
    setup.call(owner="web/alice")
    setup.call(owner="web/bob")
    assert [r.headers.get("cookie") for r in http_server.received] == [None, None]


def test_proxy_variables_are_ignored(http_server, raw_server, make_caller, monkeypatch):
    proxy = raw_server(lambda conn, s: s.read_request(conn))
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("ALL_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    http_server.answer(PATH, 200, b"direct")
    assert make_caller(http_server.url).call().output == "direct"
    assert proxy.connections == 0


def test_an_agent_this_worker_does_not_serve_is_refused(
    http_server, make_caller, deployment_factory
):
    http_server.answer(PATH, 200, b"{}")
    setup = make_caller(http_server.url)
    other = deployment_factory(url=http_server.url, agent_id="other-agent").agents["other-agent"]
    result = setup.caller.call(
        call_id="c-9", agent=other, tool=setup.tool, arguments={}, owner="web/alice"
    )
    assert result.is_error
    assert result.outcome == "refused"
    assert "other-agent" in result.output
    assert http_server.received == []


def test_a_closed_caller_sends_nothing(http_server, make_caller):
    http_server.answer(PATH, 200, b"{}")
    setup = make_caller(http_server.url)
    setup.caller.close()
    result = setup.call()
    assert result.output == "lookup: the service is unreachable"
    assert http_server.received == []
