"""The end of a call: its result stored once, its slot freed, the next calls dispatched.

A worker ends every call it ran here (`finish_call`); a client ends here the
calls it answers itself (refused at submit, cancelled while queued:
`store_result_once`). Only the first result of a call is stored (`finish`, the
done mark), whichever side or delivery writes it.
"""

from __future__ import annotations

from celery import Celery

from broker.admission.protocol import Admission, Dispatched
from broker.admission.redis import RedisAdmission
from broker.protocol import ToolResult, backend_notifies, backend_record, store_result

__all__ = ["finish_call", "results_in_admission", "store_result_once"]


def store_result_once(
    app: Celery,
    admission: Admission,
    result: ToolResult,
    *,
    hostname: str,
    ttl_seconds: int,
) -> bool:
    """Store `result` unless the call already has one; True if this one was stored."""
    if not admission.finish(result.call_id, hostname, ttl_seconds):
        return False

    def store() -> None:
        store_result(app.backend, result)

    if isinstance(admission, RedisAdmission):
        # Done is marked: the result must follow, across an outage of the backend too.
        admission.retrying(store)
    else:
        store()
    return True


def results_in_admission(app: Celery, admission: Admission) -> bool:
    """True if the result backend is a Redis backend in admission's own Redis database.

    Then a worker writes a result, its done mark and the slot's release in one
    script (`finish_call`); checked once per worker.
    """
    if not isinstance(admission, RedisAdmission) or not backend_notifies(app.backend):
        return False
    pool = app.backend.client.connection_pool
    return admission.same_database(pool.connection_kwargs)


def finish_call(
    app: Celery,
    admission: Admission,
    result: ToolResult,
    *,
    hostname: str,
    ttl_seconds: int,
    in_one_script: bool,
) -> tuple[bool, list[Dispatched]]:
    """Store `result` unless the call has one, free its slot; (stored, what to publish).

    `in_one_script` (`results_in_admission`): the backend's key and encoded
    result, built by the backend itself (`broker.protocol.backend_record`), are
    written by admission's `complete` script with the done mark and the
    release: one round trip instead of four (finish, Celery's
    read-before-write, its SET+PUBLISH, release).
    """
    if in_one_script and isinstance(admission, RedisAdmission):
        key, value, expires = backend_record(app.backend, result)
        return admission.complete(
            result.call_id,
            hostname,
            ttl_seconds,
            result_key=key,
            result_value=value,
            result_ttl_seconds=expires,
        )
    stored = store_result_once(app, admission, result, hostname=hostname, ttl_seconds=ttl_seconds)
    return stored, admission.release(result.call_id)
