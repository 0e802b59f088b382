"""Celery's side of a dispatch: what admission let into a lane becomes a Celery task.

Both the client (after a submit) and the worker (after a release, a heartbeat,
a recovery sweep, a moved call) publish what admission returns: task id = call
id, the lane as queue, the call's message as the one argument. Calls whose
prepared message admission pushed itself (`broker.envelope`) are not returned,
so not published here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from celery import Celery

from broker.admission.protocol import Dispatched
from broker.envelope import send_call

__all__ = ["publish"]

_log = logging.getLogger(__name__)


def publish(app: Celery, dispatched: Iterable[Dispatched]) -> None:
    """Send what admission let in as Celery tasks: task id = call id, queue = lane.

    Never raises: if the broker is down (after kombu's own retries), the calls'
    leases expire and the recovery sweep dispatches them again, so a failure
    here delays calls but loses none. The caller's work (a submit, a stored
    result) has already succeeded and must not be reported as failed.
    """
    items = list(dispatched)
    if not items:
        return
    try:
        with app.producer_or_acquire() as producer:
            for item in items:
                message = json.loads(item.message)
                send_call(app, item.kind, item.call_id, message, lane=item.lane, producer=producer)
    except Exception as exc:  # see the docstring: recovery re-dispatches them
        _log.warning(
            "could not publish %d calls (%s); they are dispatched again when their lease ends",
            len(items),
            exc,
        )
