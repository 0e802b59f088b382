"""`vessel-workers check` and `vessel-workers tools`: output and exit status."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from workers.cli import main

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / ".venv" / "bin" / "vessel-workers"
VALID = "examples/deployment.toml: 2 agents, 8 tools, 1 plugin: valid\n"


@pytest.fixture(autouse=True)
def _in_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("VESSEL_DEPLOYMENT", raising=False)


def broken(tmp_path: Path) -> Path:
    """A deployment with two problems in two files."""
    (tmp_path / "pkg" / "tools").mkdir(parents=True)
    (tmp_path / "pkg" / "vessel.toml").write_text('[tools]\ndeclared = ["tools/t.toml"]\n')
    (tmp_path / "pkg" / "tools" / "t.toml").write_text(
        'name = "web_search"\ndescription = "x"\ncommand = ["true"]\n'
    )
    path = tmp_path / "deployment.toml"
    path.write_text('[[agents]]\nid = "a"\npackage = "pkg"\nmax_concurrent_calls = 0\n')
    return path


def test_check_passes_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "-d", "examples/deployment.toml"]) == 0
    assert capsys.readouterr().out == VALID


def test_check_prints_one_line_per_problem_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "-d", "deployment.toml"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "deployment.toml: agents[0].max_concurrent_calls: must be a positive integer, not 0",
        "pkg/tools/t.toml: name: 'web_search' is the name of a built-in tool",
    ]


def test_check_of_a_missing_file_is_a_problem_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "-d", "examples/nowhere.toml"]) == 1
    assert capsys.readouterr().out == "examples/nowhere.toml: (file): no such file\n"


def test_check_reads_vessel_deployment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VESSEL_DEPLOYMENT", "examples/deployment.toml")
    assert main(["check"]) == 0
    assert capsys.readouterr().out == VALID


def test_check_defaults_to_deployment_toml_here(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO / "examples")
    assert main(["check"]) == 0
    assert capsys.readouterr().out == "deployment.toml: 2 agents, 8 tools, 1 plugin: valid\n"


def test_tools_prints_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "-d", "examples/deployment.toml", "field-guide"]) == 0
    out = capsys.readouterr().out
    listed = json.loads(out)
    # The package's tools, then the weather plugin's (installed for every agent).
    assert [t["name"] for t in listed] == [
        "species",
        "word_count",
        "read_notes",
        "weather__get_forecast",
        "weather__save_note",
    ]
    assert listed[:2] == [
        {
            "name": "species",
            "description": "List every species in the guide with its family, habitats and "
            "length, as JSON.",
            "parameters": {
                "type": "object",
                "properties": {
                    "habitat": {
                        "type": "string",
                        "description": "Only species with this habitat (optional)",
                    }
                },
            },
        },
        {
            "name": "word_count",
            "description": "Count the words in one file.",
            "parameters": {
                "type": "object",
                "required": ["path"],
                "properties": {"path": {"type": "string"}},
            },
        },
    ]
    assert out.startswith('[\n  {\n    "name": "species"')  # indent 2


def test_tools_of_an_unknown_agent_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "-d", "examples/deployment.toml", "nobody"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no agent 'nobody'" in captured.err
    assert "field-guide, records" in captured.err


def test_tools_of_an_invalid_deployment_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = broken(tmp_path)
    assert main(["tools", "-d", str(path), "a"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 2
    assert "name: 'web_search' is the name of a built-in tool" in captured.err


def test_the_console_script_checks_the_examples() -> None:
    done = subprocess.run(
        [str(SCRIPT), "check", "-d", "examples/deployment.toml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, VALID, "")


def test_the_console_script_refuses_a_broken_deployment(tmp_path: Path) -> None:
    broken(tmp_path)
    done = subprocess.run(
        [str(SCRIPT), "check", "--deployment", "deployment.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout.splitlines()[1] == (
        "pkg/tools/t.toml: name: 'web_search' is the name of a built-in tool"
    )
    assert "Traceback" not in done.stderr


def test_the_console_script_prints_tools_as_json() -> None:
    done = subprocess.run(
        [str(SCRIPT), "tools", "-d", "examples/deployment.toml", "records"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0
    assert [tool["name"] for tool in json.loads(done.stdout)] == [
        "lookup",
        "weather__get_forecast",
        "weather__save_note",
    ]
