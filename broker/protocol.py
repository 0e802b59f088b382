"""What crosses the broker between the client and the workers, defined once.

Both sides import this module and nothing of each other (tests/test_layering.py):

* the call: `CallRequest` (with its `Initiator`), the Celery task's one argument;
* the result: `ToolResult`, which every call ends as (DESIGN.md, "The result"),
  with `ToolResult.error`, the one constructor of an error result built outside
  a tool's own output (refused at submit, cancelled, a worker that failed);
* the model-facing texts both sides write (`CANCELLED_TEXT`, `format_seconds`);
* the result's place in the Celery result backend (`store_result`,
  `result_from_meta`, `backend_record`): the task's state, its value as a plain
  JSON object (`ToolResult.to_dict`), rebuilt on the client with `from_dict`.

The Redis keys both sides use are named in `broker.admission.keys`.
`broker.request` and `broker.result` are this module's older names.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from celery import states

__all__ = [
    "CANCELLED_TEXT",
    "INITIATOR_KINDS",
    "RESULT_STATE",
    "CallRequest",
    "Initiator",
    "InitiatorKind",
    "OutboxFile",
    "ToolResult",
    "backend_notifies",
    "backend_record",
    "cancelled_result",
    "format_seconds",
    "new_call_id",
    "result_from_meta",
    "store_result",
    "worker_failed_text",
    "worker_stopped_text",
]

# --- the texts the model sees, where both sides write them --------------------

#: What the model sees of a cancelled call (queued or running, any tool kind).
CANCELLED_TEXT = "[cancelled]"


def format_seconds(seconds: float) -> str:
    """Seeds 000 and 001 write N in `after N s`, `within N s`: `2` for 2.0, `1.5` for 1.5."""
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def worker_failed_text(tool: str) -> str:
    """The worker could not run the call (its executor raised)."""
    return f"{tool}: the worker failed to run this call"


def worker_stopped_text(tool: str) -> str:
    """The worker running the call died after marking it done, before its result."""
    return f"{tool}: the worker running this call stopped before it returned"


# --- the call -------------------------------------------------------------------

#: Seed 002: what started the turn, set by the platform and never by the model.
InitiatorKind = Literal["user", "channelSender", "schedule", "event", "agent", "platform"]
INITIATOR_KINDS: tuple[str, ...] = get_args(InitiatorKind)


def new_call_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True, slots=True)
class Initiator:
    """What started the turn (seed 002's `TurnInitiator`), passed by the platform with the call.

    A plugin handler sees it as `context.initiator`; it never comes from the
    model's arguments. The default is the platform itself, not verified.
    """

    kind: InitiatorKind = "platform"
    #: True when every input came from a signed-in user or a verified contact.
    is_verified_person: bool = False

    def __post_init__(self) -> None:
        if self.kind not in INITIATOR_KINDS:
            raise ValueError(
                f"initiator kind {self.kind!r} is not one of {', '.join(INITIATOR_KINDS)}"
            )
        if not isinstance(self.is_verified_person, bool):
            raise ValueError("initiator isVerifiedPerson must be true or false")

    def to_message(self) -> dict[str, Any]:
        return {"kind": self.kind, "isVerifiedPerson": self.is_verified_person}

    @classmethod
    def from_message(cls, data: Any) -> Initiator:
        """The message's value; a missing one is the default (older clients send none)."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"initiator must be an object, not {type(data).__name__}")
        return cls(
            kind=data.get("kind", "platform"),
            is_verified_person=data.get("isVerifiedPerson", False),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class CallRequest:
    """One tool call as it crosses the broker.

    `arguments` is the model's value as received, possibly not an object: the
    worker refuses it with the seed's message, so the platform gets a result
    rather than an enqueue-time exception it might drop.
    """

    call_id: str
    agent: str
    tool: str
    arguments: Any
    owner: str
    turn: str | None = None
    initiator: Initiator = Initiator()

    def to_message(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "agent": self.agent,
            "tool": self.tool,
            "arguments": self.arguments,
            "owner": self.owner,
            "turn": self.turn,
            "initiator": self.initiator.to_message(),
        }

    @classmethod
    def from_message(cls, data: dict[str, Any]) -> CallRequest:
        return cls(
            call_id=str(data["call_id"]),
            agent=str(data["agent"]),
            tool=str(data["tool"]),
            arguments=data.get("arguments"),
            owner=str(data["owner"]),
            turn=None if data.get("turn") is None else str(data["turn"]),
            initiator=Initiator.from_message(data.get("initiator")),
        )


# --- the result -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxFile:
    """A regular file the tool left in `$VESSEL_OUTBOX`."""

    name: str
    size: int
    sha256: str
    content_base64: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "sha256": self.sha256,
            "content": self.content_base64,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResult:
    """What one call produced; `output` is the text the model sees, already cut."""

    call_id: str
    agent: str
    tool: str
    is_error: bool
    output: str
    dropped_chars: int = 0
    #: Declared tools: the command's exit status (None when killed or refused).
    exit_code: int | None = None
    #: Service tools: the HTTP status (None when there was no answer).
    status: int | None = None
    duration_ms: float = 0.0
    files: tuple[OutboxFile, ...] = ()
    #: Why the call ended, for metrics and operators: "ok", "error", "timeout",
    #: "refused", "cancelled", "killed".
    outcome: str = "ok"
    #: Outbox entries that were not returned (links, special files, over the cap).
    skipped_files: tuple[str, ...] = field(default=())
    #: The turn's workspace was lost with its host (or Redis lost its home):
    #: this call started with an empty one, and `output` begins with a note saying so.
    workspace_lost: bool = False
    #: Plugin tools: the call's `host.log` entries (`{"level", "message", ...}`), capped.
    logs: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        # By hand, not `asdict`: every field is a plain value but the two
        # tuples, and `asdict` deep-copies each one (a tenth of a ms per call).
        return {
            "call_id": self.call_id,
            "agent": self.agent,
            "tool": self.tool,
            "is_error": self.is_error,
            "output": self.output,
            "dropped_chars": self.dropped_chars,
            "exit_code": self.exit_code,
            "status": self.status,
            "duration_ms": self.duration_ms,
            "files": [f.to_dict() for f in self.files],
            "outcome": self.outcome,
            "skipped_files": list(self.skipped_files),
            "workspace_lost": self.workspace_lost,
            "logs": list(self.logs),
        }

    @classmethod
    def error(
        cls,
        request: CallRequest,
        text: str,
        *,
        outcome: str = "error",
        duration_ms: float = 0.0,
    ) -> ToolResult:
        """A result that ends a call in error before (or instead of) its tool's
        own output: `text` is what the model sees. The one way such a result
        is made, on either side of the broker."""
        return cls(
            call_id=request.call_id,
            agent=request.agent,
            tool=request.tool,
            is_error=True,
            output=text,
            duration_ms=round(duration_ms, 3),
            outcome=outcome,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolResult:
        files = tuple(
            OutboxFile(
                name=f["name"], size=f["size"], sha256=f["sha256"], content_base64=f["content"]
            )
            for f in data.get("files", ())
        )
        return cls(
            call_id=data["call_id"],
            agent=data["agent"],
            tool=data["tool"],
            is_error=data["is_error"],
            output=data["output"],
            dropped_chars=data.get("dropped_chars", 0),
            exit_code=data.get("exit_code"),
            status=data.get("status"),
            duration_ms=data.get("duration_ms", 0.0),
            files=files,
            outcome=data.get("outcome", "ok"),
            skipped_files=tuple(data.get("skipped_files", ())),
            workspace_lost=bool(data.get("workspace_lost", False)),
            logs=tuple(data.get("logs", ())),
        )


def cancelled_result(request: CallRequest, *, duration_ms: float = 0.0) -> ToolResult:
    """The result of a cancelled call: `[cancelled]`, outcome `cancelled`."""
    return ToolResult.error(request, CANCELLED_TEXT, outcome="cancelled", duration_ms=duration_ms)


# --- the result in Celery's result backend ------------------------------------------

#: The task state a stored result has: every call ends in a result, errors included.
RESULT_STATE = states.SUCCESS


def store_result(backend: Any, result: ToolResult) -> None:
    """Write `result` through a Celery result backend, as the call's task result."""
    backend.store_result(result.call_id, result.to_dict(), RESULT_STATE)


def result_from_meta(meta: Any) -> ToolResult | None:
    """The result in a backend's task meta (`get_task_meta`, a decoded message), or None."""
    if isinstance(meta, dict) and meta.get("status") == RESULT_STATE:
        value = meta.get("result")
        if isinstance(value, dict):
            return ToolResult.from_dict(value)
    return None


def backend_notifies(backend: object) -> bool:
    """True for a Redis result backend (it PUBLISHes every result it stores).

    Checked without importing the Redis backend: if `backend` is one, its
    module is loaded already; the embedded default never loads redis-py.
    """
    module = sys.modules.get("celery.backends.redis")
    return module is not None and isinstance(backend, module.RedisBackend)


def backend_record(backend: Any, result: ToolResult) -> tuple[bytes | str, bytes | str, int | None]:
    """(key, encoded value, expiry in s) that a Celery key-value backend (Redis) would
    write for `result`, built by the backend itself, for admission's `complete`
    script to write with the call's done mark."""
    meta = backend._get_result_meta(
        result=result.to_dict(), state=RESULT_STATE, traceback=None, request=None
    )
    meta["task_id"] = result.call_id
    return backend.get_key_for_task(result.call_id), backend.encode(meta), backend.expires
