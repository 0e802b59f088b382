"""The call message: `broker.protocol`'s `CallRequest`, under its older name."""

from __future__ import annotations

from broker.protocol import INITIATOR_KINDS, CallRequest, Initiator, InitiatorKind, new_call_id

__all__ = ["INITIATOR_KINDS", "CallRequest", "Initiator", "InitiatorKind", "new_call_id"]
