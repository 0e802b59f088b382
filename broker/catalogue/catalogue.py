"""The catalogue of a loaded deployment: per agent, its list, its states and its search.

    catalogue = Catalogue.of(deployment)      # one per deployment load, kept
    catalogue.listed("field-guide")           # the list the model is given
    catalogue.states("field-guide")           # every tool: listed, searchable or denied
    catalogue.search("field-guide", "weather forecast", limit=5)

An agent's placement and search index are built on first use and kept with
the deployment, so a list or a search costs no rebuild.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, ClassVar

from broker.catalogue.builtins import builtin_listing
from broker.catalogue.placement import Placement, place
from broker.catalogue.search import SearchIndex, tool_words
from broker.model import Agent, Deployment, PluginTool, Tool

__all__ = ["AgentCatalogue", "Catalogue"]

#: Deployments whose catalogue is kept (a process loads one, tests a few).
_KEPT = 16


def _permissions(tool: Tool) -> list[str]:
    """A plugin tool's derived permissions; a declared or service tool's scope."""
    return list(tool.permissions) if isinstance(tool, PluginTool) else [tool.scope]


class AgentCatalogue:
    """One agent's tools placed, its list built, its searchable tools indexed."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.placement: Placement = place(agent)
        listing = [agent.tools[name].listing() for name in self.placement.listed]
        if self.placement.with_builtins:
            listing += builtin_listing()
        self._listing = listing
        self._index: SearchIndex | None = None
        self._searchable: list[str] = []
        self._lock = threading.Lock()

    def listed(self) -> list[dict[str, Any]]:
        """The list the model is given: `{name, description, parameters}` entries."""
        return [{**entry, "parameters": dict(entry["parameters"])} for entry in self._listing]

    def states(self) -> list[dict[str, Any]]:
        """`{name, state, reason, permissions}` for every tool of the agent, in order."""
        tools = self.agent.tools
        return [
            {
                "name": name,
                "state": state,
                "reason": reason,
                "permissions": _permissions(tools[name]),
            }
            for name, (state, reason) in self.placement.states().items()
        ]

    def index(self) -> SearchIndex:
        """The search index of the agent's searchable tools (built once)."""
        with self._lock:
            if self._index is None:
                tools = self.agent.tools
                self._searchable = self.placement.searchable()
                self._index = SearchIndex(
                    [
                        tool_words(name, tools[name].description, tools[name].parameters)
                        for name in self._searchable
                    ]
                )
            return self._index

    def searchable(self) -> list[str]:
        """The names search_tools ranks, in the order of all tools."""
        self.index()
        return list(self._searchable)

    def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        """The best `limit` searchable tools for `query` (`[]`: none matches)."""
        found = self.index().search(query, limit)
        searchable, tools = self._searchable, self.agent.tools
        return [tools[searchable[p]].listing() for p in found]

    def suggest(self, query: str) -> list[str]:
        """Words the searchable tools hold that are close to the query's."""
        return self.index().suggest(query)


class Catalogue:
    """The catalogue of one loaded deployment (`Catalogue.of` keeps one per load)."""

    _kept: ClassVar[OrderedDict[int, tuple[Deployment, Catalogue]]] = OrderedDict()
    _kept_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self._agents: dict[str, AgentCatalogue] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, deployment: Deployment) -> Catalogue:
        """The catalogue of `deployment`, built once for this loaded deployment."""
        key = id(deployment)
        with cls._kept_lock:
            kept = cls._kept.get(key)
            # The deployment is held with its catalogue, so its id is not reused meanwhile.
            if kept is not None and kept[0] is deployment:
                cls._kept.move_to_end(key)
                return kept[1]
            catalogue = cls(deployment)
            cls._kept[key] = (deployment, catalogue)
            while len(cls._kept) > _KEPT:
                cls._kept.popitem(last=False)
            return catalogue

    def agent(self, agent_id: str) -> AgentCatalogue:
        """The agent's catalogue; UnknownAgent for an agent the deployment lacks."""
        with self._lock:
            found = self._agents.get(agent_id)
            if found is None:
                found = self._agents[agent_id] = AgentCatalogue(self.deployment.agent(agent_id))
            return found

    def listed(self, agent_id: str) -> list[dict[str, Any]]:
        return self.agent(agent_id).listed()

    def states(self, agent_id: str) -> list[dict[str, Any]]:
        return self.agent(agent_id).states()

    def search(self, agent_id: str, query: str, limit: int) -> list[dict[str, Any]]:
        return self.agent(agent_id).search(query, limit)
