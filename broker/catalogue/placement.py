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

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import compress, filterfalse, islice
from operator import attrgetter
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
    """An agent's tools placed. The list is built at once; every tool's state, and
    the searchable tools, when first asked for (`states`, `searchable`)."""

    agent: Agent
    #: What the model is given, built-ins excepted: pinned, always listed, the rest.
    listed: tuple[str, ...]
    #: Pinned and always-listed tools the agent may use: listed past the limit too.
    fixed: int
    #: True when anything available is not listed: search_tools and call_tool end the list.
    with_builtins: bool

    def states(self) -> dict[str, tuple[State, str]]:
        """name -> (state, reason) for every tool of the agent, in the order of all tools."""
        access, shown = self.agent.access, set(self.listed)
        found: dict[str, tuple[State, str]] = {}
        for name, tool in self.agent.tools.items():
            if access.refusal(name) is not None:
                found[name] = ("denied", DENIED)
            elif name in access.pin:
                found[name] = ("listed", PINNED)
            elif tool.always_listed:
                found[name] = ("listed", ALWAYS)
            elif tool.deferred:
                found[name] = ("searchable", DEFERRED)
            elif name in shown:
                found[name] = ("listed", LISTED)
            else:
                found[name] = ("searchable", OVER)
        return found

    def searchable(self) -> list[str]:
        """Available but not listed (deferred, or past the limit), in the order of all
        tools: what search_tools ranks, ties in this order."""
        return [name for name, (state, _) in self.states().items() if state == "searchable"]


def place(agent: Agent) -> Placement:
    """The list of `agent` by its access, flags and `max_listed_tools`.

    No Python code runs per tool: each pass over the tools is a C loop
    (`compress`, `filter`, set operations), and the rest of the list is read
    only as far as its places go, so 10,000 tools take a few milliseconds
    (bench/catalogue.py).
    """
    access, tools = agent.access, agent.tools
    deny, pin, allowed = access.deny, access.pin, access.tools
    always_all = list(compress(tools, map(attrgetter("always_listed"), tools.values())))
    deferred_all = set(compress(tools, map(attrgetter("deferred"), tools.values())))

    def usable(name: str) -> bool:
        return name not in deny and (allowed is None or name in allowed)

    pinned = [n for n in filter(pin.__contains__, tools) if usable(n)] if pin else []
    always = [n for n in always_all if n not in pin and usable(n)]
    deferred = deferred_all - deny - pin
    if allowed is not None:
        deferred &= allowed
        available = len(allowed - deny)
    else:
        available = len(tools) - sum(1 for name in deny if name in tools)
    fixed = len(pinned) + len(always)
    others = available - fixed - len(deferred)
    limit = access.max_listed_tools
    room = max(limit - fixed - 2, 0) if deferred or fixed + others > limit else others
    excluded = deferred_all.union(deny, pin, always_all)
    rest: Iterator[str] = filterfalse(excluded.__contains__, tools)
    if allowed is not None:
        rest = filter(allowed.__contains__, rest)
    return Placement(
        agent=agent,
        listed=(*pinned, *always, *islice(rest, room)),
        fixed=fixed,
        with_builtins=bool(deferred) or others > room,
    )
