"""The Celery app: one factory, every reliability setting explained.

`make_app(settings)` builds the app a client or a worker uses. Tasks are not
registered here (the enqueue side only sends them by name, `broker.queues.TASK_NAMES`);
`workers.tasks.register_tasks` adds them in worker processes.

Flower and the `celery` command find an app through this module:
`celery -A broker.celery_app flower` builds one from the environment
(VESSEL_BROKER_URL, VESSEL_RESULT_BACKEND) on first use.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from celery import Celery

from broker.config import Settings, is_sentinel
from broker.constants import DEFAULT_TOOL_TIMEOUT_SECONDS
from broker.transport import SENTINEL_TRANSPORT, transport_for

if TYPE_CHECKING:
    from broker.model import Deployment

# `app` is also importable (module __getattr__), built on first use.
__all__ = ["EMBEDDED_BACKEND", "EMBEDDED_BROKER", "default_app", "longest_timeout", "make_app"]

#: The embedded default: an in-process broker and result store, no server.
EMBEDDED_BROKER = "memory://"
EMBEDDED_BACKEND = "cache+memory://"


def longest_timeout(deployment: Deployment) -> float:
    """The longest time limit of any tool: it sizes the visibility timeout (`make_app`)."""
    limits = [t.timeout_seconds for a in deployment.agents.values() for t in a.tools.values()]
    return max(limits, default=DEFAULT_TOOL_TIMEOUT_SECONDS)


def make_app(
    settings: Settings,
    *,
    longest_tool_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    name: str = "vessel",
) -> Celery:
    """A Celery app for `settings`; `longest_tool_seconds` sizes the visibility timeout."""
    app = Celery(name, set_as_current=False)
    app.conf.update(_configuration(settings, longest_tool_seconds))
    return app


def _configuration(settings: Settings, longest_tool_seconds: float) -> dict[str, Any]:
    embedded = settings.embedded
    visibility = settings.visibility_timeout(longest_tool_seconds)
    always_events = settings.task_events == "always"
    transport = transport_for(settings) if settings.broker_url else None
    if settings.broker_url and is_sentinel(settings.broker_url):
        transport = SENTINEL_TRANSPORT  # kombu's, restoring safely (broker/transport.py)
    # Sentinel (sentinel://h1:26379;sentinel://h2:26379): kombu's sentinel
    # transport and Celery's sentinel backend find the master by its name.
    sentinel = {"master_name": settings.sentinel_master} if settings.sentinel_master else {}
    backend_sentinel = bool(settings.backend_url and is_sentinel(settings.backend_url))
    return {
        "broker_url": settings.broker_url or EMBEDDED_BROKER,
        # kombu's Redis transport with one client per channel (broker/transport.py),
        # when broker/fast_path.py allows it.
        **({"broker_transport": transport} if transport else {}),
        "result_backend": settings.backend_url or EMBEDDED_BACKEND,
        # JSON only: a pickle accepted from the broker would run code in the
        # worker; every message and result here is plain JSON anyway.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # Ack after the call finished, not when it was received: a worker killed
        # mid-call has not acked, and admission's lease sweep dispatches the call
        # again (broker.admission; kombu's unacked copy is kept only for messages
        # admission did not push, broker.transport). The claim and done guards
        # (workers.tasks) make a second delivery never run the tool twice.
        "task_acks_late": True,
        # A pool child that dies (prefork) fails the message back to the queue
        # instead of acking it as done.
        "task_reject_on_worker_lost": True,
        # Reserve no more than one message per free execution slot: a prefetched
        # message waits behind a long call on a busy worker while others idle,
        # and admission sizes the lane as if nothing is hidden in prefetch.
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": {
            # Redis re-delivers an unacked message after this many seconds. It
            # must exceed the longest tool time limit (plus the lease grace), or
            # a long call is delivered again while it still runs.
            "visibility_timeout": visibility,
            # kombu looks for such messages every interval x throttle seconds
            # (10 x 10 by default): scan every interval, and often enough to
            # notice within a third of the visibility timeout (at most 10 s).
            "unacked_restore_interval": max(1, min(10, int(visibility / 3))),
            "unacked_restore_throttle": 1,
            # The in-process transport polls its queues; the default 1 s poll
            # would add up to a second to every embedded call.
            **({"polling_interval": 0.005} if embedded else {}),
            **(sentinel if settings.broker_url and is_sentinel(settings.broker_url) else {}),
        },
        **({"result_backend_transport_options": sentinel} if backend_sentinel else {}),
        # Results (and the call records kept with them) expire after this: the
        # platform reads a result soon or never, and Redis runs noeviction.
        "result_expires": int(settings.result_expires_seconds),
        # Flower sees calls through task events. By default (VESSEL_TASK_EVENTS=
        # on-request, Celery's own default) workers send them once a monitor
        # asks (Flower broadcasts enable_events at start and every 5 s): four
        # publishes a call cost nothing while nobody watches. `always` sends
        # them from the start, and task-sent events from clients, so Flower
        # shows a call from the moment it is submitted.
        "worker_send_task_events": always_events,
        "task_send_sent_event": always_events,
        # Record STARTED for tasks that store results through Celery. Ours
        # store explicitly (ignore_result=True, so a late duplicate can never
        # overwrite a result); Flower shows them as started from task events.
        "task_track_started": True,
        # A result write that hits a Redis hiccup is retried, not dropped.
        "result_backend_always_retry": True,
        "result_backend_max_retries": 10,
        # Keep retrying the broker at start-up (a worker may start before Redis);
        # set explicitly because Celery 5 warns about its changing default.
        "broker_connection_retry_on_startup": True,
        # A broker outage never makes Celery give up: the worker's outage limit
        # (VESSEL_BROKER_OUTAGE_SECONDS, workers.outage) decides when to stop.
        "broker_connection_max_retries": None,
        # A reply error on the consumer's connection (a Redis still loading its
        # data, a replica that was the master a moment ago, a transaction
        # aborted by one of those) restarts the consumer like a lost connection,
        # instead of ending the worker with "Unrecoverable error".
        "broker_channel_error_retry": True,
        # A lost broker connection does not abort running calls: they finish and
        # store their result; redelivery of their message is guarded.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Every call is sent to an explicit lane; a task without one is a bug,
        # so it lands in a queue nobody consumes rather than in a worker's lane.
        "task_default_queue": "vessel.unrouted",
        # The embedded default runs one process: no remote control fan-out.
        "worker_enable_remote_control": not embedded,
        "worker_hijack_root_logger": not embedded,
    }


@functools.cache
def default_app() -> Celery:
    """The app of this environment, built once (for `celery -A broker.celery_app`)."""
    return make_app(Settings.from_environ())


def __getattr__(name: str) -> Celery:
    # `celery -A broker.celery_app` looks up the module's `app`; build it only
    # then, so importing this module never reads the environment.
    if name == "app":
        return default_app()
    raise AttributeError(name)
