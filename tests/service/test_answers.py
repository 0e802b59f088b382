"""One test per row of seed 001's "What the model sees", against a real server."""

from __future__ import annotations

import gzip
import json

PATH = "/agent-tools/lookup"


def test_2xx_json_body_is_reindented(http_server, make_caller):
    payload = {"record": {"id": "A-1042", "name": "Zwölf"}, "tags": [1, 2]}
    http_server.answer(
        PATH,
        200,
        json.dumps(payload, separators=(",", ":")).encode(),
        {"Content-Type": "application/json"},
    )
    result = make_caller(http_server.url).call()
    assert result.output == json.dumps(payload, indent=2, ensure_ascii=False)
    assert not result.is_error
    assert result.status == 200
    assert result.outcome == "ok"
    assert result.tool == "lookup"
    assert result.agent == "records-agent"
    assert result.call_id == "c-1"
    assert result.duration_ms > 0


def test_2xx_non_json_body_is_passed_as_is(http_server, make_caller):
    body = "Record A-1042:\n   a swift  \n{not json"
    http_server.answer(PATH, 200, body.encode(), {"Content-Type": "text/plain"})
    result = make_caller(http_server.url).call()
    assert result.output == body
    assert not result.is_error


def test_2xx_json_scalar_is_passed_as_is(http_server, make_caller):
    http_server.answer(PATH, 201, b"  42  ", {"Content-Type": "application/json"})
    result = make_caller(http_server.url).call()
    assert result.output == "  42  "
    assert result.status == 201


def test_2xx_nan_is_not_json_and_is_passed_as_is(http_server, make_caller):
    http_server.answer(PATH, 200, b'{"a": NaN}')
    assert make_caller(http_server.url).call().output == '{"a": NaN}'


def test_4xx_body_is_an_error_with_the_body(http_server, make_caller):
    body = b'{"error": "no record with id \'Z-1\'", "hint": "ids look like A-1042"}'
    http_server.answer(PATH, 404, body, {"Content-Type": "application/json"})
    result = make_caller(http_server.url).call({"id": "Z-1"})
    assert result.output == body.decode()
    assert result.is_error
    assert result.status == 404
    assert result.outcome == "error"


def test_3xx_is_failed_with_status(http_server, make_caller):
    http_server.answer(PATH, 304, b"")
    result = make_caller(http_server.url).call()
    assert result.output == "lookup failed (HTTP 304)"
    assert result.is_error
    assert result.status == 304


def test_5xx_is_failed_with_status_and_body_not_shown(http_server, make_caller):
    http_server.answer(PATH, 503, b"Traceback: internal details")
    result = make_caller(http_server.url).call()
    assert result.output == "lookup failed (HTTP 503)"
    assert result.is_error
    assert result.status == 503
    assert result.outcome == "error"


def test_empty_2xx_body(http_server, make_caller):
    http_server.answer(PATH, 200, b"")
    result = make_caller(http_server.url).call()
    assert result.output == "[HTTP 200, empty]"
    assert not result.is_error


def test_204_no_content(http_server, make_caller):
    http_server.route(PATH, lambda h: h.reply(204, b"", {"Content-Length": "0"}))
    result = make_caller(http_server.url).call()
    assert result.output == "[HTTP 204, empty]"
    assert not result.is_error


def test_whitespace_only_body_is_empty(http_server, make_caller):
    http_server.answer(PATH, 200, b" \r\n\t")
    assert make_caller(http_server.url).call().output == "[HTTP 200, empty]"


def test_empty_4xx_body_is_an_error(http_server, make_caller):
    http_server.answer(PATH, 409, b"")
    result = make_caller(http_server.url).call()
    assert result.output == "[HTTP 409, empty]"
    assert result.is_error


def test_body_is_decoded_as_utf8_with_replacement(http_server, make_caller):
    http_server.answer(PATH, 200, b"caf\xc3\xa9 \xff\xfe end")
    assert make_caller(http_server.url).call().output == "café \ufffd\ufffd end"


def test_result_is_cut_to_tool_output_chars(http_server, make_caller):
    http_server.answer(PATH, 200, b"x" * 500)
    result = make_caller(http_server.url, output_chars=100).call()
    assert result.output == "x" * 100 + "\n[400 characters dropped]"
    assert result.dropped_chars == 400


def test_gzip_body_sent_anyway_is_decoded(http_server, make_caller):
    http_server.answer(PATH, 200, gzip.compress(b"hello, compressed"), {"Content-Encoding": "gzip"})
    assert make_caller(http_server.url).call().output == "hello, compressed"


def test_gzip_bomb_is_too_large(http_server, make_caller):
    bomb = gzip.compress(b"\0" * 20_000_000)
    assert len(bomb) < 1_000_000
    http_server.answer(PATH, 200, bomb, {"Content-Encoding": "gzip"})
    assert (
        make_caller(http_server.url).call().output == "lookup: the service's answer was too large"
    )


def test_body_of_exactly_the_cap_is_shown(http_server, make_caller):
    http_server.answer(PATH, 200, b"y" * 1_000_000)
    result = make_caller(http_server.url, output_chars=10).call()
    assert not result.is_error
    assert result.output.startswith("yyyyyyyyyy\n[")
    assert result.dropped_chars == 999_990


def test_body_one_byte_over_the_cap_is_too_large(http_server, make_caller):
    http_server.answer(PATH, 200, b"y" * 1_000_001)
    result = make_caller(http_server.url).call()
    assert result.output == "lookup: the service's answer was too large"
    assert result.is_error
    assert result.status == 200
    assert result.outcome == "error"


def test_deeply_nested_json_is_passed_as_is(http_server, make_caller):
    body = b"[" * 200_000 + b"]" * 200_000
    http_server.answer(PATH, 200, body)
    result = make_caller(http_server.url, output_chars=50).call()
    assert result.output.startswith("[" * 50)
    assert not result.is_error


def test_reindent_that_would_explode_is_given_up(http_server, make_caller):
    # 400 levels deep, then many small items: re-indented, every item would
    # carry 800 spaces (hundreds of MB); the body is passed as is instead.
    body = ("[" * 400 + ",".join(["1"] * 200_000) + "]" * 400).encode()
    http_server.answer(PATH, 200, body)
    result = make_caller(http_server.url, output_chars=30).call()
    assert result.output.startswith("[" * 30)
    assert result.dropped_chars == len(body) - 30


def test_token_is_not_shown_in_the_answer(http_server, make_caller, token):
    http_server.route(PATH, lambda h: h.reply(200, f"token={token}".encode()))
    assert make_caller(http_server.url).call().output == "token=[redacted]"
