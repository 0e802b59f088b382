"""The fast path, fenced in one place: every part of it asks here whether it may run.

The fast path is two shortcuts through kombu's internals, each a measured
saving (broker/envelope.py, broker/transport.py):

* **envelopes**: the client records, with Celery's and kombu's own code, the
  message kombu would LPUSH for a call (through kombu's batch-publish hooks,
  `Producer.batch()` and the channel's `create_publish_batch`), and admission
  pushes it into the lane from Lua when the call is dispatched;
* **the transport**: one redis-py client per channel instead of one per
  command, and no unacked copy in kombu's hash for admission's messages.

Both depend on how a given kombu and Celery build and consume a message. So
before either runs, this module checks what they rely on:

* the setting: `VESSEL_FAST_PATH=off` turns both off;
* a `redis://` or `rediss://` broker (TLS: the transport reads its settings from the
  URL's `ssl_*` parameters whatever its class; not Sentinel, whose calls admission
  never pushes);
* kombu and Celery releases this project's CI ran the path on (`KNOWN_KOMBU`,
  `KNOWN_CELERY`; the transport alone: `KNOWN_TRANSPORT_KOMBU`);
* kombu's batch-publish hooks exist (`Producer.batch`, the Redis channel's
  `create_publish_batch` / `supports_batch_publish`, kombu 5.7 and later);
* no `global_keyprefix` in the broker transport options (kombu prefixes the
  keys in its client, after the recorder saw them: Lua would push into a key
  no worker reads), and no message priorities (kombu's Redis transport puts a
  message of priority > 0 in another key than the lane);
* the app's transport class really is `broker.transport.RedisTransport`;
* a probe envelope can be built and pushes into the lane, once per process;
* no worker has reported that its own self-test failed (`FAST_PATH_OFF_KEY`,
  set by `workers.worker.run_worker` when a worker does not consume an envelope
  it pushed itself; admission's Lua checks the same key before every push).

When a check fails, calls are published the plain way: admission returns them
(`Dispatched`) and the caller publishes them with `send_task`
(`broker.admission.publish`), and one log line says why (a warning; at info
level when the setting turned it off). A `redis://` or `rediss://` worker whose
transport is refused runs `broker.transport.SafeRedisTransport`:
kombu's, with the one fix that keeps a worker alive across a Redis restart.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.admission.keys import ADMISSION_TAG_PREFIX
from broker.config import ENV_FAST_PATH, Settings, is_plain_redis, is_tls_redis
from broker.queues import KINDS, Kind

if TYPE_CHECKING:
    from celery import Celery

    from broker.admission import RedisAdmission

__all__ = [
    "KNOWN_CELERY",
    "KNOWN_KOMBU",
    "KNOWN_TRANSPORT_KOMBU",
    "Decision",
    "decide",
    "envelope_reason",
    "log_fallback",
    "release",
    "self_test",
    "transport_reason",
]

_log = logging.getLogger(__name__)

#: kombu minor releases the envelope was proven on (CI: scripts/check runs the
#: cluster suite on the newest; kombu 5.6 and older have no batch publishing).
KNOWN_KOMBU: tuple[tuple[int, int], ...] = ((5, 7),)
#: kombu minor releases the transport's shortcuts were proven on (CI runs the
#: lowest, scripts/test-lowest, and the newest).
KNOWN_TRANSPORT_KOMBU: tuple[tuple[int, int], ...] = ((5, 4), (5, 5), (5, 6), (5, 7))
#: Celery minor releases the envelope was proven on (its message protocol 2).
KNOWN_CELERY: tuple[tuple[int, int], ...] = ((5, 4), (5, 5), (5, 6), (5, 7))


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether the envelope fast path runs in this process, and if not, why."""

    enabled: bool
    #: Empty when enabled; else one sentence for the log line.
    reason: str = ""


def release(version: str) -> tuple[int, int]:
    """`(major, minor)` of a version text such as `5.7.0` or `5.6.0rc1`; (0, 0) if unreadable."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return 0, 0


def _versions() -> tuple[str, str]:
    import celery  # noqa: PLC0415 (only when a broker is configured)
    import kombu  # noqa: PLC0415

    return str(kombu.__version__), str(celery.__version__)


def _named(known: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{a}.{b}" for a, b in known)


def transport_reason(settings: Settings) -> str | None:
    """Why `broker.transport.RedisTransport` must not be used here, or None if it may."""
    if not settings.fast_path:
        return f"{ENV_FAST_PATH}=off"
    url = settings.broker_url
    if not (is_plain_redis(url) or is_tls_redis(url)):
        return (
            "the broker URL is not redis:// or rediss:// "
            "(kombu's own transport serves it, restoring safely)"
        )
    kombu_version, _ = _versions()
    if release(kombu_version) not in KNOWN_TRANSPORT_KOMBU:
        return (
            f"kombu {kombu_version} is not one this version of vessel-workers was tested on "
            f"({_named(KNOWN_TRANSPORT_KOMBU)})"
        )
    return None


def _options_reason(conf: Any) -> str | None:
    options: Mapping[str, Any] = conf.broker_transport_options or {}
    if options.get("global_keyprefix"):
        return (
            "broker_transport_options sets global_keyprefix: kombu prefixes keys after "
            "the message is built, so admission would push into a key no worker reads"
        )
    if options.get("priority_steps") is not None or options.get("sep") is not None:
        return "broker_transport_options change kombu's priority keys (priority_steps, sep)"
    if conf.task_default_priority or conf.task_queue_max_priority:
        return (
            "task priorities are configured: kombu's Redis transport puts a message "
            "with a priority in another key than its lane"
        )
    if conf.task_protocol != 2:
        return f"task_protocol is {conf.task_protocol}, not Celery's message protocol 2"
    return None


def _hooks_reason() -> str | None:
    from kombu.messaging import Producer  # noqa: PLC0415
    from kombu.transport import redis as kombu_redis  # noqa: PLC0415

    if not callable(getattr(Producer, "batch", None)):
        return "this kombu has no Producer.batch (batch publishing came in kombu 5.7)"
    channel = kombu_redis.Channel
    for name in ("create_publish_batch", "supports_batch_publish"):
        if not hasattr(channel, name):
            return f"kombu's Redis channel has no {name}"
    return None


def envelope_reason(app: Celery, settings: Settings) -> str | None:
    """Why calls may not be sent as envelopes from `app`, or None if they may.

    Everything but the probe and the workers' report (`broker.client` runs those).
    """
    reason = transport_reason(settings)
    if reason is not None:
        return reason
    kombu_version, celery_version = _versions()
    if release(kombu_version) not in KNOWN_KOMBU:
        return (
            f"kombu {kombu_version} is not one the envelope was tested on ({_named(KNOWN_KOMBU)})"
        )
    if release(celery_version) not in KNOWN_CELERY:
        return (
            f"Celery {celery_version} is not one the envelope was tested on "
            f"({_named(KNOWN_CELERY)})"
        )
    reason = _hooks_reason() or _options_reason(app.conf)
    if reason is not None:
        return reason
    from broker.transport import RedisChannel  # noqa: PLC0415 (imports kombu's Redis transport)

    try:
        channel_class = app.connection_for_write().transport.Channel
    except Exception as exc:  # a broken transport setting: say what it was
        return f"the app's broker transport cannot be loaded ({exc})"
    if not (isinstance(channel_class, type) and issubclass(channel_class, RedisChannel)):
        return f"the app's broker transport is {channel_class!r}, not broker.transport's"
    return None


def decide(app: Celery, settings: Settings, admission: RedisAdmission) -> Decision:
    """Whether a client of `app` sends envelopes; logs the one line saying why not.

    `envelope_reason`, then a probe envelope for each kind (built and checked
    as every call's is), then the report of workers whose self-test failed.
    """
    from broker.envelope import build_envelope, probe_message  # noqa: PLC0415

    reason = envelope_reason(app, settings)
    if reason is None:
        for kind in KINDS:
            call_id, message = probe_message()
            try:
                built = build_envelope(app, kind, call_id, message)
            except Exception as exc:  # an internal kombu changed: say what broke
                reason = f"a probe envelope could not be built ({type(exc).__name__}: {exc})"
                break
            if built is None:
                reason = "a probe envelope is not the single LPUSH into its lane it must be"
                break
    if reason is None:
        reported = admission.fast_path_off()
        if reported is not None:
            reason = f"a worker reported: {reported}"
    if reason is None:
        return Decision(enabled=True)
    log_fallback(reason)
    return Decision(enabled=False, reason=reason)


#: How long the self-test waits for its probe: a Redis round trip, under load.
_PROBE_WAIT_SECONDS = 10.0


def self_test(app: Celery, settings: Settings, admission: RedisAdmission, kind: Kind) -> str | None:
    """Why this worker does not consume an envelope it pushed itself, or None if it does.

    Builds a probe envelope as a client builds a call's, has admission's Lua
    push it (as dispatch pushes a call) into a private queue, consumes it with
    kombu's own consumer through the app's transport, checks what arrived
    (task name, id, arguments, admission's delivery tag, the queue as routing
    key, no copy left in kombu's unacked hash after the ack), and deletes the
    queue. A worker that cannot run the test fails it.
    """
    import uuid  # noqa: PLC0415

    from kombu.entity import Exchange, Queue  # noqa: PLC0415

    from broker.envelope import build_envelope, probe_message  # noqa: PLC0415
    from broker.queues import TASK_NAMES  # noqa: PLC0415

    reason = envelope_reason(app, settings)
    if reason is not None:
        return reason
    probe_id = uuid.uuid4().hex
    _, message = probe_message()
    message["call_id"] = probe_id
    try:
        envelope = build_envelope(app, kind, probe_id, message)
    except Exception as exc:  # an internal kombu changed: say what broke
        return f"the probe envelope could not be built ({type(exc).__name__}: {exc})"
    if envelope is None:
        return "the probe envelope is not the single LPUSH into its lane it must be"
    # Not `vessel.*`: nothing may take it for a lane, nor its binding for a lane's.
    name = f"vessel-probe.{probe_id}"
    tag = f"{ADMISSION_TAG_PREFIX}{probe_id}-1"
    exchange = Exchange(name)  # type: ignore[no-untyped-call]
    queue = Queue(name, exchange, routing_key=name)  # type: ignore[no-untyped-call]
    received: list[Any] = []
    problem: str | None = None
    with app.connection_for_read() as connection:
        channel: Any = None
        try:
            channel = connection.default_channel
            with connection.Consumer(queue, accept=["json"], callbacks=[_keep(received)]):
                admission.push_probe(probe_id, name, envelope)
                connection.drain_events(timeout=_PROBE_WAIT_SECONDS)
            expected = {"task": TASK_NAMES[kind], "id": probe_id, "queue": name, "tag": tag}
            problem = _probe_problem(received, expected, message)
            if problem is None and admission.redis.hexists("unacked", tag):
                problem = "kombu kept an unacked copy of an admission message"
        except Exception as exc:  # anything at all: the worker must not trust the path
            problem = f"the probe was not consumed ({type(exc).__name__}: {exc})"
        finally:
            try:
                if channel is not None:
                    queue(channel).delete()  # type: ignore[no-untyped-call]
            except Exception as exc:  # the queue is private: a leftover is harmless
                _log.warning("could not delete the probe queue %s: %s", name, exc)
    return None if problem is None else f"the worker self-test failed: {problem}"


def _keep(received: list[Any]) -> Any:
    def on_message(body: Any, message: Any) -> None:
        received.append((body, message))
        message.ack()

    return on_message


def _probe_problem(
    received: list[Any], expected: Mapping[str, str], sent: dict[str, Any]
) -> str | None:
    """What is wrong with the probe that arrived, or None."""
    if len(received) != 1:
        return f"{len(received)} messages arrived instead of the one probe"
    body, message = received[0]
    headers = message.headers or {}
    if headers.get("task") != expected["task"] or headers.get("id") != expected["id"]:
        return f"the probe arrived with task {headers.get('task')!r} and id {headers.get('id')!r}"
    if message.delivery_tag != expected["tag"]:
        return f"the probe arrived with delivery tag {message.delivery_tag!r}"
    if message.delivery_info.get("routing_key") != expected["queue"]:
        return "the probe's routing key is not the queue admission pushed it into"
    if not (isinstance(body, list) and body and body[0] == [sent]):
        return "the probe's arguments did not arrive as they were sent"
    return None


def log_fallback(reason: str, *, worker: bool = False) -> None:
    """The one log line saying why calls are published with `send_task`.

    A warning; in a client, an info line when the setting turned the path off:
    the operator asked for it, and every `vessel-workers call` would print it
    on stderr. A worker says it once at start, as a warning, where its log shows it.
    """
    asked = reason == f"{ENV_FAST_PATH}=off"
    level = logging.INFO if asked and not worker else logging.WARNING
    _log.log(level, "fast path off: %s; calls are published with Celery's send_task", reason)
