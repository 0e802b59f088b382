"""Seed 001: granted header values of eight or more characters never reach the model."""

from __future__ import annotations

import json

import pytest

from workers.service.redact import REDACTED, Redactor

PATH = "/agent-tools/lookup"


def _echo(status: int):
    def route(h):
        h.reply(status, f"you sent {h.headers['X-Internal-Token']} to me".encode())

    return route


@pytest.mark.parametrize("status", [200, 400])
def test_body_echoing_the_token_is_redacted(http_server, make_caller, token, status):
    http_server.route(PATH, _echo(status))
    result = make_caller(http_server.url).call()
    assert result.output == "you sent [redacted] to me"
    assert token not in result.output


def test_seven_character_value_is_not_redacted(http_server, make_caller):
    http_server.route(PATH, _echo(200))
    result = make_caller(http_server.url, headers={"X-Internal-Token": "abc1234"}).call()
    assert result.output == "you sent abc1234 to me"


def test_eight_character_value_is_redacted(http_server, make_caller):
    http_server.route(PATH, _echo(200))
    result = make_caller(http_server.url, headers={"X-Internal-Token": "abcd1234"}).call()
    assert result.output == "you sent [redacted] to me"


def test_token_in_reindented_json_is_redacted(http_server, make_caller, token):
    http_server.route(PATH, lambda h: h.reply(200, json.dumps({"echo": token}).encode()))
    result = make_caller(http_server.url).call()
    assert result.output == json.dumps({"echo": REDACTED}, indent=2)


def test_token_hidden_behind_json_escapes_is_redacted(http_server, make_caller, token):
    escaped = "".join(f"\\u{ord(c):04x}" for c in token)
    http_server.route(PATH, lambda h: h.reply(200, ('{"echo": "' + escaped + '"}').encode()))
    result = make_caller(http_server.url).call()
    assert token not in result.output
    assert REDACTED in result.output


def test_token_with_a_quote_is_redacted_after_reindenting(http_server, make_caller):
    value = 'quote"in-the-token'
    http_server.route(PATH, lambda h: h.reply(200, json.dumps({"echo": value}).encode()))
    result = make_caller(http_server.url, headers={"X-Internal-Token": value}).call()
    assert "in-the-token" not in result.output


def test_every_granted_value_is_redacted(http_server, make_caller):
    headers = {"X-Internal-Token": "first-secret-1", "Authorization": "Bearer second-secret-2"}
    http_server.route(
        PATH,
        lambda h: h.reply(
            200, f"{h.headers['Authorization']} {h.headers['X-Internal-Token']}".encode()
        ),
    )
    assert make_caller(http_server.url, headers=headers).call().output == "[redacted] [redacted]"


def test_redaction_comes_before_cutting(http_server, make_caller, token):
    http_server.route(PATH, lambda h: h.reply(200, ("x" * 15 + token).encode()))
    result = make_caller(http_server.url, output_chars=20).call()
    assert result.output.startswith("x" * 15 + "[reda")
    assert token[:5] not in result.output


def test_redactor_replaces_the_longest_value_first():
    redact = Redactor(["secret-12", "secret-1234567"])
    assert redact("a secret-1234567 b secret-12") == "a [redacted] b [redacted]"
    assert Redactor([])("unchanged") == "unchanged"
    assert Redactor(["short"])("short") == "short"
