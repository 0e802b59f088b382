"""A call's prepared Celery message (broker/envelope.py) is what Celery and kombu publish."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from celery import Celery
from kombu.messaging import Producer

from broker.celery_app import make_app
from broker.config import Settings
from broker.envelope import EnvelopeFactory, build_envelope
from broker.queues import shared_lane

MESSAGE = {
    "call_id": "c" * 32,
    "agent": "field-guide",
    "tool": "species",
    "arguments": {"habitat": "rivers \u00e9\u2028", "deep": [{"n": 1}] * 50},
    "owner": "web/alice",
    "turn": "t-1",
}


#: kombu 5.7 brought batch publishing, which the recorder stands in for.
BATCHES = callable(getattr(Producer, "batch", None))
needs_batches = pytest.mark.skipif(not BATCHES, reason="this kombu has no Producer.batch")


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    found = make_app(Settings(broker_url=redis_url))
    yield found
    found.close()


@needs_batches
def test_a_recorded_envelope_is_the_message_send_task_publishes(app: Celery) -> None:
    envelope = build_envelope(app, "sandbox", MESSAGE["call_id"], MESSAGE)
    assert envelope is not None
    message = json.loads(envelope.payload)
    assert message["headers"]["task"] == "vessel.sandbox_call"
    assert message["headers"]["id"] == message["properties"]["correlation_id"] == "c" * 32
    assert message["properties"]["delivery_info"]["routing_key"] == shared_lane("sandbox")
    assert envelope.payload.count(envelope.route) == envelope.payload.count(envelope.tag) == 1


@needs_batches
@pytest.mark.parametrize("kind", ["sandbox", "service"])
def test_the_template_shortcut_gives_what_recording_gives(app: Celery, kind: str) -> None:
    factory = EnvelopeFactory(app)
    fast = factory.build(kind, MESSAGE["call_id"], MESSAGE)  # type: ignore[arg-type]
    recorded = build_envelope(app, kind, MESSAGE["call_id"], MESSAGE)  # type: ignore[arg-type]
    assert fast is not None and recorded is not None
    assert factory._templates[kind] is not None  # the shortcut passed its check
    made, expected = json.loads(fast.payload), json.loads(recorded.payload)
    # Only the delivery tag differs: admission replaces it per delivery anyway.
    made["properties"].pop("delivery_tag")
    expected["properties"].pop("delivery_tag")
    assert made == expected
    assert fast.route == recorded.route


@pytest.mark.skipif(BATCHES, reason="this kombu has batch publishing")
def test_without_batch_publishing_no_envelope_is_built(app: Celery) -> None:
    # kombu before 5.7: no AttributeError, the call is published with send_task.
    assert build_envelope(app, "sandbox", MESSAGE["call_id"], MESSAGE) is None
    assert EnvelopeFactory(app).build("service", MESSAGE["call_id"], MESSAGE) is None
