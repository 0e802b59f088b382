"""`call_tool` refusals, answered at submit without a worker: a name the agent cannot
call is an error result telling the model to use search_tools.

A call_tool that runs its tool goes through real workers: test_cluster.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import REPO, Published, cli, embedded_env

OWNER = "app/tester"
USE_SEARCH = (
    "call_tool: there is no tool {name!r} you can call. Use search_tools to find the tool you "
    "need, then call call_tool with the exact name it returns."
)


def _call_tool(client: Any, agent: str, arguments: Any) -> Any:
    return client.call(agent, "call_tool", arguments, owner=OWNER, timeout=10)


@pytest.mark.parametrize(
    ("agent", "name"),
    [
        ("crew", "no_such_tool"),
        ("crew", "todo_add"),  # denied
        ("crew", "weather__air_quality"),  # a denied plugin tool
        ("few", "shout"),  # outside the agent's tools list
        ("crew", "call_tool"),  # not itself
        ("crew", "web_search"),  # a built-in this catalogue does not run
    ],
)
def test_a_name_the_agent_cannot_call_gets_an_error_naming_search_tools(
    client: Any, agent: str, name: str
) -> None:
    result = _call_tool(client, agent, {"name": name, "arguments": {}})
    assert (result.is_error, result.outcome, result.tool) == (True, "refused", "call_tool")
    assert result.output == USE_SEARCH.format(name=name)


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ('"weather__tide_tables"', "call_tool: the arguments must be a JSON object"),
        ({"arguments": {}}, 'call_tool: "name" must be the name of a tool'),
        ({"name": 3}, 'call_tool: "name" must be the name of a tool'),
        ({"name": "shout", "arguments": [1]}, 'call_tool: "arguments" must be a JSON object'),
    ],
)
def test_bad_call_tool_arguments_are_refused(client: Any, arguments: Any, says: str) -> None:
    result = _call_tool(client, "crew", arguments)
    assert (result.is_error, result.outcome, result.tool) == (True, "refused", "call_tool")
    assert result.output.startswith(says), result.output
    assert "call call_tool again with" in result.output


def test_call_tool_can_run_search_tools(client: Any) -> None:
    result = _call_tool(
        client, "crew", {"name": "search_tools", "arguments": {"query": "tide harbour"}}
    )
    assert (result.is_error, result.tool) == (False, "search_tools")
    assert json.loads(result.output)[0]["name"] == "weather__tide_tables"


def test_the_command_line_refuses_an_unknown_name_with_exit_2(published: Published) -> None:
    done = cli(
        "call",
        "-d",
        str(published.path),
        "crew",
        "call_tool",
        '{"name": "todo_add", "arguments": {}}',
        cwd=REPO,
        env=embedded_env(),
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == USE_SEARCH.format(name="todo_add")
