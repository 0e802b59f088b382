"""The one result every call ends as (DESIGN.md, "The result").

It crosses the Celery result backend as a plain JSON object (`to_dict`) and is
rebuilt on the client side with `ToolResult.from_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["OutboxFile", "ToolResult"]


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
