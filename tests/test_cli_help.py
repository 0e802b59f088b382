"""`vessel-workers --version`, and every verb's --help: its arguments described, its
exit status, the environment it reads and an example."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

from workers.cli import build_parser

VERBS = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env={**os.environ, "COLUMNS": "100"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"vessel-workers \d+\.\d+\.\d+\S*\n", done.stdout), done.stdout


def test_the_new_verbs_are_there() -> None:
    assert {"agents", "status", "result", "cancel", "end-turn"} <= set(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_help_names_exit_codes_environment_and_an_example(verb: str) -> None:
    parser = build_parser()._subparsers._group_actions[0].choices[verb]  # type: ignore[union-attr]
    text = parser.format_help()
    assert "exit status:" in text and "environment:" in text and "example:" in text, text
    exits = text.split("exit status:", 1)[1].split("environment:", 1)[0]
    codes = re.findall(r"^\s+(\d+) ", exits, flags=re.MULTILINE)
    assert "0" in codes and len(codes) >= 2, exits
    assert "VESSEL_DEPLOYMENT" in text
    example = text.split("example:", 1)[1]
    assert f"vessel-workers {verb}" in example, example
    for action in parser._actions:
        assert action.help, f"{verb}: argument {action.dest} has no help"


def test_help_runs_from_the_command_line() -> None:
    done = cli("status", "--help")
    assert done.returncode == 0 and "exit status:" in done.stdout, done.stderr
