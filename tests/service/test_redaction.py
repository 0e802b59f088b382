"""Seed 001: granted header values of eight or more characters never reach the model."""

from __future__ import annotations

import base64
import json
import re

import pytest

from workers.service.redact import REDACTED, Redactor

from .conftest import TOKEN

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


# --- every spelling of a granted value, at 2xx and 4xx, whatever the body's shape ---


def _b64(data: bytes, *, url: bool = False, pad: bool = True) -> str:
    text = (base64.urlsafe_b64encode if url else base64.b64encode)(data).decode()
    return text if pad else text.rstrip("=")


def _mixed_escapes(value: str) -> str:
    # Every other character as \uXXXX with mixed-case hex digits, the rest plain.
    out = []
    for i, c in enumerate(value):
        digits = f"{ord(c):04x}"
        out.append(f"\\u{digits[:2]}{digits[2:].upper()}" if i % 2 else c)
    return "".join(out)


#: name -> the token as a hostile service spells it (all safe inside a JSON string).
FORMS = {
    "exact": lambda t: t,
    "upper": str.upper,
    "swapped-case": str.swapcase,
    "json-escapes": lambda t: "".join(f"\\u{ord(c):04x}" for c in t),
    "json-escapes-upper-hex": lambda t: "".join(f"\\u{ord(c):04X}" for c in t),
    "json-escapes-mixed": _mixed_escapes,
    "json-escapes-of-upper": lambda t: "".join(f"\\u{ord(c):04x}" for c in t.upper()),
    "base64": lambda t: _b64(t.encode()),
    "base64-unpadded": lambda t: _b64(t.encode(), pad=False),
    "base64-url": lambda t: _b64(b"\xfb\xff" + t.encode(), url=True, pad=False),
    "base64-offset-1": lambda t: _b64(b"<" + t.encode() + b">>"),
    "base64-offset-2": lambda t: _b64(b"<<" + t.encode() + b">"),
    # 15 bytes before the token: its base64 is characters 20 to 50 (31 with padding).
    "base64-in-longer": lambda t: _b64(b"Authorization: " + t.encode() + b"\r\n" * 3),
    "hex": lambda t: t.encode().hex(),
    "hex-upper": lambda t: t.encode().hex().upper(),
    "percent-all": lambda t: "".join(f"%{b:02x}" for b in t.encode()),
    "percent-all-upper": lambda t: "".join(f"%{b:02X}" for b in t.encode()),
    "percent-mixed": lambda t: "".join(f"%{ord(c):02x}" if i % 3 else c for i, c in enumerate(t)),
}

#: name -> (a body holding `form`, whether a 2xx body of this shape is re-indented).
SHAPES = {
    "text": lambda form: f"you sent {form} to me",
    "json": lambda form: '{"echo": "' + form + '"}',
    # Re-indenting is given up: too deep to parse, or too large once indented.
    "deep-json": lambda form: "[" * 1200 + '"' + form + '"' + "]" * 1200,
    "huge-json": lambda form: '{"echo": "' + form + '", "pad": [[[' + "0," * 300_000 + "0]]]}",
}


def _windows(form: str) -> list[str]:
    """8-character pieces of `form`, its first and last 4 characters aside.

    Base64 at an offset shares a few edge characters with its neighbours:
    those are all a redaction may leave.
    """
    inner = form[4:-4]
    return [inner[i : i + 8] for i in range(len(inner) - 7)]


@pytest.mark.parametrize("status", [200, 400])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_spelling_of_the_token_is_redacted(http_server, make_caller, status, shape, form):
    token = TOKEN
    spelled = FORMS[form](token)
    body = SHAPES[shape](spelled).encode()
    http_server.answer(PATH, status, body)
    result = make_caller(http_server.url).call()
    assert result.status == status
    if shape != "json" or status != 200:
        # The body reached the model as sent: nothing decoded the spelling first.
        assert result.output[:8] == body.decode()[:8]
    else:
        assert result.output.startswith('{\n  "echo": ')
    assert REDACTED in result.output
    assert token not in result.output
    secret = spelled[20:51] if form == "base64-in-longer" else spelled
    leaks = [w for w in _windows(secret) if w in result.output]
    assert leaks == [], leaks


def test_a_token_hidden_in_a_doubly_encoded_json_string_is_redacted(http_server, make_caller):
    value = 'quote"in/the\\token'
    body = json.dumps({"inner": json.dumps({"echo": value})}).encode()
    http_server.answer(PATH, 400, body)
    result = make_caller(http_server.url, headers={"X-Internal-Token": value}).call()
    assert "in/the" not in result.output and "in\\\\/the" not in result.output
    assert REDACTED in result.output


def test_percent_encoding_with_plus_for_space_is_redacted(http_server, make_caller):
    value = "Bearer abc-def-123"
    http_server.answer(PATH, 200, b"auth=Bearer+abc%2Ddef-123&x=1")
    result = make_caller(http_server.url, headers={"Authorization": value}).call()
    assert result.output == "auth=[redacted]&x=1"


def test_redactor_matches_escapes_of_any_character():
    value = "pässwörd-😀-tail"
    redact = Redactor([value])
    escaped = json.dumps(value)[1:-1]  # \u00e4 ... \ud83d\ude00
    assert "\\ud83d\\ude00" in escaped
    assert redact(f"<{escaped}>") == f"<{REDACTED}>"
    upper_hex = re.sub(r"\\u[0-9a-f]{4}", lambda m: "\\u" + m[0][2:].upper(), escaped)
    assert upper_hex != escaped
    assert redact(f"<{upper_hex}>") == f"<{REDACTED}>"
    percent = "".join(f"%{b:02x}" for b in value.encode())
    assert redact(f"<{percent}>") == f"<{REDACTED}>"
    assert redact(f"<{value.upper()}>") == f"<{REDACTED}>"


def test_redactor_keeps_other_text_whole():
    redact = Redactor(["s3cr3t-token-0123456789"])
    text = "plain words, 0123456789, s3cr3t, %41, \\u0041, and YWJj all stay"
    assert redact(text) == text


def test_a_million_backslashes_is_linear():
    # A bound on the backslashes an escape may carry keeps this one pass.
    redact = Redactor(["/start-with-a-slash", '"quoted-value"'])
    text = "\\" * 1_000_000
    assert redact(text) == text
