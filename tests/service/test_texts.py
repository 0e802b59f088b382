"""The model's texts, word for word, and the package's public surface."""

from __future__ import annotations

import importlib

import pytest

from workers.service import texts


@pytest.mark.parametrize(
    ("seconds", "written"), [(1.0, "1"), (30, "30"), (2.5, "2.5"), (0.25, "0.25")]
)
def test_seconds_are_written_as_an_integer_when_whole(seconds, written):
    assert texts.format_seconds(seconds) == written


def test_texts_word_for_word():
    assert texts.failed("lookup", 502) == "lookup failed (HTTP 502)"
    assert texts.no_answer("lookup", 30.0) == "lookup: the service did not answer within 30 s"
    assert texts.unreachable("lookup") == "lookup: the service is unreachable"
    assert texts.too_large("lookup") == "lookup: the service's answer was too large"
    assert texts.empty(204) == "[HTTP 204, empty]"
    assert texts.CANCELLED == "[cancelled]"


def test_4xx_json_is_passed_exactly_as_sent():
    assert texts.render_body(400, b'{"a":1}') == '{"a":1}'
    assert texts.render_body(200, b'{"a":1}') == '{\n  "a": 1\n}'


@pytest.mark.parametrize(
    "module",
    [
        "workers.service",
        "workers.service.caller",
        "workers.service.exchange",
        "workers.service.reading",
        "workers.service.redact",
        "workers.service.secrets",
        "workers.service.texts",
        "workers.service.transport",
    ],
)
def test_every_export_exists(module):
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"
