"""The turns a client saw homed: the evidence that tells a turn's first call from
one whose home Redis lost (`broker.admission`, "Turns and homes").

A turn counts as seen once a result of one of its calls that ran (not one
cancelled in its queue), or a workspace operation of it, came back; the
mark lasts the workspace's idle TTL. Both memories are bounded.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from broker.constants import WORKSPACE_IDLE_TTL_SECONDS
from broker.protocol import ToolResult

__all__ = ["SeenTurns"]

#: Turns (agent, turn), and calls following their turn, remembered at most.
_SEEN_TURNS = 100_000


class SeenTurns:
    """Which (agent, turn) came back homed lately, and which calls follow a turn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (agent, turn) -> when a result or operation of it last came back.
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()
        #: call id -> (agent, turn), for calls that follow their turn's home.
        self._calls: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def note_call(self, call_id: str, agent: str, turn: str) -> None:
        """A call of the turn was submitted: its result will show the turn homed."""
        with self._lock:
            self._calls[call_id] = (agent, turn)
            while len(self._calls) > _SEEN_TURNS:
                self._calls.popitem(last=False)

    def result_came(self, result: ToolResult) -> None:
        """A result came back: if its call ran, its turn is homed."""
        with self._lock:
            key = self._calls.pop(result.call_id, None)
        if key is not None and result.outcome != "cancelled":
            self.saw(*key)

    def saw(self, agent: str, turn: str) -> None:
        """Remember that the turn had a home (a result or operation came back)."""
        with self._lock:
            self._seen[(agent, turn)] = time.monotonic()
            self._seen.move_to_end((agent, turn))
            while len(self._seen) > _SEEN_TURNS:
                self._seen.popitem(last=False)

    def seen(self, agent: str, turn: str) -> bool:
        """True if the turn was seen homed within the workspace idle TTL."""
        with self._lock:
            when = self._seen.get((agent, turn))
        return when is not None and time.monotonic() - when < WORKSPACE_IDLE_TTL_SECONDS

    def forget(self, agents: list[str], turn: str) -> None:
        """The turn ended: its homes are gone."""
        with self._lock:
            for agent in agents:
                self._seen.pop((agent, turn), None)
