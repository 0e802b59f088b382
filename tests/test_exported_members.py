"""Every public module of `broker` and `workers` declares its public surface in `__all__`.

Complete both ways: each public name a module defines at its top level is in
`__all__`, and each name in `__all__` exists. Modules are found by walking the
packages, so a module added later is checked without editing this file.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import pkgutil
from types import ModuleType

import pytest

import broker
import workers


def _public_modules() -> list[str]:
    names = [package.__name__ for package in (broker, workers)]
    for package in (broker, workers):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.append(info.name)
    return sorted(names)


def _defined_names(module: ModuleType) -> set[str]:
    """Public names the module's own source binds at top level (imports excluded)."""
    tree = ast.parse(inspect.getsource(module))
    names: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(
                node.target, ast.Name
            ):
                names.add(node.target.id)
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
                if isinstance(node, ast.Try):
                    for handler in node.handlers:
                        visit(handler.body)
                    visit(node.finalbody)

    visit(tree.body)
    return {name for name in names if not name.startswith("_")}


@pytest.mark.parametrize("name", _public_modules())
def test_all_is_complete(name: str) -> None:
    module = importlib.import_module(name)
    # A stale editable install (made before the package had an __init__.py)
    # imports it as a namespace package: its __init__.py never runs.
    assert getattr(module, "__file__", None), (
        f"{name} is imported as a namespace package: reinstall with `pip install -e .`"
    )
    # A module's logger is plumbing, not surface: it need not be exported.
    defined = {
        n
        for n in _defined_names(module)
        if not isinstance(getattr(module, n, None), logging.Logger)
    }
    exported = getattr(module, "__all__", None)
    if exported is None:
        assert not defined, f"{name} defines {sorted(defined)} but has no __all__"
        return
    assert isinstance(exported, list | tuple), f"{name}.__all__ is not a list"
    missing = sorted(defined - set(exported))
    assert not missing, f"{name}: public names missing from __all__: {missing}"
    absent = sorted(n for n in exported if not hasattr(module, n))
    assert not absent, f"{name}: __all__ names what the module does not have: {absent}"
    repeated = sorted({n for n in exported if list(exported).count(n) > 1})
    assert not repeated, f"{name}: __all__ repeats {repeated}"


def test_the_walk_finds_the_modules() -> None:
    modules = _public_modules()
    assert "broker.loading" in modules
    assert "broker.loading.fields" in modules
    assert "workers.commands.check" in modules
