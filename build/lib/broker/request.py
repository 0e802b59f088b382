"""What a call message carries: ids and the model's arguments, never a command or a URL."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["CallRequest", "new_call_id"]


def new_call_id() -> str:
    return uuid.uuid4().hex


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

    def to_message(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "agent": self.agent,
            "tool": self.tool,
            "arguments": self.arguments,
            "owner": self.owner,
            "turn": self.turn,
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
        )
