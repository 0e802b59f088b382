"""The one checked boundary: derived permissions first, then each namespace's rules;
and the small namespaces (settings, crypto, log) behind it."""

from __future__ import annotations

import base64
import hashlib
import logging
import uuid

import pytest

from broker.errors import MissingSecret
from workers.plugin.host import HostFailed, HostRefused, permission_of
from workers.plugin.host.logs import MAX_ENTRIES, MAX_MESSAGE_CHARS

from .host_support import host_setup, make_plugin


def test_the_permission_is_the_chain_with_colons() -> None:
    assert permission_of("fetch") == "host:fetch"
    assert permission_of("workspace.write") == "host:workspace:write"
    assert permission_of("session.llm") == "host:session:llm"


@pytest.mark.hostile
def test_a_permission_not_derived_is_refused_before_anything_runs() -> None:
    plugin = make_plugin(permissions=("host:settings:get",), egress=("127.0.0.1",))
    with host_setup(plugin) as setup, pytest.raises(HostRefused) as caught:
        setup.call("fetch", {"url": "http://127.0.0.1:9/"})
    assert str(caught.value) == (
        "host.fetch refused: this plugin's sources do not call host.fetch, so it does not "
        "hold host:fetch"
    )


@pytest.mark.hostile
def test_a_parent_permission_does_not_cover_its_members() -> None:
    # `const ws = host.workspace; ws.write(...)` derives host:workspace only.
    plugin = make_plugin(permissions=("host:workspace",))
    with host_setup(plugin) as setup, pytest.raises(HostRefused, match="host:workspace:write"):
        setup.call("workspace.write", {"path": "a", "content": "x"})


@pytest.mark.hostile
@pytest.mark.parametrize("chain", ["", "fetch..x", "__proto__.x/y", "a.b.c.d.e.f.g", "x y"])
def test_a_malformed_chain_is_refused(chain: str) -> None:
    with host_setup(make_plugin()) as setup, pytest.raises(HostRefused, match="not a host member"):
        setup.call(chain)


def test_a_chain_outside_the_host_api_is_refused() -> None:
    plugin = make_plugin(permissions=("host:process:exit",))
    with host_setup(plugin) as setup, pytest.raises(HostRefused, match="not part of the host API"):
        setup.call("process.exit")


def test_settings_resolve_env_values_and_are_the_plugins_own() -> None:
    plugin = make_plugin(
        settings={"units": "metric", "api_key": "env:WEATHER_KEY", "nested": {"k": "env:NESTED"}}
    )
    environ = {"WEATHER_KEY": "k-0123456789", "NESTED": "short"}
    with host_setup(plugin, environ=environ) as setup:
        assert setup.call("settings.get", "units") == "metric"
        assert setup.call("settings.get", "api_key") == "k-0123456789"
        assert setup.call("settings.get", "missing") is None
        assert setup.call("settings.all") == {
            "units": "metric",
            "api_key": "k-0123456789",
            "nested": {"k": "short"},
        }
        # Only values of eight characters or more are worth redacting.
        assert setup.host.secrets("weather") == ["k-0123456789"]
        assert "k-0123456789" not in repr(setup.host)


def test_a_missing_settings_variable_stops_the_worker_naming_it_not_a_value() -> None:
    plugin = make_plugin(settings={"api_key": "env:WEATHER_KEY", "other": "env:OTHER"})
    with pytest.raises(MissingSecret) as caught, host_setup(plugin, environ={"OTHER": ""}):
        pass
    text = str(caught.value)
    assert "WEATHER_KEY" in text and "OTHER" in text and "'api_key'" in text


def test_crypto() -> None:
    with host_setup(make_plugin()) as setup:
        assert uuid.UUID(setup.call("crypto.randomUUID")).version == 4
        assert len(base64.b64decode(setup.call("crypto.randomBytes", 32))) == 32
        assert setup.call("crypto.digest", "SHA-256", "abc") == hashlib.sha256(b"abc").hexdigest()
        expected = hashlib.sha512("é".encode()).hexdigest()
        assert setup.call("crypto.digest", "sha512", "é") == expected
        with pytest.raises(HostRefused, match="65,536"):
            setup.call("crypto.randomBytes", 10**9)
        with pytest.raises(HostRefused, match="not SHA-1"):
            setup.call("crypto.digest", "MD5", "abc")


def test_logs_go_to_the_worker_log_with_the_call_id_and_onto_the_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with host_setup(make_plugin()) as setup:
        with caplog.at_level(logging.DEBUG, logger="vessel.plugin"):
            setup.call("log.info", "fetching", call_id="c-42")
            setup.call("log.error", {"code": 7}, call_id="c-42")
        assert setup.host.logs("c-42") == [
            {"level": "info", "message": "fetching"},
            {"level": "error", "message": '{"code": 7}'},
        ]
        assert setup.host.logs("c-42") == []  # taken once
    assert any("c-42" in r.getMessage() and "fetching" in r.getMessage() for r in caplog.records)


@pytest.mark.hostile
def test_a_handler_logging_in_a_loop_is_capped() -> None:
    with host_setup(make_plugin()) as setup:
        for _ in range(MAX_ENTRIES + 50):
            setup.call("log.debug", "x" * (MAX_MESSAGE_CHARS * 3))
        entries = setup.host.logs("call-1")
    assert all(len(e["message"]) <= MAX_MESSAGE_CHARS for e in entries[:-1])
    assert len(entries) < MAX_ENTRIES + 1
    assert "more log entries dropped" in entries[-1]["message"]


def test_workspace_without_a_store_is_not_available() -> None:
    with host_setup(make_plugin()) as setup, pytest.raises(HostFailed, match="no workspaces"):
        setup.call("workspace.read", "a.txt")
