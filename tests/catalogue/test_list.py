"""The list the model is given and every tool's state, through the CLI and the client.

Each expected list is written out by hand from the rules (docs/catalogue.md):
pinned tools, then always-listed ones, then the rest in the order of all tools
(package tools, then plugins in [[plugins]] order, each in registration
order) up to max_listed_tools, search_tools and call_tool taking the last two
places when anything available is not listed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.catalogue import Catalogue
from broker.loading import load_deployment

from .conftest import DEPLOYMENT, PACKAGE, PLUGINS, REPO, Published, cli, copy_tree

ALL_TOOLS = [name for name, *_ in PACKAGE] + [
    f"{slug}__{key}" for slug, tools in PLUGINS.items() for key, *_ in tools
]
BUILTINS = ["search_tools", "call_tool"]

CREW = [
    # pinned (mail__archive_thread is deferred: the pin lists it)
    "mail__archive_thread",
    "maps__traffic_report",
    # always listed
    "notes_save",
    "weather__get_forecast",
    "weather__get_alerts",
    "mail__send_message",
    # the rest, 12 - 6 - 2 = 4 places
    "echo",
    "word_count",
    "list_files",
    "calc",
    *BUILTINS,
]
DEFERRED = {
    "notes_search",
    "weather__tide_tables",
    "weather__rain_radar",
    "weather__snow_depth",
    "mail__archive_thread",
    "mail__label_thread",
    "mail__unsubscribe_list",
    "mail__export_mailbox",
    "maps__reverse_geocode_coordinates_into_a_full_postal_address_record",
}
ALWAYS = ["notes_save", "weather__get_forecast", "weather__get_alerts", "mail__send_message"]
OPEN = ALWAYS + [n for n in ALL_TOOLS if n not in DEFERRED and n not in ALWAYS] + BUILTINS
FEW = ["weather__get_forecast", "echo", "calc", "maps__geocode_address"]
TIGHT = ["calc", "maps__geocode_address", *ALWAYS, *BUILTINS]


def _tools(published: Published, agent: str, *extra: str) -> Any:
    done = cli("tools", "-d", str(published.path), agent, *extra, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_deployment_has_3_plugins_and_40_tools(published: Published) -> None:
    deployment = load_deployment(published.path)
    assert list(deployment.plugins) == ["weather", "mail", "maps"]
    assert list(deployment.agent("open").tools) == ALL_TOOLS
    assert len(ALL_TOOLS) == 40


@pytest.mark.parametrize(
    ("agent", "expected"), [("crew", CREW), ("open", OPEN), ("few", FEW), ("tight", TIGHT)]
)
def test_the_cli_and_the_client_give_the_list_the_rules_make(
    published: Published, client: Any, agent: str, expected: list[str]
) -> None:
    printed = _tools(published, agent)
    assert [entry["name"] for entry in printed] == expected
    assert client.tools(agent) == printed
    for entry in printed:
        assert set(entry) == {"name", "description", "parameters"}


def test_a_listed_entry_is_the_tool_as_registered(published: Published) -> None:
    printed = {e["name"]: e for e in _tools(published, "crew")}
    assert printed["weather__get_forecast"] == {
        "name": "weather__get_forecast",
        "description": "Get tomorrow's temperature range for a latitude and longitude.",
        "parameters": {
            "type": "object",
            "properties": {
                "latitude": {"type": "string", "description": "Decimal degrees"},
                "longitude": {"type": "string", "description": "Decimal degrees"},
            },
        },
    }
    assert printed["search_tools"]["parameters"]["required"] == ["query"]
    assert printed["call_tool"]["parameters"]["required"] == ["name", "arguments"]


def test_a_list_without_hidden_tools_has_no_search_tools(published: Published) -> None:
    names = [e["name"] for e in _tools(published, "few")]
    assert "search_tools" not in names and "call_tool" not in names


def test_every_tool_has_a_state_and_a_reason(published: Published) -> None:
    states = {e["name"]: e for e in _tools(published, "crew", "--all")}
    assert list(states) == ALL_TOOLS
    seen = {name: (e["state"], e["reason"]) for name, e in states.items()}
    assert seen["mail__archive_thread"] == ("listed", "pinned")
    assert seen["maps__traffic_report"] == ("listed", "pinned")
    assert seen["notes_save"] == ("listed", "always listed")
    assert seen["echo"] == ("listed", "listed")
    assert seen["notes_search"] == ("searchable", "deferred")
    assert seen["shout"] == ("searchable", "over the limit")
    assert seen["weather__air_quality"] == ("denied", "denied")
    assert seen["todo_add"] == ("denied", "denied")
    listed = [n for n, (state, _) in seen.items() if state == "listed"]
    assert sorted(listed) == sorted(CREW[:-2])
    assert states["echo"]["permissions"] == ["tools:read"]
    assert states["weather__get_forecast"]["permissions"] == []
    for entry in states.values():
        assert set(entry) == {"name", "state", "reason", "permissions"}


def test_a_tool_outside_the_tools_list_is_denied(published: Published) -> None:
    states = {e["name"]: (e["state"], e["reason"]) for e in _tools(published, "few", "--all")}
    assert states["echo"] == ("listed", "listed")
    assert states["shout"] == ("denied", "denied")
    assert sum(1 for s, _ in states.values() if s == "denied") == 36


def test_the_same_deployment_gives_the_same_list_byte_for_byte(published: Published) -> None:
    first = cli("tools", "-d", str(published.path), "crew", cwd=REPO).stdout
    again = cli("tools", "-d", str(published.path), "crew", cwd=REPO).stdout
    assert first == again
    loaded = [Catalogue.of(load_deployment(published.path)).listed("crew") for _ in range(2)]
    assert json.dumps(loaded[0]) == json.dumps(loaded[1]) == json.dumps(json.loads(first))


def test_the_api_formats_take_the_same_list(published: Published) -> None:
    printed = _tools(published, "crew", "--format", "anthropic")
    assert [e["name"] for e in printed] == CREW
    assert printed[-2]["input_schema"]["required"] == ["query"]


def test_all_does_not_take_a_format(published: Published) -> None:
    done = cli("tools", "-d", str(published.path), "crew", "--all", "--format", "openai", cwd=REPO)
    assert done.returncode == 2
    assert "--all" in done.stderr


def test_check_warns_of_long_names_and_lists_past_the_limit(published: Published) -> None:
    lines = published.check_stdout.splitlines()
    long_name = "maps__reverse_geocode_coordinates_into_a_full_postal_address_record"
    assert any(
        "maps.js: name: warning:" in line and repr(long_name) in line and "67 characters" in line
        for line in lines
    ), lines
    assert any(
        "agents[3].max_listed_tools: warning: agent 'tight' is given 8 tools, more than its "
        "max_listed_tools 3" in line
        for line in lines
    ), lines
    assert lines[-1].endswith(": 4 agents, 160 tools, 3 plugins: valid")


def test_pins_past_the_limit_with_nothing_hidden_need_no_search_tools(
    published: Published, tmp_path: Path
) -> None:
    path = copy_tree(published, tmp_path)
    old = 'tools = ["echo", "calc", "weather__get_forecast", "maps__geocode_address"]\n'
    new = old + 'pin = ["echo", "calc", "maps__geocode_address"]\n'
    text = DEPLOYMENT.replace(old, new).replace(
        'id = "few"\npackage = "crew"\n', 'id = "few"\npackage = "crew"\nmax_listed_tools = 2\n'
    )
    assert text.count("max_listed_tools = 2\n") == 1
    path.write_text(text)
    printed = cli("tools", "-d", str(path), "few", cwd=REPO)
    assert [e["name"] for e in json.loads(printed.stdout)] == [
        "echo",
        "calc",
        "maps__geocode_address",
        "weather__get_forecast",
    ]
    checked = cli("check", "-d", str(path), cwd=REPO)
    assert checked.returncode == 0, checked.stdout
    assert "agent 'few' is given 4 tools, more than its max_listed_tools 2" in checked.stdout


def test_no_place_is_left_for_the_rest_past_the_pins_and_the_built_ins(
    published: Published,
) -> None:
    # tight: 6 pinned or always listed, limit 3: no room is left for the rest.
    states = {e["name"]: e["reason"] for e in _tools(published, "tight", "--all")}
    assert states["echo"] == "over the limit"
    assert [n for n, r in states.items() if r == "listed"] == []
