"""broker/transport.py on a real Redis: admission's messages are acked in memory,
every other message keeps kombu's unacked bookkeeping."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from broker.admission.keys import ADMISSION_TAG_PREFIX
from broker.transport import RedisTransport, pushed_by_admission

LANE = "vessel.service"


@pytest.fixture
def connection(redis_url: str) -> Iterator[Connection]:
    conn = Connection(redis_url, transport=RedisTransport)
    yield conn
    conn.release()


@pytest.fixture
def plain(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _publish(
    conn: Connection, plain: redis.Redis, body: dict[str, Any], *, tag: str | None = None
) -> None:
    """Publish through kombu; with `tag`, rewrite the delivery tag as admission's push does."""
    queue = Queue(LANE, Exchange(LANE), routing_key=LANE)
    with conn.channel() as channel:
        Producer(channel).publish(body, exchange=queue.exchange, routing_key=LANE, declare=[queue])
    if tag is None:
        return
    payload = json.loads(plain.lpop(LANE))
    payload["properties"]["delivery_tag"] = tag
    plain.lpush(LANE, json.dumps(payload))


def _waiting(plain: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(m) for m in reversed(plain.lrange(LANE, 0, -1))]


def test_only_admission_tags_are_recognised() -> None:
    assert pushed_by_admission(f"{ADMISSION_TAG_PREFIX}c0ffee-1")
    assert not pushed_by_admission("6f1c7a9e-0d7e-4c39-9a43-3c4b8f0c1d2e")
    assert not pushed_by_admission(7)


def test_an_admission_message_leaves_no_unacked_copy_and_acks_in_memory(
    connection: Connection, plain: redis.Redis
) -> None:
    _publish(connection, plain, {"n": 1}, tag="vessel-a1-1")
    channel = connection.channel()
    message = channel.basic_get(LANE)
    assert message is not None and message.delivery_tag == "vessel-a1-1"
    assert plain.hlen("unacked") == 0 and plain.zcard("unacked_index") == 0
    assert list(channel.qos._delivered) == ["vessel-a1-1"]
    message.ack()
    channel.qos._flush()
    assert list(channel.qos._delivered) == []
    channel.close()
    assert _waiting(plain) == []  # acked: nothing restored at close


def test_a_kombu_message_keeps_its_unacked_copy_until_acked(
    connection: Connection, plain: redis.Redis
) -> None:
    _publish(connection, plain, {"n": 2})
    channel = connection.channel()
    message = channel.basic_get(LANE)
    assert message is not None and not pushed_by_admission(message.delivery_tag)
    assert plain.hexists("unacked", message.delivery_tag)
    message.ack()
    assert plain.hlen("unacked") == 0 and plain.zcard("unacked_index") == 0
    channel.close()


def test_an_unacked_admission_message_goes_back_to_the_head_of_its_lane_at_close(
    connection: Connection, plain: redis.Redis
) -> None:
    _publish(connection, plain, {"n": "held"}, tag="vessel-h1-1")
    _publish(connection, plain, {"n": "next"}, tag="vessel-n1-1")
    channel = connection.channel()
    held = channel.basic_get(LANE)
    assert held is not None and held.delivery_tag == "vessel-h1-1"
    channel.close()  # as at a warm shutdown: kombu restores what was not acked
    waiting = _waiting(plain)
    assert [m["properties"]["delivery_tag"] for m in waiting] == ["vessel-h1-1", "vessel-n1-1"]
    assert waiting[0]["headers"]["redelivered"] is True
    assert waiting[0]["body"] == json.loads(json.dumps(held._raw))["body"]
    assert plain.hlen("unacked") == 0


def test_a_requeued_admission_message_is_pushed_back_once(
    connection: Connection, plain: redis.Redis
) -> None:
    _publish(connection, plain, {"n": "again"}, tag="vessel-r1-1")
    channel = connection.channel()
    message = channel.basic_get(LANE)
    assert message is not None
    message.reject(requeue=True)
    channel.close()  # rejected: nothing more to restore
    assert [m["properties"]["delivery_tag"] for m in _waiting(plain)] == ["vessel-r1-1"]


def test_a_rejected_admission_message_without_requeue_is_dropped(
    connection: Connection, plain: redis.Redis
) -> None:
    _publish(connection, plain, {"n": "gone"}, tag="vessel-g1-1")
    channel = connection.channel()
    message = channel.basic_get(LANE)
    assert message is not None
    message.reject(requeue=False)
    channel.close()
    assert _waiting(plain) == [] and plain.hlen("unacked") == 0
