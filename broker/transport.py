"""kombu's Redis transports, with one redis-py client per channel instead of one per command.

kombu's Redis channel builds a new `redis.Redis` object for every publish, ack
and restore (`Channel.conn_or_acquire` -> `_create_client`). The connections
come from the channel's pool either way, but building the client object runs
redis-py's constructor, which fills its table of ~170 response callbacks: about
0.5 ms of CPU each time, several times per call (the client's publish, the
worker's ack, the next call's publish, task events). Profiled in a service
burst it was the largest single cost of the worker after the network itself.

A `redis.Redis` bound to a connection pool is safe to share between threads
(each command checks a connection out of the pool), so the channels here build
it once and keep it for as long as the channel's pool lives; when kombu drops
the pool (after a fork, on close) the next command builds a new client on the
new pool.

For messages admission pushed into a lane (delivery tag `vessel-<id>-<n>`,
`broker.admission.keys.ADMISSION_TAG_PREFIX`) the channel's QoS keeps no copy in
kombu's `unacked` hash: kombu writes one at every delivery and deletes it at
every ack, two round trips per call (an eighth of a service worker's CPU in a
burst), so that a message of a dead worker comes back after the visibility
timeout. Admission already does that, sooner: the call's lease (taken at
dispatch, renewed at claim) runs out and the recovery sweep dispatches it again
with a fresh tag. A copy in the hash would only add a later, second delivery
that the claim turns away. What kombu does from that copy while the worker is
alive, it does here from the message in memory: a requeueing reject and the
restore of unacked messages at shutdown push the message back at the head of
its lane. Messages with kombu's own tags (uuids: calls published by Celery,
anything else on the broker) keep kombu's bookkeeping unchanged.

`broker.celery_app.make_app` selects this transport (`broker_transport`) for
`redis://` and `rediss://` broker URLs when `broker.fast_path` allows it (a kombu
release CI ran it on, `VESSEL_FAST_PATH` not off), and `SafeRedisTransport`
(kombu's, with only the fix that keeps a worker alive across a Redis restart) for
the others. A TLS broker's settings come from its URL's
`ssl_*` parameters whatever the transport's name; the one thing kombu derives
from the name `rediss` is a default of no certificate check when the URL names
none, and `broker.config` refuses such a URL (`ssl_cert_reqs` is required).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from broker.admission.keys import ADMISSION_TAG_PREFIX
from broker.config import Settings, is_plain_redis, is_tls_redis
from broker.fast_path import transport_reason

_log = logging.getLogger(__name__)

__all__ = [
    "SAFE_TRANSPORT",
    "SENTINEL_TRANSPORT",
    "TRANSPORT",
    "AdmissionQoS",
    "PublishRecorder",
    "RedisChannel",
    "RedisTransport",
    "SafeQoS",
    "SafeRedisChannel",
    "SafeRedisTransport",
    "SentinelChannel",
    "SentinelTransport",
    "pushed_by_admission",
    "recording_publishes",
    "transport_for",
]


class PublishRecorder:
    """Stands in for kombu's `PublishBatch`: keeps the Redis commands of a publish, sends none.

    kombu's Redis channel routes and encodes a message, then hands its final
    commands (`lpush KEY PAYLOAD`) to the batch of the producer. Recording them
    gives the exact payload kombu and Celery would have pushed, built by their
    own code, so that admission can push it later from a Lua script.
    """

    def __init__(self) -> None:
        self.channel: Any = None
        self.commands: list[tuple[str, tuple[Any, ...]]] = []

    def publish(self, message: Any, **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))

    def flush(self) -> None:
        """Nothing to send: the commands are only recorded."""

    def discard(self) -> None:
        self.commands.clear()

    def close(self) -> None:
        """Nothing held."""


_recording = threading.local()


@contextmanager
def recording_publishes() -> Iterator[PublishRecorder]:
    """While active, publishes of this thread through a batch (`Producer.batch()`)
    on a `RedisChannel` are recorded by the yielded recorder instead of sent."""
    recorder = PublishRecorder()
    _recording.recorder = recorder
    try:
        yield recorder
    finally:
        _recording.recorder = None


def pushed_by_admission(delivery_tag: Any) -> bool:
    """Whether a delivery tag is one admission's dispatch script wrote."""
    return isinstance(delivery_tag, str) and delivery_tag.startswith(ADMISSION_TAG_PREFIX)


class SafeQoS(kombu_redis.QoS):
    """kombu's Redis QoS; a channel closed with a lost connection cannot end the worker.

    When Redis goes away, Celery's consumer closes the channel (its pool is
    dropped, then its connection) and opens a new one once Redis answers. What
    still refers to the old channel then fails in kombu with AttributeError, which
    Celery does not expect and answers with "Unrecoverable error", ending the
    worker: restoring the unacked messages at the close, and the ack (or reject)
    of a call that finishes after it. Here each is logged and dropped instead.
    Nothing is lost: the message's unacked copy stays in Redis and comes back
    after the visibility timeout; its call's claim turns it away if the call's
    result is already stored, and admission's lease dispatches it again if not.
    """

    def ack(self, delivery_tag: Any) -> None:
        try:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
        except AttributeError as exc:
            if not self.channel.closed:
                raise
            self._drop(delivery_tag, "ack", exc)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]
        except AttributeError as exc:
            if not self.channel.closed:
                raise
            self._drop(delivery_tag, "reject", exc)

    def _drop(self, delivery_tag: Any, what: str, exc: BaseException) -> None:
        _log.warning(
            "could not %s message %s: its channel closed with the lost broker connection "
            "(%r); its unacked copy comes back after the visibility timeout",
            what,
            delivery_tag,
            exc,
        )
        self._delivered.pop(delivery_tag, None)

    def restore_unacked(self, client: Any = None) -> None:
        try:
            super().restore_unacked(client)  # type: ignore[no-untyped-call]
        except Exception as exc:
            self._restore_failed(exc)

    def _restore_failed(self, exc: BaseException) -> None:
        # Called at the channel's close, also after the broker went away
        # (Celery's consumer closes it on a lost connection; its pool is gone,
        # kombu raises AttributeError or a connection error); raised from here it
        # ended the worker ("Unrecoverable error"). Nothing is lost by not
        # restoring: admission's lease dispatches its calls again, and
        # kombu's own messages keep their unacked copy in Redis until the
        # visibility timeout.
        _log.warning("could not restore %d unacked messages: %r", len(self._delivered), exc)
        self._delivered.clear()


class AdmissionQoS(SafeQoS):
    """kombu's Redis ack emulation (`SafeQoS`), in memory only for admission's messages."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        if pushed_by_admission(delivery_tag):
            virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]
        else:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]

    def ack(self, delivery_tag: Any) -> None:
        if pushed_by_admission(delivery_tag):
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]
        else:
            super().ack(delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if pushed_by_admission(delivery_tag):
            # Requeues through the channel's `_restore`, from memory.
            virtual.QoS.reject(self, delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]
        else:
            super().reject(delivery_tag, requeue=requeue)

    def restore_unacked(self, client: Any = None) -> None:
        self._flush()  # type: ignore[no-untyped-call]  # tags acked since the last delivery
        try:
            with self.channel.conn_or_acquire(client) as conn:
                for tag, message in list(self._delivered.items()):
                    if pushed_by_admission(tag):
                        self.channel._restore(message)
                    else:
                        self.restore_by_tag(tag, client=conn)  # type: ignore[no-untyped-call]
        except Exception as exc:
            self._restore_failed(exc)
        self._delivered.clear()


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel; `conn_or_acquire` yields one client per pool;
    admission's messages are acked in memory (`AdmissionQoS`)."""

    QoS = AdmissionQoS
    _shared_client: Any = None
    _shared_lock = threading.Lock()

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        pool = self.pool
        shared = self._shared_client
        if shared is None or shared.connection_pool is not pool:
            with self._shared_lock:
                shared = self._shared_client
                if shared is None or shared.connection_pool is not pool:
                    shared = self._create_client()  # type: ignore[no-untyped-call]
                    self._shared_client = shared
        yield shared

    def _restore(self, message: Any, leftmost: bool = False) -> None:
        if not (self.ack_emulation and pushed_by_admission(message.delivery_tag)):
            super()._restore(message, leftmost)  # type: ignore[no-untyped-call]
            return
        # kombu would read the message back from its unacked copy; there is
        # none, so push the payload the worker received (marked redelivered).
        info = message.delivery_info
        with self.conn_or_acquire() as client:
            pipe = client.pipeline()
            self._do_restore_message(  # type: ignore[no-untyped-call]
                copy.deepcopy(message._raw), info["exchange"], info["routing_key"], pipe, leftmost
            )
            pipe.execute()

    @property
    def supports_batch_publish(self) -> bool:
        if getattr(_recording, "recorder", None) is not None:
            return True  # a recorded publish is never sent, so never replayed
        return bool(super().supports_batch_publish)

    def create_publish_batch(self, max_size: int) -> Any:
        recorder: PublishRecorder | None = getattr(_recording, "recorder", None)
        if recorder is None:
            return super().create_publish_batch(max_size)  # type: ignore[no-untyped-call]
        recorder.channel = self
        return recorder


class SafeRedisChannel(kombu_redis.Channel):
    """kombu's Redis channel with `SafeQoS` and nothing else of the fast path."""

    QoS = SafeQoS


class SafeRedisTransport(kombu_redis.Transport):
    """kombu's Redis transport (`redis://`, `rediss://`), unchanged but for `SafeQoS`.

    What a worker runs when `broker.fast_path` refuses `RedisTransport`
    (`VESSEL_FAST_PATH=off`, a kombu CI did not run the shortcuts on): the
    shortcuts go, the fix that keeps a worker alive across a Redis restart stays.
    """

    Channel = SafeRedisChannel


#: The `broker_transport` of redis:// and rediss:// broker URLs when the fast path is off.
SAFE_TRANSPORT = f"{__name__}:SafeRedisTransport"


class SentinelChannel(kombu_redis.SentinelChannel):
    """kombu's Sentinel channel with `SafeQoS`."""

    QoS = SafeQoS


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport (`sentinel://`), unchanged but for `SafeQoS`.

    Not in `TRANSPORTS`: admission does not push messages through Sentinel
    (calls are published with `send_task`), see `broker.celery_app`.
    """

    Channel = SentinelChannel


#: The `broker_transport` of sentinel:// broker URLs.
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport (`redis://`, `rediss://`) with shared-client channels."""

    Channel = RedisChannel


#: The `broker_transport` Celery is given when `broker.fast_path` allows it.
TRANSPORT = f"{__name__}:RedisTransport"


def transport_for(settings: Settings) -> str | None:
    """The transport class path for these settings, or None to let kombu choose.

    `TRANSPORT` when `broker.fast_path.transport_reason` finds nothing against
    it (the setting, a `redis://` or `rediss://` URL, a kombu release CI ran these
    shortcuts on); else `SAFE_TRANSPORT` for any other `redis://` or `rediss://` broker;
    None for the rest (Sentinel: `broker.celery_app` picks `SENTINEL_TRANSPORT`).
    """
    if transport_reason(settings) is None:
        return TRANSPORT
    url = settings.broker_url
    return SAFE_TRANSPORT if is_plain_redis(url) or is_tls_redis(url) else None
