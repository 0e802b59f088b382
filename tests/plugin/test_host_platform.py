"""The platform's namespaces, forwarded to a real HTTP server standing in for the platform."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from broker.errors import MissingSecret
from broker.model import Platform
from broker.request import Initiator
from workers.plugin.host import HostFailed

from .host_support import Handler, Server, host_setup, http_server, make_plugin

TOKEN = "platform-token-0123456789"


@pytest.fixture
def platform() -> Iterator[Server]:
    with http_server() as server:
        yield server


def _config(server: Server) -> Platform:
    return Platform(
        url=f"http://127.0.0.1:{server.port}/",
        headers={"Authorization": "env:PLATFORM_TOKEN", "X-Region": "eu"},
    )


def test_a_platform_call_is_forwarded_with_who_is_asking(platform: Server) -> None:
    platform.answer("/host/session.post", 200, b'{"messageId": "m-1"}')
    with host_setup(
        make_plugin(), platform=_config(platform), environ={"PLATFORM_TOKEN": TOKEN}
    ) as setup:
        answer = setup.call(
            "session.post",
            {"text": "hello"},
            call_id="c-9",
            initiator=Initiator(kind="schedule", is_verified_person=False),
        )
        assert setup.host.secrets("weather") == [TOKEN]
    assert answer == {"messageId": "m-1"}
    seen = platform.seen[0]
    assert seen.method == "POST" and seen.path == "/host/session.post"
    assert json.loads(seen.body) == {"args": [{"text": "hello"}]}
    assert seen.headers["authorization"] == TOKEN
    assert seen.headers["x-region"] == "eu"
    assert seen.headers["x-vessel-owner"] == "web/alice"
    assert seen.headers["x-vessel-agent"] == "field-guide"
    assert seen.headers["x-vessel-tool"] == "weather__get_forecast"
    assert seen.headers["x-vessel-call"] == "c-9"
    assert seen.headers["x-vessel-initiator"] == "schedule"
    assert seen.headers["x-vessel-verified"] == "false"


@pytest.mark.parametrize("chain", ["license", "llm", "session.llm", "agents.create"])
def test_every_platform_namespace_is_forwarded(platform: Server, chain: str) -> None:
    platform.answer(f"/host/{chain}", 200, b"")
    with host_setup(
        make_plugin(), platform=_config(platform), environ={"PLATFORM_TOKEN": TOKEN}
    ) as setup:
        assert setup.call(chain, "a", 2) is None  # an empty answer is null
    assert json.loads(platform.seen[0].body) == {"args": ["a", 2]}
    assert platform.seen[0].headers["x-vessel-verified"] == "false"


def test_a_non_2xx_answer_rejects_with_its_status(platform: Server) -> None:
    platform.answer("/host/session.post", 403, b'{"error": "no"}')
    with (
        host_setup(
            make_plugin(), platform=_config(platform), environ={"PLATFORM_TOKEN": TOKEN}
        ) as setup,
        pytest.raises(HostFailed) as caught,
    ):
        setup.call("session.post", {"text": "x"})
    assert str(caught.value) == "host.session.post failed: the platform answered HTTP 403"


def test_an_answer_that_is_not_json_rejects(platform: Server) -> None:
    platform.routes["/host/llm"] = lambda h: Handler.reply(h, 200, b"<html>")
    with (
        host_setup(
            make_plugin(), platform=_config(platform), environ={"PLATFORM_TOKEN": TOKEN}
        ) as setup,
        pytest.raises(HostFailed, match="not JSON"),
    ):
        setup.call("llm", "hi")


def test_without_a_platform_the_call_names_what_is_not_available() -> None:
    with host_setup(make_plugin()) as setup, pytest.raises(HostFailed) as caught:
        setup.call("session.post", {"text": "x"})
    assert str(caught.value) == (
        "host.session.post is not available: this deployment has no [platform] to answer it"
    )


def test_a_missing_platform_variable_stops_the_worker(platform: Server) -> None:
    with (
        pytest.raises(MissingSecret, match="PLATFORM_TOKEN"),
        host_setup(make_plugin(), platform=_config(platform)),
    ):
        pass
