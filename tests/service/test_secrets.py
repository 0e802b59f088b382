"""`env:` resolution, MissingSecret, and secrets never in a repr, an error or a log."""

from __future__ import annotations

import logging

import pytest

from broker.errors import ConfigError, MissingSecret
from workers.service import ServiceCaller
from workers.service.redact import Redactor
from workers.service.secrets import resolve_grants

PATH = "/agent-tools/lookup"
SECRET = "env-secret-value-987654321"


def test_env_header_is_resolved_from_environ(http_server, make_caller):
    http_server.answer(PATH, 200, b"{}")
    setup = make_caller(
        http_server.url,
        headers={"X-Internal-Token": "env:RECORDS_TOKEN"},
        environ={"RECORDS_TOKEN": SECRET},
    )
    setup.call()
    assert http_server.received[0].headers["x-internal-token"] == SECRET


def test_env_url_is_resolved_from_environ(http_server, make_caller):
    http_server.answer(PATH, 200, b"found")
    setup = make_caller("env:RECORDS_URL", environ={"RECORDS_URL": http_server.url})
    assert setup.call().output == "found"


def test_missing_variable_names_it_and_never_a_value(deployment_factory):
    deployment = deployment_factory(
        url="http://127.0.0.1:9", headers={"X-Internal-Token": "env:RECORDS_TOKEN"}
    )
    with pytest.raises(MissingSecret) as info:
        ServiceCaller(deployment, environ={"OTHER": SECRET})
    message = str(info.value)
    assert "RECORDS_TOKEN" in message
    assert "records-agent" in message
    assert "'records'" in message
    assert "X-Internal-Token" in message
    assert SECRET not in message


def test_empty_variable_is_missing(deployment_factory):
    deployment = deployment_factory(
        url="http://127.0.0.1:9", headers={"X-Internal-Token": "env:RECORDS_TOKEN"}
    )
    with pytest.raises(MissingSecret, match="RECORDS_TOKEN"):
        ServiceCaller(deployment, environ={"RECORDS_TOKEN": ""})


def test_every_missing_variable_is_listed_at_once(deployment_factory):
    deployment = deployment_factory(
        url="env:RECORDS_URL",
        headers={"X-Internal-Token": "env:RECORDS_TOKEN", "X-Other": "env:OTHER_TOKEN"},
    )
    with pytest.raises(MissingSecret) as info:
        ServiceCaller(deployment, environ={})
    for name in ("RECORDS_URL", "RECORDS_TOKEN", "OTHER_TOKEN"):
        assert name in str(info.value)


def test_only_the_given_agents_are_resolved(deployment_factory):
    deployment = deployment_factory(
        url="http://127.0.0.1:9",
        extra_agents={"other-agent": {"X-Internal-Token": "env:NOT_SET_HERE"}},
    )
    with ServiceCaller(deployment, agents=["records-agent"], environ={}) as caller:
        assert "records-agent" in repr(caller)
    with pytest.raises(MissingSecret, match="NOT_SET_HERE"):
        ServiceCaller(deployment, environ={})


def test_a_header_value_with_a_line_break_is_refused_without_the_value(deployment_factory):
    deployment = deployment_factory(
        url="http://127.0.0.1:9", headers={"X-Internal-Token": "env:RECORDS_TOKEN"}
    )
    with pytest.raises(ConfigError) as info:
        ServiceCaller(deployment, environ={"RECORDS_TOKEN": SECRET + "\r\nX-Evil: 1"})
    assert "X-Internal-Token" in str(info.value)
    assert SECRET not in str(info.value)


def test_an_env_url_that_is_not_http_is_refused_without_the_url(deployment_factory):
    deployment = deployment_factory(url="env:RECORDS_URL")
    with pytest.raises(ConfigError) as info:
        ServiceCaller(deployment, environ={"RECORDS_URL": f"ftp://{SECRET}@host/x"})
    assert SECRET not in str(info.value)
    with pytest.raises(ConfigError):
        ServiceCaller(deployment, environ={"RECORDS_URL": "http://host/x?token=1"})


def test_a_vessel_header_in_a_grant_is_refused(deployment_factory):
    deployment = deployment_factory(url="http://127.0.0.1:9", headers={"X-Vessel-Owner": "me"})
    with pytest.raises(ConfigError, match="X-Vessel-"):
        ServiceCaller(deployment, environ={})


def test_reprs_hold_no_secret(deployment_factory):
    deployment = deployment_factory(
        url="env:RECORDS_URL",
        headers={"X-Internal-Token": "env:RECORDS_TOKEN", "X-Literal": "literal-secret-1234"},
    )
    environ = {"RECORDS_TOKEN": SECRET, "RECORDS_URL": "http://user:pw-secret@127.0.0.1:9"}
    with ServiceCaller(deployment, environ=environ) as caller:
        texts = [repr(caller), str(caller)]
        grants = resolve_grants(deployment, environ=environ)
        texts += [repr(grants), str(grants)]
        texts.append(repr(Redactor([SECRET])))
        texts.append(repr(deployment))
    for text in texts:
        assert SECRET not in text
        assert "literal-secret-1234" not in text
        assert "pw-secret" not in text


def test_no_secret_in_any_log_even_at_debug(http_server, make_caller, caplog):
    # The service echoes the token in a response header and the body; httpcore
    # would log response headers at DEBUG.
    http_server.route(
        PATH,
        lambda h: h.reply(
            500, h.headers["X-Internal-Token"].encode(), {"X-Echo": h.headers["X-Internal-Token"]}
        ),
    )
    caplog.set_level(logging.DEBUG)
    setup = make_caller(
        "env:RECORDS_URL",
        headers={"X-Internal-Token": "env:RECORDS_TOKEN"},
        environ={"RECORDS_TOKEN": SECRET, "RECORDS_URL": http_server.url},
    )
    result = setup.call()
    assert result.output == "lookup failed (HTTP 500)"
    assert http_server.received[0].headers["x-internal-token"] == SECRET
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert SECRET not in logged
    assert SECRET not in repr(result.to_dict())
