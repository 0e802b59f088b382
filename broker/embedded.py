"""The embedded default: broker, admission, results and one worker in this process.

With `VESSEL_BROKER_URL` unset, `vessel-workers call` still goes the whole way a
call goes in production: the client submits through admission, the call is
published as the same Celery task, a Celery worker (a thread here) consumes it,
and the result comes back through a result backend. Only the transports are
in-process: `memory://` for the broker, `cache+memory://` for results, and
`LocalAdmission` (`broker.admission.in_process`: a lock and dicts) for
admission. Confinement is the real one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery.app.trace import trace_task_ret
from celery.concurrency.thread import TaskPool as ThreadTaskPool
from celery.contrib.testing.worker import TestWorkController
from celery.worker import state

from broker.admission.in_process import LocalAdmission

__all__ = ["AppThreadPool", "LocalAdmission", "embedded_worker"]

#: A task that does nothing: sent to wake the worker's poll so it stops at once.
_WAKEUP_TASK = "vessel.embedded_wakeup"


class AppThreadPool(ThreadTaskPool):  # type: ignore[misc]  # celery is untyped
    """Celery's threads pool, tracing each task in the worker's own app.

    A `celery worker` process makes its app the current and default one
    (`setup_worker_optimizations`); a worker in a thread does not, and Celery's pool
    then looks the task up in `current_app`: in a process that made other apps
    (two embedded clients one after another, a platform's own), another app's task
    of the same name, bound to another client's runtime.
    """

    def on_apply(
        self, target: Any, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any
    ) -> Any:
        if target is trace_task_ret:
            kwargs = {**(kwargs or {}), "app": self.app}
        return super().on_apply(target, args, kwargs, *rest, **options)


@contextmanager
def embedded_worker(
    app: Celery, *, queues: list[str], concurrency: int = 2, **options: Any
) -> Iterator[TestWorkController]:
    """Run a Celery worker on `app` in a thread until the block ends.

    The threads pool (`AppThreadPool`), because the sandbox runner must spawn from
    long-lived threads (bubblewrap's --die-with-parent follows the parent thread).
    """
    if _WAKEUP_TASK not in app.tasks:
        app.task(name=_WAKEUP_TASK, ignore_result=True, shared=False)(_nothing)
    worker = TestWorkController(
        app=app,
        concurrency=concurrency,
        pool=AppThreadPool,
        hostname="embedded@localhost",
        queues=queues,
        loglevel="WARNING",
        ready_callback=None,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        **options,
    )
    thread = threading.Thread(target=worker.start, name="vessel-embedded-worker", daemon=True)
    thread.start()
    worker.ensure_started()
    try:
        yield worker
    finally:
        # Warm shutdown (running calls finish). The consumer notices the flag
        # only between polls, and polls once more after noticing (a `finally`
        # in Celery's loop), each poll waiting up to 2 s for a message: two
        # wake-up messages end both polls at once.
        state.should_stop = 0
        for _ in range(2):
            app.send_task(_WAKEUP_TASK, queue=queues[0])
        thread.join(30)
        state.should_stop = None


def _nothing() -> None:
    """The wake-up task."""
