"""Cutting a result to what the model is shown (seed 000, "What the model sees")."""

from __future__ import annotations

__all__ = ["WORKSPACE_LOST_TEXT", "cut_output", "dropped_note", "with_workspace_lost"]

#: Put before the output of a call whose turn's workspace was lost (its home
#: host died, or Redis lost the turn's home): never a silent empty workspace.
WORKSPACE_LOST_TEXT = (
    "[this turn's workspace was lost with its host; this call started with an empty one]"
)


def with_workspace_lost(output: str) -> str:
    """`output` with the lost-workspace note before it (not counted against the cut)."""
    return f"{WORKSPACE_LOST_TEXT}\n{output}"


def dropped_note(dropped: int) -> str:
    """The note appended to a cut result, saying how much was dropped."""
    return f"\n[{dropped} characters dropped]"


def cut_output(text: str, limit: int, *, already_dropped: int = 0) -> tuple[str, int]:
    """Cut `text` to `limit` characters and say how many were dropped.

    `already_dropped` counts characters that never reached `text` (a flood the
    reader stopped keeping), so the note tells the whole truth. The note itself
    is not counted against the limit: the model always sees `limit` characters
    of the tool's own output.
    """
    dropped = already_dropped + max(0, len(text) - limit)
    if dropped == 0:
        return text, 0
    return text[:limit] + dropped_note(dropped), dropped
