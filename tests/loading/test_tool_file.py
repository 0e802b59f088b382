"""Seed 000's tool file rules: one invalid case per rule, each naming file and field."""

from __future__ import annotations

import pytest

from broker.constants import BUILTIN_TOOLS
from broker.model import DeclaredTool

from .conftest import ECHO, Tree

TOOL = "guide/tools/echo.toml"
COMMAND = 'command = ["python3", "{package}/tools/echo.py"]\n'


def tool(body: str) -> dict[str, str]:
    return {TOOL: body}


def test_the_valid_tool_loads_with_its_defaults(tree: Tree) -> None:
    echo = tree.load().agent("guide").tool("echo")
    assert isinstance(echo, DeclaredTool)
    assert echo.command == ("python3", "/agent/tools/echo.py")
    assert echo.input == "json-stdin"
    assert echo.scope == "tools:read"
    assert echo.timeout_seconds == 30.0
    assert str(echo.source) == TOOL


def test_parameters_default_to_an_empty_object_schema_fresh_each_time(tree: Tree) -> None:
    tree.write(tool(f'name = "echo"\ndescription = "Echo."\n{COMMAND}'))
    first = tree.load().agent("guide").tool("echo").parameters
    assert first == {"type": "object", "properties": {}}
    first["properties"]["x"] = {}  # type: ignore[index]
    assert tree.load().agent("guide").tool("echo").parameters == {
        "type": "object",
        "properties": {},
    }


def test_timeout_defaults_to_the_agents_tool_timeout(tree: Tree) -> None:
    tree.write(
        {
            "guide/vessel.toml": "tool_timeout_seconds = 7.5\n"
            '[tools]\ndeclared = ["tools/echo.toml"]\n'
        }
    )
    assert tree.load().agent("guide").tool("echo").timeout_seconds == 7.5


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        # name
        (f'description = "d"\n{COMMAND}', "name", "missing"),
        (f'name = "Echo"\ndescription = "d"\n{COMMAND}', "name", "lowercase letters"),
        (f'name = "1echo"\ndescription = "d"\n{COMMAND}', "name", "starting with a letter"),
        (f'name = "echo-it"\ndescription = "d"\n{COMMAND}', "name", "underscores"),
        (f'name = "{"a" * 64}"\ndescription = "d"\n{COMMAND}', "name", "longer than 63"),
        (f'name = 3\ndescription = "d"\n{COMMAND}', "name", "must be a string, not an integer"),
        (f'name = ""\ndescription = "d"\n{COMMAND}', "name", "must not be empty"),
        # description
        (f'name = "echo"\n{COMMAND}', "description", "missing"),
        (f'name = "echo"\ndescription = "  "\n{COMMAND}', "description", "must not be empty"),
        (f'name = "echo"\ndescription = ["d"]\n{COMMAND}', "description", "not a list"),
        # exactly one of command or service
        ('name = "echo"\ndescription = "d"\n', "command", "exactly one of command or service"),
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}service = "records"\npath = "/x"\n',
            "service",
            "not both",
        ),
        # command
        ('name = "echo"\ndescription = "d"\ncommand = []\n', "command", "at least the program"),
        ('name = "echo"\ndescription = "d"\ncommand = "echo hi"\n', "command", "not a string"),
        ('name = "echo"\ndescription = "d"\ncommand = ["echo", 3]\n', "command[1]", "an integer"),
        ('name = "echo"\ndescription = "d"\ncommand = ["echo", ""]\n', "command[1]", "empty"),
        # input
        (f'name = "echo"\ndescription = "d"\n{COMMAND}input = "stdin"\n', "input", "'stdin'"),
        (f'name = "echo"\ndescription = "d"\n{COMMAND}input = true\n', "input", "a boolean"),
        # timeout_seconds
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}timeout_seconds = 0\n',
            "timeout_seconds",
            "positive",
        ),
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}timeout_seconds = -1.5\n',
            "timeout_seconds",
            "positive",
        ),
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}timeout_seconds = true\n',
            "timeout_seconds",
            "must be a number, not a boolean",
        ),
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}timeout_seconds = "5"\n',
            "timeout_seconds",
            "not a string",
        ),
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}timeout_seconds = inf\n',
            "timeout_seconds",
            "positive",
        ),
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}timeout_seconds = nan\n',
            "timeout_seconds",
            "positive",
        ),
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}timeout_seconds = 1e9\n',
            "timeout_seconds",
            "at most",
        ),
        # scope
        (f'name = "echo"\ndescription = "d"\n{COMMAND}scope = ""\n', "scope", "must not be empty"),
        (f'name = "echo"\ndescription = "d"\n{COMMAND}scope = 1\n', "scope", "an integer"),
        # unknown keys, named, with a suggestion
        (f'name = "echo"\ndescription = "d"\n{COMMAND}timeout = 5\n', "timeout", "unknown key"),
        (
            f'name = "echo"\ndescription = "d"\n{COMMAND}scopes = "x"\n',
            "scopes",
            "did you mean 'scope'",
        ),
        (f'name = "echo"\ndescription = "d"\n{COMMAND}path = "/x"\n', "path", "service tools only"),
    ],
)
def test_an_invalid_tool_file_is_refused(tree: Tree, body: str, field: str, fragment: str) -> None:
    tree.expect(tool(body), TOOL, field, fragment)


@pytest.mark.parametrize("builtin", sorted(BUILTIN_TOOLS))
def test_a_tool_may_not_take_a_builtin_name(tree: Tree, builtin: str) -> None:
    body = ECHO.replace('name = "echo"', f'name = "{builtin}"')
    tree.expect(tool(body), TOOL, "name", f"{builtin!r} is the name of a built-in tool")


def test_a_63_character_name_is_accepted(tree: Tree) -> None:
    name = "a" * 63
    tree.write(tool(ECHO.replace('name = "echo"', f'name = "{name}"')))
    assert name in tree.load().agent("guide").tools


def test_two_tools_of_one_agent_may_not_share_a_name(tree: Tree) -> None:
    tree.write(
        {
            "guide/vessel.toml": '[tools]\ndeclared = ["tools/echo.toml", "tools/again.toml"]\n',
            "guide/tools/again.toml": ECHO,
        }
    )
    [line] = tree.problems()
    assert line == (
        "guide/tools/again.toml: name: 'echo' is already the name of the tool in "
        "guide/tools/echo.toml"
    )


def test_tools_of_different_agents_may_share_a_name(tree: Tree) -> None:
    tree.write(
        {
            "records/vessel.toml": '[tools]\ndeclared = ["tools/echo.toml"]\n',
            "records/tools/echo.toml": ECHO,
            "deployment.toml": '[[agents]]\nid = "guide"\npackage = "guide"\n'
            '[[agents]]\nid = "records"\npackage = "records"\n',
        }
    )
    deployment = tree.load()
    assert list(deployment.agent("records").tools) == list(deployment.agent("guide").tools)


def test_package_placeholder_is_replaced_in_every_word(tree: Tree) -> None:
    body = ECHO.replace(COMMAND, 'command = ["{package}/bin/run", "--root={package}", "plain"]\n')
    tree.write(tool(body))
    echo = tree.load().agent("guide").tool("echo")
    assert isinstance(echo, DeclaredTool)
    assert echo.command == ("/agent/bin/run", "--root=/agent", "plain")


def test_a_tool_file_with_several_mistakes_reports_each(tree: Tree) -> None:
    tree.write(tool('name = "Bad"\ncommand = []\ninput = "x"\ncolour = "red"\n'))
    fields = [line.split(": ")[1] for line in tree.problems()]
    assert sorted(fields) == ["colour", "command", "description", "input", "name"]
