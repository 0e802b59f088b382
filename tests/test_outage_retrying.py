"""Riding out an unreachable broker, piece by piece, against real Redis servers
(a port nothing listens on stands for a Redis that is down)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from conftest import EXAMPLES, REPO, free_port

from bench.redis_server import redis_server_argv, wait_until_answering
from broker.admission import RedisAdmission
from broker.admission.keys import claim_key
from broker.celery_app import make_app
from broker.client import VesselClient
from broker.config import Settings, hide_password
from broker.connect import redis_client
from broker.errors import BrokerUnavailable, ConfigError, TransientError
from broker.loading import load_deployment
from broker.protocol import ToolResult, backend_record
from broker.retrying import Outage, retry, unreachable
from broker.waiting import ResultWaiter
from workers.outage import wait_for_broker
from workers.preflight import check_eviction_policy


def _down_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


def test_retry_logs_once_per_outage_and_gives_up_after_its_patience(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = redis_client(_down_url())
    outage = Outage("the broker Redis (test)")
    caplog.set_level(logging.WARNING, logger="broker.retrying")
    errors: list[BaseException] = []

    def one() -> None:
        try:
            retry(outage, client.ping, patience=0.6)
        except BrokerUnavailable as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(errors) == 4
    assert all("the broker Redis (test) is unreachable" in str(e) for e in errors)
    lines = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(lines) == 1, lines  # four threads, many attempts: one line
    assert outage.down_for() is not None


def test_retry_rides_out_a_redis_that_comes_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    outage = Outage("the broker Redis (test)")
    caplog.set_level(logging.WARNING, logger="broker.retrying")
    client = redis_client(f"redis://127.0.0.1:{port}/0")  # redis-py's own retries off
    started: list[subprocess.Popen[bytes]] = []

    def start_later() -> None:
        time.sleep(0.7)
        started.append(
            subprocess.Popen(redis_server_argv(port, tmp_path), stdout=subprocess.DEVNULL)
        )

    threading.Thread(target=start_later).start()
    try:
        assert retry(outage, client.ping, patience=20) is True
    finally:
        client.close()
        for proc in started:
            proc.terminate()
            proc.wait(10)
    messages = [r.getMessage() for r in caplog.records]
    assert any("is reachable again after" in m for m in messages), messages
    assert outage.down_for() is None
    assert outage.since_recovery() is not None


def test_errors_that_never_heal_are_not_retried() -> None:
    assert not unreachable(redis.AuthenticationError("wrong password"))
    assert not unreachable(redis.ResponseError("ERR unknown command"))
    assert unreachable(redis.ConnectionError("Connection refused"))
    assert unreachable(redis.BusyLoadingError("LOADING"))
    wrapped = RuntimeError("backend gave up")
    wrapped.__cause__ = redis.ConnectionError("refused")
    assert unreachable(wrapped)


def test_admission_with_no_patience_raises_a_transient_error_at_once() -> None:
    admission = RedisAdmission.from_url(_down_url())
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="is unreachable"):
        admission.claim("c1", "host", 1000)
    assert isinstance(BrokerUnavailable("x"), TransientError)
    assert time.monotonic() - started < 10
    admission.close()


def test_submit_to_an_unreachable_broker_raises_and_writes_nothing(redis_url: str) -> None:
    deployment = load_deployment(EXAMPLES / "deployment.toml")
    client = VesselClient(deployment, Settings(broker_url=_down_url()))
    with pytest.raises(BrokerUnavailable, match="was not submitted"):
        client.submit("field-guide", "species", {}, owner="web/alice")
    client.close()


def test_check_eviction_policy_of_an_unreachable_redis_is_one_clear_error() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    with pytest.raises(BrokerUnavailable) as caught:
        check_eviction_policy(client, f"broker Redis {hide_password(url)}")
    text = str(caught.value)
    assert "\n" not in text and "hunter2" not in text and "redis://:***@127.0.0.1" in text
    assert caught.value.__cause__ is None  # `from None`: no chained traceback to print


def test_wait_for_broker_refuses_a_wrong_password_at_once(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(tmp_path), "--requirepass", "right"),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_broker(redis_client(f"redis://:right@127.0.0.1:{port}/0"), "broker (test)", 20)
        client = redis_client(f"redis://:wrong@127.0.0.1:{port}/0")
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"refused the credentials"):
            wait_for_broker(client, "broker Redis (test)", 30)
        assert time.monotonic() - started < 10  # not retried for 30 s
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_call_with_an_unreachable_broker_prints_one_line_and_exits_2() -> None:
    env = {"VESSEL_BROKER_URL": f"redis://:pw@127.0.0.1:{free_port()}/0", "PATH": "/usr/bin"}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "workers.cli", "call"),
            *("-d", str(EXAMPLES / "deployment.toml"), "field-guide", "species", "{}"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    # The command line asks the broker first (broker/reach.py): one line naming the
    # URL and what to check; the client's own "was not submitted" comes only when
    # Redis goes away between that check and the submit.
    assert "cannot reach the broker Redis at" in lines[0] and "(nothing ran)" in lines[0]
    assert "redis://:***@127.0.0.1" in lines[0] and ":pw@" not in done.stderr


def test_settings_take_sentinel_urls_with_a_master_name() -> None:
    url = "sentinel://:pw@127.0.0.1:26379/0;sentinel://127.0.0.1:26380"
    settings = Settings.from_environ(
        {"VESSEL_BROKER_URL": url, "VESSEL_SENTINEL_MASTER": "mymaster"}
    )
    assert settings.sentinel_master == "mymaster"
    assert "pw" not in repr(settings)
    with pytest.raises(ConfigError, match="VESSEL_SENTINEL_MASTER"):
        Settings.from_environ({"VESSEL_BROKER_URL": url})
    with pytest.raises(ConfigError, match="VESSEL_BROKER_OUTAGE_SECONDS"):
        Settings.from_environ({"VESSEL_BROKER_OUTAGE_SECONDS": "soon"})
    assert Settings.from_environ({}).broker_outage_seconds == 300


def test_a_wait_whose_result_read_meets_an_outage_says_so_while_it_lasts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The wait reads the store after its subscription; Redis dies just then. The read
    must fail at once (one warning, the wait going on across the outage), not sleep
    through Celery's own retries (`result_backend_always_retry`) unreported."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(redis_server_argv(port, tmp_path), stdout=subprocess.DEVNULL)
        wait_until_answering(proc, port)
        return proc

    proc = first = start()
    app = make_app(Settings(broker_url=url))
    admission = RedisAdmission.from_url(url)
    waiter = ResultWaiter(app, admission, heartbeat_seconds=1.0)
    real_next = waiter._next_published
    killed = threading.Event()

    def next_published(*args: object, until_subscribed: bool = False, **kw: object) -> object:
        found = real_next(*args, until_subscribed=until_subscribed, **kw)  # type: ignore[arg-type]
        if until_subscribed and not killed.is_set():
            killed.set()  # subscribed: the store read that comes next meets the outage
            first.kill()
            first.wait(10)
        return found

    waiter._next_published = next_published  # type: ignore[method-assign,assignment]
    caplog.set_level(logging.WARNING)
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(waiter.wait("call-1", timeout=30)))
    thread.start()
    try:
        deadline = time.monotonic() + 3  # Celery's retries alone would sleep for seconds
        while not any("is unreachable" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the outage went unreported while it lasted"
            time.sleep(0.02)
        proc = start()
        client = redis.Redis.from_url(url)
        result = ToolResult(call_id="call-1", agent="a", tool="t", is_error=False, output="back")
        key, value, _ = backend_record(app.backend, result)
        client.set(claim_key("call-1"), "worker@host")
        client.set(key, value)
        client.close()
        thread.join(30)
        assert [r.output for r in got] == ["back"]  # type: ignore[attr-defined]
        messages = [r.getMessage() for r in caplog.records]
        assert sum("is unreachable" in m for m in messages) == 1, messages
        assert any("is reachable again" in m for m in messages), messages
    finally:
        waiter.close()
        admission.close()
        app.backend.client.connection_pool.disconnect()  # the store reads' connection
        app.close()
        proc.kill()
        proc.wait(10)
