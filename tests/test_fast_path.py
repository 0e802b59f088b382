"""broker/fast_path.py: the envelope fast path runs only where its checks pass; otherwise
every call is published with send_task, one log line says why, and calls still arrive.

These run on whatever celery/kombu/redis-py the venv holds: scripts/check runs them on
the newest supported releases (fast path on) and scripts/test-lowest on the oldest
(kombu before 5.7 has no batch publishing: fast path off, by the version check).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import celery
import kombu
import pytest
import redis
from celery import Celery
from conftest import EXAMPLES

from broker import fast_path
from broker.admission import RedisAdmission
from broker.admission.publish import publish
from broker.celery_app import make_app
from broker.client import VesselClient
from broker.config import Settings
from broker.envelope import build_envelope, probe_message
from broker.loading import load_deployment
from broker.queues import shared_lane
from broker.transport import SAFE_TRANSPORT, TRANSPORT, transport_for

#: True where this venv's kombu and Celery are ones the envelope is known to work on.
KNOWN = (
    fast_path.release(kombu.__version__) in fast_path.KNOWN_KOMBU
    and fast_path.release(celery.__version__) in fast_path.KNOWN_CELERY
)
needs_known = pytest.mark.skipif(
    not KNOWN, reason=f"kombu {kombu.__version__}: the envelope is off by the version check"
)
LANE = shared_lane("sandbox")


@pytest.fixture
def plain(redis_url: str) -> Iterator[redis.Redis[str]]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def admission(redis_url: str) -> Iterator[RedisAdmission]:
    found = RedisAdmission.from_url(redis_url)
    yield found
    found.close()


def _client(redis_url: str, **conf: Any) -> VesselClient:
    """A client whose app has `conf` on top of make_app's configuration."""
    settings = Settings(broker_url=redis_url)
    deployment = load_deployment(EXAMPLES / "deployment.toml")
    app = make_app(settings)
    app.conf.update(conf)
    return VesselClient(deployment, settings, app=app, admission=RedisAdmission.from_url(redis_url))


def _close(client: VesselClient) -> None:
    """Close a `_client` client and the app it was given (a client closes only its own)."""
    client.close()
    client.app.close()


def _fallbacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("fast path off")]


def _lane(plain: redis.Redis[str], key: str = LANE) -> list[dict[str, Any]]:
    return [json.loads(m) for m in reversed(plain.lrange(key, 0, -1))]


def test_versions_are_read_as_major_minor() -> None:
    assert fast_path.release("5.7.0") == (5, 7)
    assert fast_path.release("5.6.0rc1") == (5, 6)
    assert fast_path.release("garbage") == (0, 0)


def test_the_fast_path_is_on_exactly_where_this_kombu_and_celery_are_known(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker.fast_path")
    client = VesselClient(
        load_deployment(EXAMPLES / "deployment.toml"), Settings(broker_url=redis_url)
    )
    try:
        assert client.fast_path.enabled is KNOWN
        if KNOWN:
            assert _fallbacks(caplog) == []
        else:
            assert _fallbacks(caplog) == [
                f"fast path off: {client.fast_path.reason}; calls are published with "
                "Celery's send_task"
            ]
            assert kombu.__version__ in client.fast_path.reason
    finally:
        client.close()


def test_the_setting_turns_the_fast_path_and_the_transport_off(
    redis_url: str, plain: redis.Redis[str], caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings.from_environ({"VESSEL_BROKER_URL": redis_url, "VESSEL_FAST_PATH": "off"})
    assert settings.fast_path is False
    caplog.set_level(logging.INFO, logger="broker.fast_path")
    client = VesselClient(load_deployment(EXAMPLES / "deployment.toml"), settings)
    try:
        assert client.fast_path.reason == "VESSEL_FAST_PATH=off"
        # Asked for: one line at info level, no warning on every command.
        (line,) = [r for r in caplog.records if r.getMessage().startswith("fast path off")]
        assert line.levelno == logging.INFO
        # kombu's own Redis transport with only the restore that cannot end a worker.
        assert client.app.conf.broker_transport == SAFE_TRANSPORT
        client.admission.heartbeat("sandbox", "w1", {LANE: 1}, 10_000)
        handle = client.submit("field-guide", "species", {}, owner="web/alice")
        (waiting,) = _lane(plain)
        # Published by send_task: kombu's own delivery tag, not admission's.
        assert waiting["headers"]["id"] == handle.call_id
        assert not waiting["properties"]["delivery_tag"].startswith("vessel-")
    finally:
        client.close()


def test_a_redis_or_tls_worker_the_shortcuts_are_refused_to_still_restores_safely() -> None:
    def transport(url: str, fast: bool) -> str | None:
        return transport_for(Settings(broker_url=url, fast_path=fast))

    assert transport("redis://127.0.0.1:6379/0", True) == TRANSPORT
    assert transport("redis://127.0.0.1:6379/0", False) == SAFE_TRANSPORT
    # TLS alike (its TLS settings come from the URL, whatever the class).
    tls = "rediss://127.0.0.1:6379/0?ssl_cert_reqs=required"
    assert transport(tls, True) == TRANSPORT
    assert transport(tls, False) == SAFE_TRANSPORT


def test_a_bad_setting_is_refused_with_its_name() -> None:
    from broker.errors import ConfigError

    with pytest.raises(ConfigError, match="VESSEL_FAST_PATH must be `on` or `off`, not 'maybe'"):
        Settings.from_environ({"VESSEL_FAST_PATH": "maybe"})


@needs_known
def test_a_global_keyprefix_turns_the_fast_path_off_and_calls_reach_the_prefixed_lane(
    redis_url: str, plain: redis.Redis[str]
) -> None:
    template = make_app(Settings(broker_url=redis_url))
    options = {**template.conf.broker_transport_options}
    template.close()
    options["global_keyprefix"] = "tenant1:"
    client = _client(redis_url, broker_transport_options=options)
    try:
        assert not client.fast_path.enabled
        assert "global_keyprefix" in client.fast_path.reason
        client.admission.heartbeat("sandbox", "w1", {LANE: 1}, 10_000)
        handle = client.submit("field-guide", "species", {}, owner="web/alice")
        # Where a worker with the same prefix reads, not the bare lane.
        assert _lane(plain) == []
        assert [m["headers"]["id"] for m in _lane(plain, f"tenant1:{LANE}")] == [handle.call_id]
    finally:
        _close(client)


@needs_known
@pytest.mark.parametrize(
    ("conf", "says"),
    [
        ({"task_default_priority": 5}, "priorities"),
        ({"task_queue_max_priority": 10}, "priorities"),
        ({"broker_transport": "redis"}, "not broker.transport's"),
    ],
)
def test_priorities_and_a_foreign_transport_turn_the_fast_path_off(
    redis_url: str, conf: dict[str, Any], says: str
) -> None:
    client = _client(redis_url, **conf)
    try:
        assert not client.fast_path.enabled
        assert says in client.fast_path.reason
    finally:
        _close(client)


@needs_known
def test_a_workers_report_turns_the_fast_path_off_for_new_clients_and_for_admission(
    redis_url: str, plain: redis.Redis[str]
) -> None:
    before = _client(redis_url)  # started while every worker passed its self-test
    try:
        assert before.fast_path.enabled
        before.admission.turn_fast_path_off("the worker self-test failed: because", 10_000)
        after = _client(redis_url)
        try:
            assert (
                after.fast_path.reason == "a worker reported: the worker self-test failed: because"
            )
        finally:
            _close(after)
        # `before` still builds envelopes, but admission no longer pushes them:
        # the call comes back to be published with send_task.
        before.admission.heartbeat("sandbox", "w1", {LANE: 1}, 10_000)
        message = {"call_id": "d" * 32, "agent": "a", "tool": "t", "arguments": {}, "owner": "o"}
        envelope = build_envelope(before.app, "sandbox", "d" * 32, message)
        assert envelope is not None
        rows = before.admission.submit(
            call_id="d" * 32,
            kind="sandbox",
            agent="a",
            message=json.dumps(message),
            limit=1,
            lease_ms=60_000,
            turn=None,
            ttl_seconds=600,
            envelope=envelope,
        )
        assert [r.call_id for r in rows] == ["d" * 32] and _lane(plain) == []
        publish(before.app, rows)
        (waiting,) = _lane(plain)
        assert waiting["headers"]["id"] == "d" * 32
    finally:
        _close(before)


@needs_known
def test_the_self_test_consumes_a_pushed_probe_and_leaves_nothing(
    redis_url: str, admission: RedisAdmission, plain: redis.Redis[str]
) -> None:
    app = make_app(Settings(broker_url=redis_url))
    try:
        for kind in ("sandbox", "service"):
            assert fast_path.self_test(app, Settings(broker_url=redis_url), admission, kind) is None
    finally:
        app.close()
    assert plain.keys("*probe*") == []
    assert plain.hlen("unacked") == 0


class _Lost(RedisAdmission):
    """An admission whose push lands where kombu does not read (as a changed kombu would)."""

    def push_probe(self, probe_id: str, queue: str, envelope: Any) -> None:
        super().push_probe(probe_id, f"elsewhere.{queue}", envelope)


@needs_known
def test_the_self_test_fails_when_the_probe_does_not_arrive(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fast_path, "_PROBE_WAIT_SECONDS", 0.5)
    lost = _Lost.from_url(redis_url)
    app = make_app(Settings(broker_url=redis_url))
    try:
        reason = fast_path.self_test(app, Settings(broker_url=redis_url), lost, "service")
    finally:
        app.close()
        lost.close()
    assert reason is not None and reason.startswith("the worker self-test failed: ")


def test_the_self_test_fails_where_the_envelope_cannot_be_built(
    redis_url: str, admission: RedisAdmission
) -> None:
    settings = Settings(broker_url=redis_url, fast_path=False)
    app: Celery = make_app(settings)
    try:
        assert fast_path.self_test(app, settings, admission, "service") == "VESSEL_FAST_PATH=off"
    finally:
        app.close()


@needs_known
def test_the_probe_message_is_encoded_like_any_call(redis_url: str) -> None:
    app = make_app(Settings(broker_url=redis_url))
    try:
        call_id, message = probe_message()
        envelope = build_envelope(app, "service", call_id, message)
    finally:
        app.close()
    assert envelope is not None
    assert json.loads(envelope.payload)["headers"]["id"] == call_id
