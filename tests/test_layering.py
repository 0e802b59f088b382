"""The enqueue side never imports the execution side: a platform's client host
installs `broker/` and needs nothing of the workers (no sandbox, no JS runtime)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_broker_imports_nothing_from_workers() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(
            name for name in _imported_modules(path) if name.split(".")[0] == "workers"
        )
        for path in sorted((REPO / "broker").rglob("*.py"))
    }
    assert {file: names for file, names in offenders.items() if names} == {}


#: Where the two sides meet on purpose: the command line, the MCP server and the
#: embedded default drive a client, like a platform does; a plugin worker's
#: host.workspace sends workspace operations to the turn's home host as
#: `client.files` does.
_CLIENT_USERS = (
    "workers/commands/",
    "workers/mcp/",
    "workers/embedded.py",
    "workers/plugin/host/routed.py",
)


def test_the_worker_never_imports_the_client() -> None:
    """What a worker runs (tasks, the worker process, the runners) reaches the
    broker through admission and the protocol (`broker.admission`,
    `broker.protocol`), never through the platform's client."""
    offenders = {
        name: sorted(
            found for found in _imported_modules(path) if found.startswith("broker.client")
        )
        for path in sorted((REPO / "workers").rglob("*.py"))
        if not (name := str(path.relative_to(REPO))).startswith(_CLIENT_USERS)
    }
    assert {file: names for file, names in offenders.items() if names} == {}


def test_the_client_users_are_where_the_rule_says() -> None:
    """The exemptions above name real places (a renamed one would exempt nothing)."""
    for place in _CLIENT_USERS:
        assert (REPO / place).exists(), place
