"""The plugin parts of the model: the initiator on a call, `logs` on a result, reprs."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.model import Platform, Plugin
from broker.request import CallRequest, Initiator
from broker.result import ToolResult


def test_the_initiator_defaults_to_the_platform_not_verified() -> None:
    request = CallRequest(call_id="c", agent="a", tool="t", arguments={}, owner="web/x")
    assert request.initiator == Initiator(kind="platform", is_verified_person=False)
    assert request.to_message()["initiator"] == {"kind": "platform", "isVerifiedPerson": False}


def test_the_initiator_crosses_the_message_both_ways() -> None:
    initiator = Initiator(kind="channelSender", is_verified_person=True)
    request = CallRequest(
        call_id="c", agent="a", tool="t", arguments={}, owner="web/x", initiator=initiator
    )
    assert CallRequest.from_message(request.to_message()).initiator == initiator


def test_a_message_without_an_initiator_gets_the_default() -> None:
    message = {"call_id": "c", "agent": "a", "tool": "t", "arguments": {}, "owner": "web/x"}
    assert CallRequest.from_message(message).initiator == Initiator()


@pytest.mark.parametrize(
    "value", [{"kind": "model"}, {"kind": "user", "isVerifiedPerson": "yes"}, "user"]
)
def test_a_bad_initiator_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="initiator"):
        Initiator.from_message(value)


def test_logs_cross_the_result_backend() -> None:
    result = ToolResult(
        call_id="c",
        agent="a",
        tool="t",
        is_error=False,
        output="1",
        logs=({"level": "info", "message": "hi"},),
    )
    assert ToolResult.from_dict(result.to_dict()).logs == result.logs
    older = result.to_dict()
    del older["logs"]
    assert ToolResult.from_dict(older).logs == ()


def test_reprs_never_print_settings_or_platform_secrets() -> None:
    plugin = Plugin(
        slug="weather",
        package_dir=Path("/p"),
        sources=("a.ts",),
        sources_sha256={},
        settings={"api_key": "s3cr3t-value"},
        private_egress=(),
        egress=(),
        permissions=(),
        timeout_seconds=30.0,
        memory_limit_mb=128,
        tools={},
        lock_path=Path("/p/plugin.lock.json"),
    )
    platform = Platform(url="https://tok:s3cr3t@platform", headers={"Authorization": "s3cr3t"})
    assert "s3cr3t" not in repr(plugin)
    assert "s3cr3t" not in repr(platform)
    assert "api_key" in repr(plugin)
