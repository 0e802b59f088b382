"""What every host call carries, the two ways it can be rejected, and the bridge's shape.

`HostContext` is built by the runtime (`workers.plugin`) once per plugin call and
handed to `HostBridge.call` with every `host.<chain>(...)` the handler makes.

    HostRefused   the plugin may not do this (no derived permission, a host not in
                  its egress, a path outside the workspace...): never works as written
    HostFailed    it was allowed but failed (an HTTP error, no such file, the
                  platform answered an error): may work another time

Both reject the handler's promise with `str(exc)`, one sentence that says what
was refused or what failed, naming nothing of the host (no paths, no secrets).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from broker.errors import VesselError

if TYPE_CHECKING:
    from broker.model import Agent, Plugin, PluginTool
    from broker.request import Initiator

__all__ = ["HostBridge", "HostContext", "HostFailed", "HostRefused"]


class HostRefused(VesselError):
    """The plugin may not make this host call; the message says what was refused."""


class HostFailed(VesselError):
    """The host call was allowed but failed; the message says what failed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostContext:
    """One plugin call, as every host call of it sees it."""

    call_id: str
    agent: Agent
    tool: PluginTool
    plugin: Plugin
    owner: str
    turn: str | None
    initiator: Initiator
    #: time.monotonic() at which the call's time limit ends.
    deadline: float
    cancel: threading.Event

    def seconds_left(self) -> float:
        """Time left before the call's limit (negative once it has passed)."""
        return self.deadline - time.monotonic()


class HostBridge(Protocol):
    """What answers the handler's `host` global (`workers.plugin.host.PluginHost`)."""

    def call(self, context: HostContext, chain: str, args: list[Any]) -> Any:
        """Answer `host.<chain>(...args)`: a JSON value, or raise HostRefused/HostFailed.

        `chain` is the member chain after `host.` joined by '.', e.g. "fetch",
        "settings.get", "workspace.write", "session.post". Thread-safe.
        """
        ...

    def logs(self, call_id: str) -> list[dict[str, Any]]:
        """The call's `host.log` entries (and forget them: call once, when it ends)."""
        ...

    def secrets(self, plugin: str) -> list[str]:
        """Resolved `env:` values of the plugin (8+ characters) to redact from results."""
        ...

    def close(self) -> None: ...
