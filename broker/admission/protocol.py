"""The interface both admissions satisfy (`RedisAdmission`, `LocalAdmission`) and
what its operations return.

The rules themselves are described in `broker.admission` (the package's
docstring); `tests/admission/` runs each of them against both implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from broker.queues import KINDS, Kind, base_lane

if TYPE_CHECKING:
    from broker.envelope import Envelope

__all__ = [
    "Admission",
    "CancelOutcome",
    "Claim",
    "ClaimOutcome",
    "Dispatched",
    "Subscription",
    "lane_kind",
]

ClaimOutcome = Literal["run", "done", "busy", "cancelled", "moved"]
CancelOutcome = Literal["queued", "signalled", "finished", "unknown"]


def lane_kind(lane: str) -> Kind:
    """The worker kind of a lane name (`vessel.<kind>[.<agent>][@<host>]`)."""
    parts = base_lane(lane).split(".")
    kind = parts[1] if len(parts) > 1 else ""
    for known in KINDS:
        if kind == known:
            return known
    raise ValueError(f"{lane!r} is not a lane")


@dataclass(frozen=True, slots=True)
class Dispatched:
    """A call admission let into a lane: publish it as a Celery task."""

    call_id: str
    lane: str
    #: The CallRequest message, as JSON text.
    message: str

    @property
    def kind(self) -> Kind:
        return lane_kind(self.lane)


@dataclass(frozen=True, slots=True)
class Claim:
    """What `claim_at_home` decided for one delivery of a call."""

    outcome: ClaimOutcome
    #: The turn's workspace is lost: the result must say so (and a worker
    #: taking the turn over empties any folder it had of it first: `rehomed`).
    workspace_lost: bool = False
    #: The home died (or Redis lost it) and this host took the turn now.
    rehomed: bool = False
    #: What the claim dispatched (a `moved` call went to its home lane).
    dispatched: tuple[Dispatched, ...] = ()


class Subscription(Protocol):
    def close(self) -> None: ...


class Admission(Protocol):
    """The admission state of every call; see `broker.admission` for the rules."""

    def submit(
        self,
        *,
        call_id: str,
        kind: Kind,
        agent: str,
        message: str,
        limit: int,
        lease_ms: int,
        turn: str | None,
        ttl_seconds: int,
        envelope: Envelope | None = None,
        affinity: bool = False,
        seen: bool = False,
    ) -> list[Dispatched]:
        """Queue one call and dispatch; returns what the caller must publish.

        With an `envelope` (`broker.envelope`) the Redis implementation pushes
        the call into its lane itself when it is dispatched, and it is not returned.
        `affinity`: the call follows its turn's home (declared tools with a
        turn); `seen`: the client saw the turn homed before (a result came back).
        """
        ...

    def claim(self, call_id: str, hostname: str, lease_ms: int) -> ClaimOutcome: ...

    def claim_at_home(
        self,
        call_id: str,
        hostname: str,
        lease_ms: int,
        *,
        host_id: str,
        home_ttl_seconds: int,
        here: bool,
    ) -> Claim:
        """`claim` for a worker of host `host_id`: a call following its turn runs
        only at the turn's home (see "Turns and homes"). `here`: the turn's
        folder exists on this host."""
        ...

    def route_turn(self, kind: Kind, agent: str, turn: str) -> str:
        """The lane a workspace operation of the turn goes to."""
        ...

    def take_home(
        self,
        agent: str,
        turn: str,
        mine: str,
        *,
        home_ttl_seconds: int,
        here: bool,
        seen: bool,
    ) -> tuple[str, int]:
        """For a workspace operation arriving on home lane `mine`: (the turn's
        home lane, lost: 0 no, 1 lost earlier, 2 lost now, empty the folder)."""
        ...

    def finish(self, call_id: str, hostname: str, ttl_seconds: int) -> bool: ...

    def release(self, call_id: str) -> list[Dispatched]: ...

    def cancel(self, call_id: str, ttl_seconds: int) -> tuple[CancelOutcome, str | None]:
        """The outcome, and for a call taken out of its queue its message."""
        ...

    def claimed(self, call_id: str) -> bool:
        """True while a worker holds the call (it is running, not queued)."""
        ...

    def turn_calls(self, turn: str) -> list[str]: ...

    def end_turn(self, turn: str, agents: Iterable[str] = ()) -> None:
        """Forget the turn's calls and its homes (of `agents`), and tell every
        worker (`END_TURN_PREFIX`)."""
        ...

    def heartbeat(
        self, kind: Kind, hostname: str, lanes: Mapping[str, int], ttl_ms: int
    ) -> list[Dispatched]: ...

    def recover(self, kind: Kind) -> tuple[list[Dispatched], list[tuple[str, str]]]:
        """Dispatched again, and (call id, message) of calls done but never released."""
        ...

    def listen_cancels(self, on_cancel: Callable[[str], None]) -> Subscription: ...

    def close(self) -> None: ...
