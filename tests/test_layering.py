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
