"""The tool list in OpenAI's, Anthropic's and MCP's tool formats: `broker.tool_formats`,
`vessel-workers tools --format` and `VesselClient.tools`."""

from __future__ import annotations

import json

import pytest

from broker.loading import load_deployment
from broker.tool_formats import InvalidToolName, in_format, listed
from workers.cli import main

EXAMPLES = "examples/deployment.toml"
ENTRY = {
    "name": "species",
    "description": "Find species.",
    "parameters": {"type": "object", "properties": {"habitat": {"type": "string"}}},
}


@pytest.fixture(autouse=True)
def _in_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[1])


def test_each_format_has_its_apis_shape() -> None:
    schema = ENTRY["parameters"]
    assert in_format([ENTRY], "openai") == [
        {
            "type": "function",
            "function": {"name": "species", "description": "Find species.", "parameters": schema},
        }
    ]
    assert in_format([ENTRY], "anthropic") == [
        {"name": "species", "description": "Find species.", "input_schema": schema}
    ]
    assert in_format([ENTRY], "mcp") == [
        {"name": "species", "description": "Find species.", "inputSchema": schema}
    ]


@pytest.mark.parametrize(
    "name",
    ["weather-station-network__" + "x" * 40, "has.dot", "has space", ""],
)
def test_a_name_the_apis_refuse_is_an_error_naming_it(name: str) -> None:
    with pytest.raises(InvalidToolName) as caught:
        in_format([{**ENTRY, "name": name}], "anthropic")
    assert repr(name) in str(caught.value)


def test_64_characters_is_the_longest_name() -> None:
    assert in_format([{**ENTRY, "name": "a" * 64}], "mcp")[0]["name"] == "a" * 64
    with pytest.raises(InvalidToolName, match="65 characters"):
        in_format([{**ENTRY, "name": "a" * 65}], "mcp")


@pytest.mark.parametrize(
    ("fmt", "key"), [("openai", "function"), ("anthropic", "input_schema"), ("mcp", "inputSchema")]
)
def test_the_tools_verb_prints_each_format(
    capsys: pytest.CaptureFixture[str], fmt: str, key: str
) -> None:
    assert main(["tools", "-d", EXAMPLES, "field-guide", "--format", fmt]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = in_format(listed(load_deployment(EXAMPLES), "field-guide"), fmt)  # type: ignore[arg-type]
    assert printed == expected
    assert printed and all(key in entry for entry in printed)


def test_the_tools_verb_default_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "-d", EXAMPLES, "field-guide"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == load_deployment(EXAMPLES).agent("field-guide").catalogue()


def test_the_client_offers_the_same(redis_url: str) -> None:
    from broker.client import VesselClient
    from broker.config import Settings

    deployment = load_deployment(EXAMPLES)
    client = VesselClient(deployment, Settings.from_environ({"VESSEL_BROKER_URL": redis_url}))
    try:
        assert client.tools("field-guide") == listed(deployment, "field-guide")
        assert client.tools("field-guide", format="openai") == in_format(
            listed(deployment, "field-guide"), "openai"
        )
    finally:
        client.close()


def test_the_mcp_verb_refuses_a_name_the_apis_refuse_before_serving(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plugin's final name (slug + "__" + key) can pass 64 characters; the
    # listing stands in for such a catalogue.
    long_name = "weather-station-network__" + "x" * 40
    monkeypatch.setattr(
        "broker.tool_formats.listed", lambda deployment, agent: [{**ENTRY, "name": long_name}]
    )
    assert main(["mcp", "-d", EXAMPLES, "field-guide", "--owner", "web/alice"]) == 2
    err = capsys.readouterr().err
    assert repr(long_name) in err and "65 characters" in err
