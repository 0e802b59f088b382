"""The tool catalogue: which tools each agent's model is given, and how it finds the rest.

    Catalogue.of(deployment).listed(agent)    the list the model is given
    Catalogue.of(deployment).states(agent)    every tool: listed, searchable or denied, and why
    Catalogue.of(deployment).search(agent, query, limit)
    route_call(deployment, agent, tool, args) search_tools answered, call_tool made the real call
    catalogue_warnings(deployment)            what `check` warns about

Modules: `names` (final names, "did you mean"), `placement` (the list's
rules), `search` (the BM25 index), `builtins` (search_tools, call_tool),
`calls` (the two built-ins at submit), `warnings`.
"""

from __future__ import annotations

from broker.catalogue.builtins import CALL_TOOL, CATALOGUE_TOOLS, SEARCH_TOOLS
from broker.catalogue.calls import Answer, Route, route_call
from broker.catalogue.catalogue import AgentCatalogue, Catalogue
from broker.catalogue.warnings import catalogue_warnings

__all__ = [
    "CALL_TOOL",
    "CATALOGUE_TOOLS",
    "SEARCH_TOOLS",
    "AgentCatalogue",
    "Answer",
    "Catalogue",
    "Route",
    "catalogue_warnings",
    "route_call",
]
