"""A call's Celery message, built once at submit, pushed into its lane by admission.

Without this, every call is published twice over: admission decides in Redis
that a call may enter its lane, returns it, and the process that asked (the
client, or the worker whose call just finished) then publishes it with
`send_task` (Celery builds the message, kombu encodes it and LPUSHes it). In a
burst the worker's publish of the next call was a fifth of its CPU.

Instead the client builds the message at submit with Celery's and kombu's own
code, records the command kombu would have sent (`broker.transport.
recording_publishes`: `LPUSH <lane> <payload>`, nothing is sent), and hands the
payload to admission, which keeps it with the call and pushes it into the lane
inside the dispatch script, atomically with the dispatch decision. Per
delivery the script puts in a fresh delivery tag (kombu keys its unacked
bookkeeping on it) and the lane actually chosen as routing key (a dedicated
lane may take the agent later); `Envelope` names the exact texts it replaces.

Whether this runs at all is decided once per client by `broker.fast_path`
(known kombu and Celery releases, kombu's batch-publish hooks, no key prefix,
no priorities, our transport class, a probe, the workers' self-tests, the
`VESSEL_FAST_PATH` setting). When, after that, one call's payload is still
not what this expects, `build_envelope` returns None and that call is
published the plain way (`send_task`).

Recording a publish runs all of Celery's and kombu's message building, about
0.5 ms of CPU, for every submitted call, queued or not. `EnvelopeFactory` does
it once per kind: it records a template, then makes each call's payload by
setting the per-call fields (task id, argsrepr, the body) in a copy of it, and
it uses that shortcut only after checking, on a probe call, that the shortcut
gives byte for byte what recording gives; otherwise it records every call.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
from dataclasses import dataclass
from typing import Any

from celery import Celery

from broker.admission.keys import ADMISSION_TAG_PREFIX
from broker.queues import TASK_NAMES, Kind, shared_lane
from broker.transport import recording_publishes

__all__ = [
    "Envelope",
    "EnvelopeFactory",
    "args_repr",
    "build_envelope",
    "probe_message",
    "send_call",
]


@dataclass(frozen=True, slots=True)
class Envelope:
    """kombu's Redis payload of one call's message, and the texts admission replaces."""

    payload: str
    #: `"routing_key": "<shared lane>"`, once in `payload`.
    route: str
    #: `"delivery_tag": "<uuid>"`, once in `payload`.
    tag: str


def args_repr(args: list[Any], limit: int) -> str:
    """What Flower and the worker's log show of the arguments, cut to Celery's size.

    Celery's own `saferepr` of a plain JSON dict costs more than the rest of the
    message; `repr` of the same does not.
    """
    text = repr(args)
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def send_call(
    app: Celery, kind: Kind, call_id: str, message: dict[str, Any], *, lane: str, producer: Any
) -> None:
    """`send_task` of one call: task id = call id, queue = lane, the message as args."""
    args = [message]
    app.send_task(
        TASK_NAMES[kind],
        args=args,
        task_id=call_id,
        queue=lane,
        producer=producer,
        # The client waits on the result with its own AsyncResult; without this
        # Celery subscribes to every call's result channel at publish time and
        # never unsubscribes.
        ignore_result=True,
        argsrepr=args_repr(args, app.amqp.argsrepr_maxsize),
        kwargsrepr="{}",
    )


def build_envelope(
    app: Celery, kind: Kind, call_id: str, message: dict[str, Any]
) -> Envelope | None:
    """The payload kombu would push for this call into the kind's shared lane, or None."""
    lane = shared_lane(kind)
    with recording_publishes() as recorder, app.producer_or_acquire() as producer:
        batch = getattr(producer, "batch", None)
        if batch is None:  # kombu before 5.7 (broker.fast_path refuses it first)
            return None
        with batch():
            send_call(app, kind, call_id, message, lane=lane, producer=producer)
    if len(recorder.commands) != 1:
        return None
    name, args = recorder.commands[0]
    if name != "lpush" or len(args) != 2 or args[0] != lane or not isinstance(args[1], str):
        return None
    payload = args[1]
    try:
        tag_value = json.loads(payload)["properties"]["delivery_tag"]
    except (ValueError, KeyError, TypeError):
        return None
    route = f'"routing_key": {json.dumps(lane)}'
    tag = f'"delivery_tag": {json.dumps(tag_value)}'
    if payload.count(route) != 1 or payload.count(tag) != 1:
        return None
    return Envelope(payload=payload, route=route, tag=tag)


#: The probe the shortcut is checked on: non-ASCII text, escapes, nesting.
_PROBE_ID = "0" * 32
_PROBE_MESSAGE: dict[str, Any] = {
    "call_id": _PROBE_ID,
    "agent": "probe",
    "tool": "probe",
    "arguments": {"text": 'caf\u00e9 \u2028 "quoted" \\ \u0000', "list": [1, 2.5, None, True]},
    "owner": "web/probe",
    "turn": None,
}


def probe_message() -> tuple[str, dict[str, Any]]:
    """A call id and message that exercise the encoder (for probes and self-tests)."""
    return _PROBE_ID, copy.deepcopy(_PROBE_MESSAGE)


@dataclass(frozen=True, slots=True)
class _Template:
    """A recorded payload, decoded, and the `embed` part of its body (the same for every call)."""

    payload: dict[str, Any]
    embed: Any


class EnvelopeFactory:
    """`build_envelope`, fast: a recorded template per kind, checked once (see the module)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._templates: dict[str, _Template | None] = {}
        self._lock = threading.Lock()

    def build(self, kind: Kind, call_id: str, message: dict[str, Any]) -> Envelope | None:
        template = self._template(kind)
        if template is None:
            return build_envelope(self.app, kind, call_id, message)
        return self._from_template(template, kind, call_id, message)

    def _template(self, kind: Kind) -> _Template | None:
        with self._lock:
            if kind not in self._templates:
                self._templates[kind] = self._checked_template(kind)
            return self._templates[kind]

    def _checked_template(self, kind: Kind) -> _Template | None:
        """The decoded template, if the shortcut reproduces a recorded probe exactly."""
        recorded = build_envelope(self.app, kind, _PROBE_ID, _PROBE_MESSAGE)
        if recorded is None:
            return None
        try:
            payload: dict[str, Any] = json.loads(recorded.payload)
            template = _Template(payload, json.loads(base64.b64decode(payload["body"]))[2])
            made = self._from_template(template, kind, _PROBE_ID, _PROBE_MESSAGE, tag=recorded.tag)
        except (IndexError, KeyError, TypeError, ValueError):
            return None
        return template if made == recorded else None

    def _from_template(
        self,
        template: _Template,
        kind: Kind,
        call_id: str,
        message: dict[str, Any],
        *,
        tag: str | None = None,
    ) -> Envelope | None:
        from kombu.utils.json import dumps  # noqa: PLC0415 (kombu's encoder, as in the publish)

        payload = copy.deepcopy(template.payload)
        headers, properties = payload["headers"], payload["properties"]
        args = [message]
        text = args_repr(args, self.app.amqp.argsrepr_maxsize)
        headers["id"] = headers["root_id"] = call_id
        headers["argsrepr"] = properties["argsrepr"] = text
        properties["correlation_id"] = call_id
        body = str(dumps([args, {}, template.embed])).encode("utf-8")  # type: ignore[no-untyped-call]
        payload["body"] = base64.b64encode(body).decode("ascii")
        if tag is None:
            # The tag is replaced per delivery by admission; any unique text does here.
            properties["delivery_tag"] = f"{ADMISSION_TAG_PREFIX}{call_id}-0"
        else:
            properties["delivery_tag"] = json.loads(tag.split(": ", 1)[1])
        text_payload = str(dumps(payload))  # type: ignore[no-untyped-call]
        lane = shared_lane(kind)
        route = f'"routing_key": {json.dumps(lane)}'
        tag_text = f'"delivery_tag": {json.dumps(properties["delivery_tag"])}'
        if text_payload.count(route) != 1 or text_payload.count(tag_text) != 1:
            return None
        return Envelope(payload=text_payload, route=route, tag=tag_text)
