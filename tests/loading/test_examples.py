"""The examples load as the seeds describe them, and the seed's local test works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.loading import check_deployment, load_deployment
from broker.model import DeclaredTool, Grant, ServiceTool

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
SAMPLE_DATA = EXAMPLES / "sample-data"


@pytest.fixture(autouse=True)
def _in_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES.parent)


def test_the_examples_have_no_problems() -> None:
    assert check_deployment("examples/deployment.toml") == []


def test_the_field_guide_agent() -> None:
    guide = load_deployment("examples/deployment.toml").agent("field-guide")
    assert guide.mounts == {"/data": SAMPLE_DATA.resolve()}
    assert guide.settings.workdir == "/data"
    # Its package's tools, then the weather plugin's (installed for every agent).
    assert list(guide.tools) == [
        "species",
        "word_count",
        "read_notes",
        "weather__get_forecast",
        "weather__save_note",
    ]
    species, word_count = guide.tool("species"), guide.tool("word_count")
    assert isinstance(species, DeclaredTool)
    assert species.command == ("python3", "/agent/tools/species.py")
    assert species.input == "json-stdin"
    assert isinstance(word_count, DeclaredTool)
    assert word_count.input == "args"
    assert str(species.source) == "examples/field-guide/tools/species.toml"


def test_the_records_agent() -> None:
    records = load_deployment("examples/deployment.toml").agent("records")
    lookup = records.tool("lookup")
    assert isinstance(lookup, ServiceTool)
    assert (lookup.service, lookup.path) == ("records", "/agent-tools/lookup")
    assert records.grants["records"] == Grant(
        name="records",
        url="http://127.0.0.1:8000",
        headers={"X-Internal-Token": "env:RECORDS_TOKEN"},
    )


def test_seed_local_test_lists_the_river_species() -> None:
    # Seed 000: cd examples/sample-data; echo '{"habitat": "rivers"}' | python3 ../field-guide/...
    done = subprocess.run(
        [sys.executable, "../field-guide/tools/species.py"],
        input='{"habitat": "rivers"}',
        capture_output=True,
        text=True,
        cwd=SAMPLE_DATA,
        check=True,
    )
    rows = json.loads(done.stdout)
    assert len(rows) >= 3
    assert all("rivers" in row["habitat"] for row in rows)
    assert {"page", "name", "family", "habitat", "length_cm"} == set(rows[0])
    everything = subprocess.run(
        [sys.executable, "../field-guide/tools/species.py"],
        input="{}",
        capture_output=True,
        text=True,
        cwd=SAMPLE_DATA,
        check=True,
    )
    assert len(json.loads(everything.stdout)) > len(rows)


def test_word_count_counts_the_words_of_a_note() -> None:
    done = subprocess.run(
        [sys.executable, "../field-guide/tools/word_count.py", "--path=notes/a.md"],
        capture_output=True,
        text=True,
        cwd=SAMPLE_DATA,
        check=True,
    )
    expected = len((SAMPLE_DATA / "notes" / "a.md").read_text().split())
    assert done.stdout == f"{expected}\n"
