"""`vessel-workers call` on the embedded default (no VESSEL_BROKER_URL): the real
Celery task path in one process, confinement real, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXAMPLES, REPO, free_port

DEPLOYMENT = str(EXAMPLES / "deployment.toml")


def call(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VESSEL_BROKER")}
    environ.pop("VESSEL_RESULT_BACKEND", None)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "call", *args],
        input=stdin,
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_readme_species_call_gives_the_rivers_species() -> None:
    done = call("-d", DEPLOYMENT, "field-guide", "species", '{"habitat": "rivers"}')
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {r["name"] for r in rows} >= {"Atlantic salmon", "Grayling"}
    assert all("rivers" in r["habitat"] for r in rows)


def test_arguments_from_stdin_and_the_whole_result_as_json() -> None:
    done = call(
        "-d", DEPLOYMENT, "field-guide", "species", "-", "--json", stdin='{"habitat": "sea"}'
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["agent"] == "field-guide" and result["tool"] == "species"
    assert result["outcome"] == "ok" and result["is_error"] is False and result["exit_code"] == 0
    assert {"call_id", "output", "dropped_chars", "duration_ms", "files"} <= set(result)
    assert all("sea" in row["habitat"] for row in json.loads(result["output"]))


@pytest.mark.parametrize("arguments", ["[1]", "not json", '"a string"'])
def test_arguments_that_are_not_an_object_are_refused_by_the_worker(arguments: str) -> None:
    done = call("-d", DEPLOYMENT, "field-guide", "species", arguments)
    assert done.returncode == 2
    assert "species: the arguments must be a JSON object" in done.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        # Refused at submit: the text is measured in UTF-8 bytes.
        (
            '{"habitat": "' + "é" * 500_000 + '"}',
            "the arguments are 1000015 bytes; at most 1000000",
        ),
        # Refused by the worker, as invalid arguments (not "the worker failed").
        ('{"habitat": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more than 64 levels"),
        ('{"habitat": NaN}', "the arguments hold NaN, which is not JSON"),
    ],
    ids=["too-large", "too-deep", "nan"],
)
def test_arguments_the_worker_cannot_take_are_refused_with_exit_2(
    arguments: str, message: str
) -> None:
    done = call("-d", DEPLOYMENT, "field-guide", "species", "-", "--json", stdin=arguments)
    assert done.returncode == 2, done.stderr
    result = json.loads(done.stdout)
    assert (result["outcome"], result["is_error"]) == ("refused", True)
    assert result["output"].startswith("species: ") and message in result["output"]


def test_an_integer_past_pythons_digits_limit_says_so() -> None:
    # 10**100000 as ARGS: refused as "not a JSON object" before.
    done = call("-d", DEPLOYMENT, "field-guide", "species", '{"habitat": 1' + "0" * 100_000 + "}")
    assert done.returncode == 2, done.stderr
    assert "an integer of more than 4300 digits" in done.stdout


def test_a_tool_that_fails_is_an_error_result() -> None:
    done = call("-d", DEPLOYMENT, "field-guide", "word_count", '{"path": "no-such-file.md"}')
    assert done.returncode == 1
    assert "FileNotFoundError" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nobody", "species"), "no agent 'nobody'"),
        (("field-guide", "nothing"), "has no tool 'nothing'"),
        (("field-guide", "species", "--owner", "no-slash"), "neither <app>/<user>"),
    ],
)
def test_calls_refused_before_running_exit_2(args: tuple[str, ...], message: str) -> None:
    done = call("-d", DEPLOYMENT, *args)
    assert done.returncode == 2
    assert message in done.stderr and done.stdout == ""


def test_an_invalid_deployment_lists_its_problems(tmp_path: Path) -> None:
    broken = tmp_path / "deployment.toml"
    broken.write_text('[[agents]]\nid = "Bad Id"\npackage = "missing"\n')
    done = call("-d", str(broken), "field-guide", "species")
    assert done.returncode == 2
    assert str(broken) in done.stderr or "deployment.toml" in done.stderr


@pytest.fixture
def records_service() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "records_service.py"), "--port", str(port)],
        env={**os.environ, "RECORDS_TOKEN": "a-long-records-token"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    import socket

    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "records service did not start"
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)


def test_a_service_tool_runs_on_the_embedded_default(records_service: int, tmp_path: Path) -> None:
    deployment = tmp_path / "deployment.toml"
    deployment.write_text(
        f'[[agents]]\nid = "records"\npackage = "{EXAMPLES / "records"}"\n'
        f'[agents.services.records]\nurl = "http://127.0.0.1:{records_service}"\n'
        'headers = { "X-Internal-Token" = "env:RECORDS_TOKEN" }\n'
    )
    done = call(
        "-d",
        str(deployment),
        "records",
        "lookup",
        '{"id": "A-1042"}',
        "--owner",
        "web/alice",
        RECORDS_TOKEN="a-long-records-token",
    )
    assert done.returncode == 0, done.stderr + done.stdout
    answer = json.loads(done.stdout)
    assert answer["record"]["id"] == "A-1042"
    missing = call("-d", str(deployment), "records", "lookup", '{"id": "A-1042"}')
    assert missing.returncode == 2
    assert "RECORDS_TOKEN" in missing.stderr


def test_an_embedded_call_missing_its_secret_names_the_variable_it_needs() -> None:
    """No worker exists on the embedded default: the one line names the variable this
    call needs, one line only, and exit 2 (nothing ran)."""
    environ = {k: v for k, v in os.environ.items() if k != "RECORDS_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "call", "-d", DEPLOYMENT, "records", "lookup"],
        input=None,
        env={k: v for k, v in environ.items() if not k.startswith("VESSEL_BROKER")},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "this call needs RECORDS_TOKEN, which is not set here" in lines[0]
    assert "service workers cannot start" not in lines[0]
