"""Seed 002's two examples, word for word, published by `check` and called through the runner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from broker.loading import load_deployment
from workers.cli import main
from workers.plugin.runner import PluginRunner

from .runtime_support import FIXTURES, Bridge, Calls, write_deployment


@pytest.fixture
def deployment_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for slug in ("weather", "notes"):
        shutil.copytree(FIXTURES / slug, tmp_path / slug)
    path = write_deployment(tmp_path, ["weather", "notes"])
    monkeypatch.chdir(tmp_path)
    return path


def test_check_publishes_both_and_verbose_shows_permissions(
    deployment_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "-v", "-d", "deployment.toml"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "plugin weather: 1 tool, 30 s, 128 MB; permissions: host:fetch",
        "plugin notes: 1 tool, 30 s, 128 MB; permissions: host:workspace:write",
    ]
    assert out[2].startswith("deployment.toml: 1 agent, ") and out[2].endswith(
        " tools, 2 plugins: valid"
    )
    assert (deployment_file.parent / "weather" / "plugin.lock.json").is_file()


def test_check_fails_and_writes_no_lock_for_a_broken_plugin(
    deployment_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = deployment_file.parent / "notes" / "src" / "notes.ts"
    source.write_text(source.read_text().replace("description:", "summary:"))
    assert main(["check", "-d", "deployment.toml"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        "notes/src/notes.ts: tools.save_note.description: missing: a description is required" in out
    )
    assert not any("plugin.lock.json" in line for line in out)
    assert not (deployment_file.parent / "notes" / "plugin.lock.json").exists()


def test_tools_lists_the_plugin_tools_from_the_lock(
    deployment_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "-d", "deployment.toml"]) == 0
    capsys.readouterr()
    assert main(["tools", "guide", "-d", "deployment.toml"]) == 0
    names = [t["name"] for t in json.loads(capsys.readouterr().out)]
    assert names[-2:] == ["weather__get_forecast", "notes__save_note"]


def test_both_examples_run_through_the_runner(deployment_file: Path) -> None:
    assert main(["check", "-d", "deployment.toml"]) == 0
    deployment = load_deployment("deployment.toml")
    bridge = Bridge()
    bridge.fetch_body = json.dumps(
        {"daily": {"temperature_2m_min": [1.0, 2.5], "temperature_2m_max": [9.0, 11.5]}}
    )
    runner = PluginRunner(deployment, bridge)
    try:
        call = Calls(deployment, runner)
        forecast = call("weather__get_forecast", {"latitude": 52.5, "longitude": 13.4})
        saved = call("notes__save_note", {"title": "Shopping List!", "text": "eggs"})
    finally:
        runner.close()
    assert (forecast.is_error, forecast.output) == (False, '{"minC":2.5,"maxC":11.5}')
    url = next(args[0]["url"] for _, chain, args in bridge.calls if chain == "fetch")
    assert url.startswith("https://api.open-meteo.com/v1/forecast?latitude=52.5&longitude=13.4")
    assert (saved.is_error, saved.output) == (False, '{"saved":"notes/shopping-list-.md"}')
    assert bridge.written == [{"path": "notes/shopping-list-.md", "content": "eggs"}]


def test_a_worker_start_check_finds_a_lock_that_no_longer_matches(deployment_file: Path) -> None:
    from workers.plugin.publish import lock_mismatch

    assert main(["check", "-d", "deployment.toml"]) == 0
    deployment = load_deployment("deployment.toml")
    assert lock_mismatch(deployment.plugins["weather"]) is None
    lock = deployment_file.parent / "weather" / "plugin.lock.json"
    data = json.loads(lock.read_text())
    data["tools"][0]["description"] = "Something else."
    data["permissions"] = ["host:fetch", "host:llm"]
    lock.write_text(json.dumps(data))
    changed = load_deployment("deployment.toml").plugins["weather"]
    assert (
        lock_mismatch(changed)
        == "the sources derive ['host:fetch'], the lock ['host:fetch', 'host:llm']"
    )


def test_check_lock_dir_and_the_loaders_environment(
    deployment_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    locks = deployment_file.parent / "locks"
    assert main(["check", "--lock-dir", str(locks), "-d", "deployment.toml"]) == 0
    assert sorted(p.name for p in locks.iterdir()) == ["notes.lock.json", "weather.lock.json"]
    assert not (deployment_file.parent / "weather" / "plugin.lock.json").exists()
    capsys.readouterr()
    assert main(["tools", "guide", "-d", "deployment.toml"]) == 1
    assert "no lock: the plugin was not checked" in capsys.readouterr().err
    monkeypatch.setenv("VESSEL_PLUGIN_LOCK_DIR", str(locks))
    assert main(["tools", "guide", "-d", "deployment.toml"]) == 0
