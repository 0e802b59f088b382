"""What `check` warns about in a valid deployment's catalogue (the check still passes).

- a final name over 64 characters: the model APIs refuse it, so the tool
  cannot be given to a model by that name;
- an agent whose pinned and always-listed tools (with `search_tools` and
  `call_tool` when some tools are hidden) make its list longer than its
  `max_listed_tools`: they are listed all the same.
"""

from __future__ import annotations

from broker.catalogue.catalogue import Catalogue
from broker.catalogue.names import MODEL_NAME_LIMIT
from broker.model import Deployment

__all__ = ["catalogue_warnings"]


def catalogue_warnings(deployment: Deployment) -> list[str]:
    """`FILE: FIELD: warning: ...` lines, in deployment order."""
    lines: list[str] = []
    named: set[str] = set()
    catalogue = Catalogue.of(deployment)
    for index, (agent_id, agent) in enumerate(deployment.agents.items()):
        for name, tool in agent.tools.items():
            if len(name) > MODEL_NAME_LIMIT and name not in named:
                named.add(name)
                lines.append(
                    f"{tool.source}: name: warning: the final name {name!r} has {len(name)} "
                    f"characters; the model APIs refuse names over {MODEL_NAME_LIMIT}"
                )
        entry = catalogue.agent(agent_id)
        size = len(entry.listed())
        limit = agent.access.max_listed_tools
        if size > limit:
            kept = entry.placement.fixed
            lines.append(
                f"{deployment.path}: agents[{index}].max_listed_tools: warning: agent "
                f"{agent_id!r} is given {size} tools, more than its max_listed_tools {limit}: "
                f"its {kept} pinned and always-listed tools are listed past the limit"
            )
    return lines
