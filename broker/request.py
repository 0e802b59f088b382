"""What a call message carries: ids and the model's arguments, never a command or a URL."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = ["INITIATOR_KINDS", "CallRequest", "Initiator", "InitiatorKind", "new_call_id"]

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
