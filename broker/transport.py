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
new pool. Nothing else of kombu's behaviour changes: same keys, same messages,
same acks and visibility timeout.

`broker.celery_app.make_app` selects this transport (`broker_transport`) for
`redis://` broker URLs. Not for `rediss://`: kombu derives its TLS defaults
from that transport name, so TLS brokers keep kombu's own class.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = [
    "TRANSPORTS",
    "PublishRecorder",
    "RedisChannel",
    "RedisTransport",
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


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel; `conn_or_acquire` yields one client per pool."""

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


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport (`redis://`) with shared-client channels."""

    Channel = RedisChannel


#: URL scheme -> the `broker_transport` Celery is given for it.
TRANSPORTS: dict[str, str] = {
    "redis": f"{__name__}:RedisTransport",
}


def transport_for(broker_url: str) -> str | None:
    """The transport class path for a broker URL, or None to let kombu choose."""
    scheme = broker_url.split("://", 1)[0].lower() if "://" in broker_url else ""
    return TRANSPORTS.get(scheme)
