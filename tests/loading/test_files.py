"""Files that cannot be read: each is one problem naming the file, never a traceback."""

from __future__ import annotations

import pytest

from broker.errors import InvalidDeployment
from broker.loading import load_deployment

from .conftest import Tree


def test_a_missing_deployment_file_is_a_problem(tree: Tree) -> None:
    assert tree.problems("nowhere.toml") == ["nowhere.toml: (file): no such file"]


def test_a_folder_given_as_the_deployment_is_a_problem(tree: Tree) -> None:
    assert tree.problems("guide") == ["guide: (file): is a folder, not a file"]


def test_broken_toml_names_line_and_column(tree: Tree) -> None:
    line = tree.only_problem({"guide/tools/echo.toml": 'name = "echo"\ndescription "x"\n'})
    assert line.startswith("guide/tools/echo.toml: (file): invalid TOML: ")
    assert "line 2, column 13" in line


def test_a_repeated_key_is_broken_toml(tree: Tree) -> None:
    line = tree.only_problem({"records/vessel.toml": "workdir = '/a'\nworkdir = '/b'\n"})
    assert line.startswith("records/vessel.toml: (file): invalid TOML: ")
    assert "line 2" in line


def test_broken_toml_in_the_deployment_file(tree: Tree) -> None:
    line = tree.only_problem({"deployment.toml": "[[agents]\n"})
    assert line.startswith("deployment.toml: (file): invalid TOML: ")
    assert "line 1" in line


def test_a_file_that_is_not_utf8_is_a_problem(tree: Tree) -> None:
    line = tree.only_problem({"guide/tools/echo.toml": b'name = "\xe9cho"\n'})
    assert line == "guide/tools/echo.toml: (file): is not UTF-8 text (byte 0xe9 at offset 8)"


def test_a_huge_file_is_refused_unread(tree: Tree) -> None:
    line = tree.only_problem({"guide/vessel.toml": "# " + "x" * (5 * 1024 * 1024) + "\n"})
    assert line.startswith("guide/vessel.toml: (file): is larger than")


def test_deeply_nested_toml_is_a_problem_not_a_crash(tree: Tree) -> None:
    nested = "p = " + "[" * 100_000 + "]" * 100_000 + "\n"
    line = tree.only_problem({"guide/tools/echo.toml": nested})
    assert line == "guide/tools/echo.toml: (file): invalid TOML: nested too deeply"


def test_a_missing_vessel_toml_is_named_at_the_package_field(tree: Tree) -> None:
    line = tree.only_problem({"guide/vessel.toml": None})
    assert line == "deployment.toml: agents[0].package: 'guide' has no vessel.toml"


def test_load_deployment_raises_with_every_problem(tree: Tree) -> None:
    tree.write({"guide/tools/echo.toml": 'name = "Echo"\n'})
    with pytest.raises(InvalidDeployment) as caught:
        load_deployment("deployment.toml")
    lines = [str(p) for p in caught.value.problems]
    assert lines == [
        "guide/tools/echo.toml: name: 'Echo' is not lowercase letters, digits and "
        "underscores starting with a letter",
        "guide/tools/echo.toml: description: missing: this key is required",
        "guide/tools/echo.toml: command: missing: a tool sets exactly one of command or service",
    ]
    assert str(caught.value) == "\n".join(lines)


def test_paths_are_shown_as_reached_from_the_working_directory(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.write({"guide/tools/echo.toml": 'name = "echo"\n'})
    monkeypatch.chdir(tree.root / "guide")
    [first, *_] = tree.problems("../deployment.toml")
    assert first.startswith("../guide/tools/echo.toml: description: ")
