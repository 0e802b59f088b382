"""An agent's `[agents.access]` and `max_listed_tools` in deployment.toml.

    [[agents]]
    id = "field-guide"
    package = "agents/field-guide"
    max_listed_tools = 128               # default; the rest go behind search_tools
    [agents.access]                      # (max_listed_tools may be set here instead)
    tools = "all"                        # default; or a list of final names
    deny = ["weather__get_forecast"]     # neither listed, searchable nor callable
    pin = ["notes__save_note"]           # always listed; a pin overrides deferred

Every name is a final name of one of the agent's tools (`<slug>__<key>` for
a plugin's); one that matches nothing is a problem with a "did you mean". A
pin or deny naming a tool outside a `tools` list is a problem too: the tool
is not the agent's to pin or deny.
"""

from __future__ import annotations

from collections.abc import Collection

from broker.catalogue.names import did_you_mean
from broker.constants import DEFAULT_MAX_LISTED_TOOLS
from broker.loading.fields import Table, field_path, type_name
from broker.loading.limits import MAX_LISTED_TOOLS, MIN_LISTED_TOOLS
from broker.model import Access, Agent

__all__ = ["ACCESS_KEYS", "read_access"]

#: `max_listed_tools` is read in `[agents.access]` too (it decides the list as
#: much as the rest), but set in one place only.
ACCESS_KEYS = frozenset({"tools", "deny", "pin", "max_listed_tools"})
_LIMIT = "max_listed_tools"


def _read_limit(owner: Table) -> int | None:
    limit = owner.positive_int(_LIMIT, default=DEFAULT_MAX_LISTED_TOOLS, maximum=MAX_LISTED_TOOLS)
    if limit is not None and limit < MIN_LISTED_TOOLS:
        owner.problem(
            _LIMIT,
            f"must be at least {MIN_LISTED_TOOLS}, not {limit}: search_tools and call_tool "
            "take the last two places when some tools are not listed",
        )
        return None
    return limit


def read_access(table: Table, agent: Agent) -> Access | None:
    """`agent`'s access from its `[[agents]]` table; None (problems added) when wrong."""
    found = len(table.problems)
    sub = table.table("access", keys=ACCESS_KEYS) if table.has("access") else None
    if sub is not None and sub.has(_LIMIT) and table.has(_LIMIT):
        sub.problem(_LIMIT, f"is set in {table.field(_LIMIT)} too: set it in one place")
        return None
    limit = _read_limit(sub if sub is not None and sub.has(_LIMIT) else table)
    if len(table.problems) > found or limit is None:
        return None
    if sub is None:
        return Access(max_listed_tools=limit)
    tools = _read_tools(sub, agent)
    within = agent.tools if tools is None else tools
    deny = _read_names(sub, "deny", agent, within, limited=tools is not None)
    pin = _read_names(sub, "pin", agent, within, limited=tools is not None)
    if len(table.problems) > found or deny is None or pin is None:
        return None
    return Access(
        tools=None if tools is None else frozenset(tools),
        deny=frozenset(deny),
        pin=frozenset(pin),
        max_listed_tools=limit,
    )


def _read_tools(sub: Table, agent: Agent) -> list[str] | None:
    """The `tools` list; None for "all" (the default) or when it is wrong."""
    value = sub.data.get("tools", "all")
    if value == "all":
        return None
    if not isinstance(value, list):
        sub.problem("tools", f'must be "all" or a list of tool names, not {type_name(value)}')
        return None
    return _read_names(sub, "tools", agent, agent.tools, limited=False)


def _read_names(
    sub: Table, key: str, agent: Agent, within: Collection[str], *, limited: bool
) -> list[str] | None:
    """The names under `key` ([] when absent), each a tool of `agent` within `within`."""
    if not sub.has(key):
        return []
    names = sub.list_of_strings(key)
    if names is None:
        return None
    found = len(sub.problems)
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        where = field_path(sub.field(key), index)
        if name in seen:
            sub.problems.add(
                sub.file, where, f"{name!r} is listed twice (also {key}[{seen[name]}])"
            )
        elif name not in agent.tools:
            hint = did_you_mean(name, agent.tools)
            sub.problems.add(sub.file, where, f"agent {agent.id!r} has no tool {name!r}{hint}")
        elif limited and name not in within:
            done = "pinned" if key == "pin" else "denied"
            sub.problems.add(
                sub.file,
                where,
                f"{name!r} is not in {sub.field('tools')}: only the agent's tools can be {done}",
            )
        seen.setdefault(name, index)
    return names if len(sub.problems) == found else None
