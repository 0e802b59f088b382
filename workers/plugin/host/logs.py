"""`host.log.debug/info/warn/error(message)`: to the worker's log and onto the result.

Each entry goes to the `vessel.plugin` logger at its level, prefixed with the
plugin, the tool and the call id, and is kept for the call's result (`logs`).
Per call at most `MAX_ENTRIES` entries and `MAX_CALL_BYTES` of messages are
kept and logged; a message longer than `MAX_MESSAGE_CHARS` is cut. What is over
the caps is dropped and counted: the last entry says how many were dropped, so
a handler logging in a loop cannot flood the worker's log or the result.
A message that is not a string is written as JSON.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from workers.plugin.host.context import HostContext, HostRefused

__all__ = [
    "LEVELS",
    "MAX_CALL_BYTES",
    "MAX_ENTRIES",
    "MAX_MESSAGE_CHARS",
    "MAX_TRACKED_CALLS",
    "CallLogs",
]

#: Entries one call keeps: a handler's progress notes, not a trace.
MAX_ENTRIES = 100
#: Characters of one message kept.
MAX_MESSAGE_CHARS = 2_000
#: UTF-8 bytes of all of a call's messages kept: the result crosses Redis.
MAX_CALL_BYTES = 32 * 1024
#: Calls whose entries are kept before the runner collects them; past this the
#: oldest are forgotten (a runner that never asked for them).
MAX_TRACKED_CALLS = 10_000
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}

_log = logging.getLogger("vessel.plugin")


@dataclass(slots=True)
class _Call:
    entries: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0
    dropped: int = 0


class CallLogs:
    """The kept entries of every call in flight; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: OrderedDict[str, _Call] = OrderedDict()

    def write(self, context: HostContext, level: str, args: list[Any]) -> None:
        if level not in LEVELS:
            raise HostRefused(f"host.log.{level} refused: host.log has debug, info, warn and error")
        if len(args) != 1:
            raise HostRefused(f"host.log.{level} refused: it takes one message")
        message = args[0]
        if not isinstance(message, str):
            message = json.dumps(message, ensure_ascii=False, default=str)
        message = message[:MAX_MESSAGE_CHARS]
        size = len(message.encode("utf-8", "surrogatepass"))
        with self._lock:
            call = self._calls.get(context.call_id)
            if call is None:
                call = self._calls[context.call_id] = _Call()
                if len(self._calls) > MAX_TRACKED_CALLS:
                    self._calls.popitem(last=False)
            if len(call.entries) >= MAX_ENTRIES or call.size + size > MAX_CALL_BYTES:
                call.dropped += 1
                return
            call.entries.append({"level": level, "message": message})
            call.size += size
        _log.log(
            LEVELS[level],
            "plugin %s, tool %s, call %s: %s",
            context.plugin.slug,
            context.tool.name,
            context.call_id,
            message,
        )

    def take(self, call_id: str) -> list[dict[str, Any]]:
        """The call's entries (plus one counting the dropped ones), forgotten here."""
        with self._lock:
            call = self._calls.pop(call_id, None)
        if call is None:
            return []
        entries = list(call.entries)
        if call.dropped:
            entries.append(
                {
                    "level": "warn",
                    "message": f"[{call.dropped} more log entries dropped: at most "
                    f"{MAX_ENTRIES} entries and {MAX_CALL_BYTES} bytes per call]",
                }
            )
        return entries
