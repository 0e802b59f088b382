"""The end of a call (`broker.admission.finish`), on both admissions: the first
result is stored and later ones are not, the slot is freed either way, and the
stored result is the one Celery reads back. With Redis the result can be written
by one script with the done mark and the release (`complete`), or through
Celery's backend then `release`; both are checked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from broker.admission import Admission, RedisAdmission
from broker.admission.finish import finish_call, results_in_admission, store_result_once
from broker.celery_app import make_app
from broker.config import Settings
from broker.protocol import CallRequest, ToolResult, new_call_id, result_from_meta

from .conftest import LANE, ids, is_redis, submit


@pytest.fixture
def app(admission: Admission, request: pytest.FixtureRequest) -> Iterator[Celery]:
    """The Celery app of each admission: results in the broker's Redis, or in memory."""
    url = request.getfixturevalue("redis_url") if is_redis(admission) else None
    found = make_app(Settings(broker_url=url))
    yield found
    _close(found)


def _close(app: Celery) -> None:
    """The app and its result backend's connections (the Redis backend keeps a pool)."""
    client = getattr(app.backend, "client", None)
    if client is not None and hasattr(client, "connection_pool"):
        client.connection_pool.disconnect()
    app.close()


def _result(call_id: str, output: str) -> ToolResult:
    return ToolResult(call_id=call_id, agent="a", tool="t", is_error=False, output=output)


@pytest.mark.parametrize("in_one_script", [True, False])
def test_the_first_result_is_stored_once_and_the_slot_freed(
    admission: Admission, app: Celery, in_one_script: bool
) -> None:
    # One script only where the backend is admission's own Redis database.
    assert results_in_admission(app, admission) is is_redis(admission)
    # Ids of their own: the in-memory result store is one per process.
    first, second = new_call_id(), new_call_id()
    admission.heartbeat("service", "w1", {LANE: 10}, 10_000)
    submit(admission, first, limit=1)
    assert submit(admission, second, limit=1) == []  # waits for the first's slot
    assert admission.claim(first, "w1", 60_000) == "run"
    stored, dispatched = finish_call(
        app,
        admission,
        _result(first, "first"),
        hostname="w1",
        ttl_seconds=600,
        in_one_script=in_one_script,
    )
    assert stored is True and ids(dispatched) == [second]
    # A second delivery's result changes nothing and frees nothing more.
    again, more = finish_call(
        app,
        admission,
        _result(first, "second"),
        hostname="w2",
        ttl_seconds=600,
        in_one_script=in_one_script,
    )
    assert (again, more) == (False, [])
    found = result_from_meta(app.backend.get_task_meta(first))
    assert found is not None and found.output == "first"
    assert admission.claim(first, "w3", 60_000) == "done"


def test_a_result_the_client_stores_is_stored_once(admission: Admission, app: Celery) -> None:
    """The client's own results (refused at submit, cancelled in the queue)."""
    call_id = new_call_id()  # the in-memory result store is one per process
    request = CallRequest(call_id=call_id, agent="a", tool="t", arguments={}, owner="a/b")
    refused = ToolResult.error(request, "t: refused", outcome="refused")
    assert store_result_once(app, admission, refused, hostname="client", ttl_seconds=600)
    late = ToolResult.error(request, "t: late", outcome="error")
    assert not store_result_once(app, admission, late, hostname="w1", ttl_seconds=600)
    found = result_from_meta(app.backend.get_task_meta(call_id))
    assert found == refused
    assert (found.is_error, found.outcome, found.output) == (True, "refused", "t: refused")


def test_complete_writes_the_result_as_celerys_redis_backend_does(
    redis_admission: RedisAdmission, redis_url: str
) -> None:
    app = make_app(Settings(broker_url=redis_url))
    try:
        redis_admission.heartbeat("service", "w1", {LANE: 1}, 10_000)
        submit(redis_admission, "c1")
        finish_call(
            app,
            redis_admission,
            _result("c1", "done"),
            hostname="w1",
            ttl_seconds=600,
            in_one_script=True,
        )
        meta = app.backend.get_task_meta("c1")
        assert meta["status"] == "SUCCESS" and meta["task_id"] == "c1"
        assert meta["result"]["output"] == "done"
        ttl = redis_admission.redis.ttl(app.backend.get_key_for_task("c1"))
        assert 0 < ttl <= int(app.backend.expires)
    finally:
        _close(app)
