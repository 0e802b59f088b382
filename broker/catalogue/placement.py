"""Where each of an agent's tools goes: in the list the model is given, behind
`search_tools`, or nowhere (denied).

The order of all tools is the agent's package tools in `[tools] declared`
order, then each plugin's in `[[plugins]]` order, in registration order (the
order of `Agent.tools`). Precedence: deny > pin > always listed > the rest.

The list holds the pinned tools (a pin overrides `deferred`), then the
always-listed ones, then the rest in that order up to `max_listed_tools`;
a deferred tool is never listed unless pinned. When anything available is
not listed, `search_tools` and `call_tool` take the last two places of the
limit. Pinned and always-listed tools are listed even past the limit
(`check` warns). Everything here is a function of the deployment alone, so
the same deployment always gives the same list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from broker.model import Agent

__all__ = [
    "ALWAYS",
    "DEFERRED",
    "DENIED",
    "LISTED",
    "OVER",
    "PINNED",
    "Placement",
    "State",
    "place",
]

State = Literal["listed", "searchable", "denied"]

#: The reasons `vessel-workers tools --all` gives.
PINNED = "pinned"
ALWAYS = "always listed"
DEFERRED = "deferred"
OVER = "over the limit"
DENIED = "denied"
LISTED = "listed"


@dataclass(frozen=True, slots=True)
class Placement:
    """An agent's tools placed: final names, each list in the order of all tools."""

    #: What the model is given, built-ins excepted: pinned, always listed, the rest.
    listed: tuple[str, ...]
    #: Available but not listed (deferred, or past the limit): what search_tools ranks.
    searchable: tuple[str, ...]
    #: name -> (state, reason), for every tool of the agent in the order of all tools.
    states: dict[str, tuple[State, str]]
    #: True when `search_tools` and `call_tool` end the list.
    with_builtins: bool


def place(agent: Agent) -> Placement:
    """Place every tool of `agent` by its access, flags and `max_listed_tools`."""
    access = agent.access
    limit = access.max_listed_tools
    pinned: list[str] = []
    always: list[str] = []
    rest: list[str] = []
    reasons: dict[str, str] = {}
    for name, tool in agent.tools.items():
        if access.refusal(name) is not None:
            reasons[name] = DENIED
        elif name in access.pin:
            pinned.append(name)
            reasons[name] = PINNED
        elif tool.always_listed:
            always.append(name)
            reasons[name] = ALWAYS
        elif tool.deferred:
            reasons[name] = DEFERRED
        else:
            rest.append(name)
            reasons[name] = LISTED
    fixed = len(pinned) + len(always)
    deferred = len(reasons) - fixed - len(rest) - sum(r == DENIED for r in reasons.values())
    with_builtins = deferred > 0 or fixed + len(rest) > limit
    room = max(limit - fixed - 2, 0) if with_builtins else len(rest)
    for name in rest[room:]:
        reasons[name] = OVER
    states: dict[str, tuple[State, str]] = {}
    for name, reason in reasons.items():
        if reason == DENIED:
            states[name] = ("denied", reason)
        elif reason in (DEFERRED, OVER):
            states[name] = ("searchable", reason)
        else:
            states[name] = ("listed", reason)
    return Placement(
        listed=(*pinned, *always, *rest[:room]),
        searchable=tuple(n for n, r in reasons.items() if r in (DEFERRED, OVER)),
        states=states,
        with_builtins=with_builtins,
    )
