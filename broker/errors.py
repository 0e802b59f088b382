"""The exception tree of vessel-workers.

    VesselError                      root: everything below can be caught as one
    ├── ConfigError                  never works until an operator edits a file
    │   ├── InvalidDeployment        a deployment or package has problems (all listed)
    │   └── MissingBrokerURL         a client or worker needs VESSEL_BROKER_URL and it is unset
    ├── UnknownAgent / UnknownTool   a call names what the deployment does not have
    ├── DuplicateCall                a call id admission already knows (queued, running or done)
    ├── RefusedCall                  a call refused before anything ran (bad arguments)
    ├── ConfinementUnavailable       no confinement here: sandbox workers refuse to start
    ├── MissingSecret                a grant's env:NAME is not set where service workers start
    ├── WorkspaceError               a workspace operation refused (no such file, too large, ...)
    └── TransientError               try again: broker, Redis or network trouble
        ├── CallTimeout              no result arrived within the client's wait
        ├── BrokerUnavailable        the broker's Redis cannot be reached or refuses us (an outage,
        │                            a password, a database, TLS)
        └── BrokerLostCall           the broker lost this call (it came back empty): submit again

"Never works" errors (ConfigError, UnknownAgent, UnknownTool, DuplicateCall,
RefusedCall, ConfinementUnavailable, MissingSecret) must not be retried;
TransientError may be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BrokerLostCall",
    "BrokerUnavailable",
    "CallTimeout",
    "ConfigError",
    "ConfinementUnavailable",
    "DuplicateCall",
    "InvalidDeployment",
    "MissingBrokerURL",
    "MissingSecret",
    "Problem",
    "RefusedCall",
    "TransientError",
    "UnknownAgent",
    "UnknownTool",
    "VesselError",
    "WorkspaceError",
]


class VesselError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigError(VesselError):
    """A deployment, package or setting is wrong; an operator must fix a file."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in one file: printed by `check` as `FILE: FIELD: message`."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


class InvalidDeployment(ConfigError):
    """The deployment or one of its packages has problems; `problems` lists them all."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class MissingBrokerURL(ConfigError):
    """VESSEL_BROKER_URL is not set where a client or worker needs the broker's Redis."""


class DuplicateCall(VesselError):
    """A call was submitted with an id admission already knows; the same id never works."""

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        super().__init__(
            f"call id {call_id!r} is already known (queued, running or finished): "
            "every call needs an id of its own"
        )


class UnknownAgent(VesselError):
    """The call names an agent the deployment does not declare."""


class UnknownTool(VesselError):
    """The call names a tool the agent does not have."""


class RefusedCall(VesselError):
    """A call refused before it ran; `model_text` is what the model is told."""

    def __init__(self, model_text: str) -> None:
        self.model_text = model_text
        super().__init__(model_text)


class ConfinementUnavailable(VesselError):
    """bubblewrap or the seccomp filter cannot work on this host; nothing may run unconfined."""


class MissingSecret(ConfigError):
    """A grant names env:NAME and NAME is not set; the message names it, never a value."""


class TransientError(VesselError):
    """Broker, Redis or network trouble: the same call may succeed later."""


class CallTimeout(TransientError):
    """The client waited for a result longer than it was asked to."""


class WorkspaceError(VesselError):
    """A workspace operation (`client.files`) the home host refused; the message says why.

    `reason` is one of `broker.files.REASONS` (`not_found`, `symlink`, ...), for
    a caller that answers each differently; `refused` when the worker gave none.
    """

    def __init__(self, message: str, reason: str = "refused") -> None:
        super().__init__(message)
        self.reason = reason


class BrokerUnavailable(TransientError):
    """The broker's (or result backend's) Redis cannot be reached (down, restarting,
    failing over) or refuses the connection (password, database, TLS); the message
    names the URL, never its password."""


class BrokerLostCall(TransientError):
    """The broker lost this call (a Redis that came back empty); submit it again."""
