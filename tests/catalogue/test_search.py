"""`search_tools`: BM25 over the agent's available but unlisted tools, answered at submit.

Through the client (`client.search_tools`, `client.call`) and the command line
on the embedded default (`vessel-workers call AGENT search_tools ARGS`): no
worker runs, the answer is stored as the call's result like any tool's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.catalogue.search import SearchIndex, words

from .conftest import REPO, Published, cli, embedded_env

OWNER = "app/tester"


def _names(found: list[dict[str, Any]]) -> list[str]:
    return [entry["name"] for entry in found]


def _search(client: Any, agent: str, arguments: Any) -> Any:
    return client.call(agent, "search_tools", arguments, owner=OWNER, timeout=10)


def test_the_best_match_comes_first(client: Any) -> None:
    found = client.search_tools("crew", "high and low tide times for a harbour")
    assert _names(found)[0] == "weather__tide_tables"
    assert found[0] == {
        "name": "weather__tide_tables",
        "description": "Give high and low tide times for a harbour on the coast.",
        "parameters": {
            "type": "object",
            "properties": {"harbour": {"type": "string", "description": "Harbour name"}},
        },
    }


def test_it_ranks_only_unlisted_tools_the_agent_may_use(client: Any) -> None:
    listed = {entry["name"] for entry in client.tools("crew")}
    # weather__get_forecast is listed; weather__climate_history ("temperatures") is not.
    found = _names(client.search_tools("crew", "temperature forecast", limit=20))
    assert found[0] == "weather__climate_history"
    assert not listed & set(found)
    # Denied: neither listed nor searchable.
    assert "weather__air_quality" not in _names(client.search_tools("crew", "air quality pollen"))
    assert "mail__export_mailbox" not in _names(client.search_tools("crew", "export mbox"))


def test_a_deferred_tool_is_found(client: Any) -> None:
    assert _names(client.search_tools("crew", "ski snow"))[0] == "weather__snow_depth"
    assert _names(client.search_tools("open", "ski snow"))[0] == "weather__snow_depth"


def test_name_words_split_on_underscores_and_parameters_are_matched(client: Any) -> None:
    # Only in the final name: maps__reverse_geocode_coordinates_...
    assert _names(client.search_tools("crew", "reverse")) == [
        "maps__reverse_geocode_coordinates_into_a_full_postal_address_record"
    ]
    # Only in a parameter's description: weather__wind_gusts' spot, "A beach or lake".
    assert _names(client.search_tools("crew", "lake")) == ["weather__wind_gusts"]
    # Only in a parameter's name: mail__list_inbox's "count" (word_count is listed).
    assert _names(client.search_tools("crew", "count")) == ["mail__list_inbox"]


def test_plurals_fold_and_case_does_not_matter(client: Any) -> None:
    assert _names(client.search_tools("crew", "TIDES"))[0] == "weather__tide_tables"


def test_limit_is_5_by_default_and_at_most_what_is_asked(client: Any) -> None:
    assert len(client.search_tools("crew", "email message thread inbox list")) == 5
    assert len(client.search_tools("crew", "email message thread", limit=2)) == 2
    # "the" is in most texts: more than 5 match, 20 at most are given.
    result = _search(client, "crew", {"query": "the a of", "limit": 20})
    assert 5 < len(json.loads(result.output)) <= 20
    assert len(client.search_tools("crew", "the a of", limit=7)) == 7


def test_ties_keep_the_order_of_all_tools() -> None:
    same = words("send a note")
    index = SearchIndex([words("other"), same, same, words("a note"), same])
    # The shorter text scores higher; the three equal ones keep their order.
    assert index.search("note", 10) == [3, 1, 2, 4]
    assert index.search("send note", 10) == [1, 2, 4, 3]
    assert index.search("send", 2) == [1, 2]


def test_the_same_query_gives_the_same_answer(client: Any) -> None:
    first = _search(client, "crew", {"query": "city weather report"}).output
    assert _search(client, "crew", {"query": "city weather report"}).output == first


def test_no_match_is_a_text_suggesting_other_words_not_an_error(client: Any) -> None:
    result = _search(client, "crew", {"query": "xylophone"})
    assert (result.is_error, result.outcome, result.tool) == (False, "ok", "search_tools")
    assert result.output.startswith("No tool matches 'xylophone'.")
    assert "Try other words" in result.output
    close = _search(client, "crew", {"query": "harbur"})
    assert close.output == (
        "No tool matches 'harbur'. Words the tools use that are close to yours: harbour."
    )
    assert client.search_tools("crew", "xylophone") == []


def test_an_agent_with_every_tool_listed_is_told_so(client: Any) -> None:
    result = _search(client, "few", {"query": "weather"})
    assert not result.is_error
    assert "already in your tool list" in result.output


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("[1]", "the arguments must be a JSON object"),
        ("{}", '"query" must be a non-empty string'),
        ({"query": "  "}, '"query" must be a non-empty string'),
        ({"query": "tide", "limit": 0}, '"limit" must be an integer from 1 to 20, not 0'),
        ({"query": "tide", "limit": 21}, '"limit" must be an integer from 1 to 20, not 21'),
        ({"query": "tide", "limit": True}, '"limit" must be an integer from 1 to 20, not true'),
        (
            "{not json",
            "the arguments must be a JSON object; call search_tools again with valid JSON",
        ),
    ],
)
def test_bad_arguments_are_refused_with_a_text_for_the_model(
    client: Any, arguments: Any, says: str
) -> None:
    result = _search(client, "crew", arguments)
    assert (result.is_error, result.outcome, result.tool) == (True, "refused", "search_tools")
    assert says in result.output, result.output


def test_the_command_line_answers_search_tools_without_a_worker(published: Published) -> None:
    query = json.dumps({"query": "tide times for a harbour", "limit": 3})
    done = cli(
        "call",
        "-d",
        str(published.path),
        "crew",
        "search_tools",
        query,
        cwd=REPO,
        env=embedded_env(),
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert len(found) <= 3 and found[0]["name"] == "weather__tide_tables"
    assert set(found[0]) == {"name", "description", "parameters"}
    whole = cli(
        "call",
        "-d",
        str(published.path),
        "--json",
        "crew",
        "search_tools",
        query,
        cwd=REPO,
        env=embedded_env(),
    )
    result = json.loads(whole.stdout)
    assert (result["tool"], result["is_error"], result["outcome"]) == ("search_tools", False, "ok")
    assert json.loads(result["output"]) == found


def test_the_command_line_prints_no_match_and_exits_0(published: Published) -> None:
    done = cli(
        "call",
        "-d",
        str(published.path),
        "crew",
        "search_tools",
        '{"query": "xylophone"}',
        cwd=REPO,
        env=embedded_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("No tool matches 'xylophone'.")


def test_the_command_line_refuses_bad_search_arguments_with_exit_2(published: Published) -> None:
    done = cli(
        "call",
        "-d",
        str(published.path),
        "crew",
        "search_tools",
        "{}",
        cwd=REPO,
        env=embedded_env(),
    )
    assert done.returncode == 2
    assert done.stdout.startswith('search_tools: "query" must be a non-empty string')
