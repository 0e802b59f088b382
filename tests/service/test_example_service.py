"""examples/records_service.py, started as the README starts it, called for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "records_service.py"
TOKEN = "example-records-token-42"


@pytest.fixture(scope="module")
def records_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--port", "0"],
        env={**os.environ, "RECORDS_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("records service listening on http://"), line
        yield line.strip().rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _setup(make_caller, url: str):
    return make_caller(
        url,
        headers={"X-Internal-Token": "env:RECORDS_TOKEN"},
        environ={"RECORDS_TOKEN": TOKEN},
    )


def test_lookup_of_a_known_record(records_url, make_caller):
    result = _setup(make_caller, records_url).call({"id": "A-1042"}, owner="web/alice")
    assert not result.is_error
    answer = json.loads(result.output)
    assert answer["record"]["title"].startswith("Common swift")
    assert answer["shown_to"] == "web/alice"
    assert result.output.startswith('{\n  "record": {')  # re-indented


def test_unknown_id_is_a_4xx_the_model_can_read(records_url, make_caller):
    result = _setup(make_caller, records_url).call({"id": "Z-9999"})
    assert result.is_error
    assert result.status == 404
    assert "no record with id 'Z-9999'" in result.output
    assert "A-1042" in result.output


def test_restricted_record_depends_on_the_owner(records_url, make_caller):
    setup = _setup(make_caller, records_url)
    denied = setup.call({"id": "B-0007"}, owner="web/alice")
    assert denied.status == 403
    assert "restricted to staff" in denied.output
    allowed = setup.call({"id": "B-0007"}, owner="staff/bob")
    assert allowed.status == 200
    assert "white-tailed eagle" in allowed.output


def test_wrong_token_is_refused(records_url, make_caller):
    result = make_caller(records_url, headers={"X-Internal-Token": "wrong-token-xyz"}).call()
    assert result.status == 401
    assert result.is_error


def test_example_refuses_to_start_without_a_token():
    env = {k: v for k, v in os.environ.items() if k != "RECORDS_TOKEN"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert proc.returncode == 2
    assert "RECORDS_TOKEN" in proc.stderr
