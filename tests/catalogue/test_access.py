"""`[agents.access]`, `max_listed_tools` and the tool files' flags: every wrong value is a
problem naming its file and field, with a "did you mean" for a name that matches nothing.

Each test changes one thing in a copy of the published deployment (the plugins'
locks stay valid: their sources do not change).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.errors import UnknownTool
from broker.loading import check_deployment, load_deployment

from .conftest import DEPLOYMENT, REPO, Published, cli, copy_tree


def _problems(published: Published, tmp_path: Path, old: str, new: str) -> list[str]:
    path = copy_tree(published, tmp_path)
    assert old in DEPLOYMENT
    path.write_text(DEPLOYMENT.replace(old, new, 1))
    return [str(p) for p in check_deployment(path)]


def _only(published: Published, tmp_path: Path, old: str, new: str) -> str:
    problems = _problems(published, tmp_path, old, new)
    assert len(problems) == 1, problems
    return problems[0].split(": ", 1)[1]


def test_a_name_that_matches_nothing_gets_a_did_you_mean(
    published: Published, tmp_path: Path
) -> None:
    line = _only(published, tmp_path, '"weather__air_quality"', '"weather__air_qualty"')
    assert line == (
        "agents[0].access.deny[0]: agent 'crew' has no tool 'weather__air_qualty'; "
        "did you mean 'weather__air_quality'?"
    )


def test_a_plugin_tool_named_without_its_slug_is_matched_to_its_final_name(
    published: Published, tmp_path: Path
) -> None:
    line = _only(published, tmp_path, '"maps__traffic_report"', '"traffic_report"')
    assert line.endswith(
        "agents[0].access.pin[1]: agent 'crew' has no tool 'traffic_report'; "
        "did you mean 'maps__traffic_report'?"
    )


def test_a_tools_list_name_that_matches_nothing_is_a_problem(
    published: Published, tmp_path: Path
) -> None:
    line = _only(published, tmp_path, '"calc", "weather', '"calculator", "weather')
    assert line.startswith("agents[2].access.tools[1]: agent 'few' has no tool 'calculator'")
    assert "did you mean 'calc'?" in line


def test_a_pin_or_deny_outside_the_tools_list_is_a_problem(
    published: Published, tmp_path: Path
) -> None:
    new = 'tools = ["echo", "calc"]\npin = ["shout"]\ndeny = ["todo_add"]\n'
    problems = _problems(published, tmp_path, 'tools = ["echo", "calc", ', new + "#")
    messages = sorted(p.split(": ", 1)[1] for p in problems)
    assert messages == [
        "agents[2].access.deny[0]: 'todo_add' is not in agents[2].access.tools: only the "
        "agent's tools can be denied",
        "agents[2].access.pin[0]: 'shout' is not in agents[2].access.tools: only the "
        "agent's tools can be pinned",
    ]


def test_tools_is_all_or_a_list(published: Published, tmp_path: Path) -> None:
    line = _only(published, tmp_path, 'tools = ["echo", "calc", ', 'tools = "some"\n#')
    assert line == 'agents[2].access.tools: must be "all" or a list of tool names, not a string'


def test_tools_all_is_the_default(published: Published, tmp_path: Path) -> None:
    assert _problems(published, tmp_path, 'tools = ["echo", "calc", ', 'tools = "all"\n#') == []


def test_a_name_listed_twice_is_a_problem(published: Published, tmp_path: Path) -> None:
    line = _only(published, tmp_path, '"todo_add"]', '"todo_add", "todo_add"]')
    assert line == "agents[0].access.deny[3]: 'todo_add' is listed twice (also deny[2])"


def test_an_unknown_access_key_is_a_problem(published: Published, tmp_path: Path) -> None:
    line = _only(published, tmp_path, "deny = [", "denied = [")
    assert line.startswith(
        "agents[0].access.denied: unknown key (known keys: deny, max_listed_tools, pin, tools)"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1", "must be at least 2, not 1: search_tools and call_tool take the last two places"),
        ("0", "must be a positive integer, not 0"),
        ('"many"', "must be an integer, not a string"),
    ],
)
def test_max_listed_tools_is_an_integer_of_2_or_more(
    published: Published, tmp_path: Path, value: str, message: str
) -> None:
    line = _only(published, tmp_path, "max_listed_tools = 12", f"max_listed_tools = {value}")
    assert line.startswith(f"agents[0].max_listed_tools: {message}"), line


def _tool_problem(published: Published, tmp_path: Path, tool: str, extra: str) -> list[str]:
    path = copy_tree(published, tmp_path)
    file = path.parent / "crew" / "tools" / f"{tool}.toml"
    text = file.read_text()
    head, _, rest = text.partition("[parameters]")
    file.write_text(head + extra + "[parameters]" + rest)
    return [str(p) for p in check_deployment(path)]


def test_a_tool_file_cannot_be_both_deferred_and_always_listed(
    published: Published, tmp_path: Path
) -> None:
    problems = _tool_problem(published, tmp_path, "notes_search", "always_listed = true\n")
    assert len(problems) == 1, problems
    assert problems[0].endswith(
        "crew/tools/notes_search.toml: always_listed: a tool sets at most one of deferred and "
        "always_listed: it cannot be both kept out of the list and always in it"
    )


def test_a_flag_is_a_boolean(published: Published, tmp_path: Path) -> None:
    problems = _tool_problem(published, tmp_path, "echo", 'deferred = "yes"\n')
    assert len(problems) == 1 and problems[0].endswith(
        "echo.toml: deferred: must be true or false, not a string"
    )


def test_a_package_has_at_most_3_always_listed_tools(published: Published, tmp_path: Path) -> None:
    path = copy_tree(published, tmp_path)
    for tool in ("echo", "calc", "shout"):
        file = path.parent / "crew" / "tools" / f"{tool}.toml"
        file.write_text(
            file.read_text().replace("[parameters]", "always_listed = true\n[parameters]")
        )
    problems = [str(p) for p in check_deployment(path)]
    assert len(problems) == 1, problems
    assert problems[0].endswith(
        "crew/tools/shout.toml: always_listed: a package may have at most 3 always_listed tools "
        "(already: echo, notes_save, calc)"
    )


def test_a_denied_tool_cannot_be_called_directly(published: Published) -> None:
    agent = load_deployment(published.path).agent("crew")
    with pytest.raises(
        UnknownTool, match=re.escape("may not call tool 'todo_add': [agents.access] deny")
    ):
        agent.tool("todo_add")
    few = load_deployment(published.path).agent("few")
    with pytest.raises(UnknownTool, match=re.escape("it is not in [agents.access] tools")):
        few.tool("shout")
    assert few.tool("echo").name == "echo"
    # Unlisted but available: callable by its final name.
    assert agent.tool("shout").name == "shout"


def test_the_cli_refuses_a_direct_call_of_a_denied_tool(published: Published) -> None:
    done = cli("call", "-d", str(published.path), "crew", "todo_add", "{}", cwd=REPO)
    assert done.returncode == 2
    assert "may not call tool 'todo_add'" in done.stderr


def test_an_agent_without_access_has_every_tool(published: Published) -> None:
    agent = load_deployment(published.path).agent("open")
    assert agent.access.tools is None and not agent.access.deny and not agent.access.pin
    assert agent.access.max_listed_tools == 128


def test_max_listed_tools_may_be_set_in_access_but_in_one_place_only(
    published: Published, tmp_path: Path
) -> None:
    moved = DEPLOYMENT.replace("max_listed_tools = 12\n", "", 1).replace(
        'deny = ["weather__air_quality"', 'max_listed_tools = 12\ndeny = ["weather__air_quality"', 1
    )
    path = copy_tree(published, tmp_path)
    path.write_text(moved)
    assert load_deployment(path).agent("crew").access.max_listed_tools == 12
    line = _only(
        published, tmp_path / "both", 'deny = ["weather', 'max_listed_tools = 9\ndeny = ["weather'
    )
    assert line == (
        "agents[0].access.max_listed_tools: is set in agents[0].max_listed_tools too: "
        "set it in one place"
    )
