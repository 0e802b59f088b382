"""Plugin tools through `vessel-workers call` on the embedded default: seed 002's two
examples (the weather plugin against its local stand-in, a note a declared tool of the
same turn reads), `--initiator`/`--verified`, unvalidated input, and the start-up check of
a plugin worker against its lock."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXAMPLES, REPO, free_port

from broker.errors import ConfigError, MissingSecret
from broker.loading import load_deployment
from broker.request import CallRequest
from workers.assembly import build_executor
from workers.preflight import check_plugin_locks

PROBE = """\
globalThis.tools.echo = {
  description: "Return the input and what started the turn.",
  parameters: { type: "object", properties: { n: { type: "number" } }, required: ["n"] },
  handler: (input, context) => ({ input, initiator: context.initiator }),
};

globalThis.tools.secret = {
  description: "Return a setting that comes from the environment.",
  handler: async () => ({ key: await host.settings.get("key") }),
};
"""
SECRET = "k-0123456789abcdef"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VESSEL_")}
    environ["PROBE_KEY"] = SECRET
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The examples on a free port: the stand-in running, the plugin's lock rewritten."""
    folder = tmp_path_factory.mktemp("examples") / "examples"
    shutil.copytree(EXAMPLES, folder)
    port = free_port()
    source = folder / "plugins" / "weather" / "src" / "weather.ts"
    source.write_text(source.read_text().replace("127.0.0.1:8124", f"127.0.0.1:{port}"))
    deployment = folder / "deployment.toml"
    deployment.write_text(deployment.read_text().replace("8124", str(port)))
    env = {"VESSEL_WORKSPACE_ROOT": str(folder / "workspaces")}
    checked = run("check", "-d", str(deployment), env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    service = subprocess.Popen(
        [sys.executable, str(folder / "weather_service.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stdout is not None
        assert "listening" in service.stdout.readline()
        yield deployment, env
    finally:
        service.terminate()
        service.wait(10)
        if service.stdout is not None:
            service.stdout.close()


def test_get_forecast_asks_the_service_named_in_its_settings(
    examples: tuple[Path, dict[str, str]],
) -> None:
    deployment, env = examples
    args = '{"latitude": 52.1, "longitude": 5.1}'
    done = run("call", "-d", str(deployment), "field-guide", "weather__get_forecast", args, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    sys.path.insert(0, str(deployment.parent))
    try:
        from weather_service import forecast  # the stand-in's own formula
    finally:
        sys.path.pop(0)
    daily = forecast(52.1, 5.1, 2)
    assert json.loads(done.stdout) == {
        "minC": daily["temperature_2m_min"][1],
        "maxC": daily["temperature_2m_max"][1],
    }


def test_a_declared_tool_of_the_turn_reads_the_note_save_note_wrote(
    examples: tuple[Path, dict[str, str]],
) -> None:
    deployment, env = examples
    note = '{"title": "River Trout!", "text": "Brown trout at the weir"}'
    saved = run(
        *("call", "-d", str(deployment), "field-guide", "weather__save_note", note),
        *("--turn", "turn-notes"),
        env=env,
    )
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert json.loads(saved.stdout) == {"saved": "notes/river-trout-.md"}
    read = run(
        *("call", "-d", str(deployment), "field-guide", "read_notes", "--turn", "turn-notes"),
        env=env,
    )
    assert read.returncode == 0, read.stdout + read.stderr
    assert json.loads(read.stdout) == [
        {"path": "notes/river-trout-.md", "text": "Brown trout at the weir"}
    ]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("probe")
    shutil.copytree(EXAMPLES / "records", folder / "records")
    plugin = folder / "plugins" / "probe"
    (plugin / "src").mkdir(parents=True)
    (plugin / "plugin.toml").write_text('slug = "probe"\nsources = ["src/probe.js"]\n')
    (plugin / "src" / "probe.js").write_text(PROBE)
    deployment = folder / "deployment.toml"
    deployment.write_text(
        '[[plugins]]\npackage = "plugins/probe"\n[plugins.settings]\nkey = "env:PROBE_KEY"\n\n'
        '[[agents]]\nid = "records"\npackage = "records"\n'
        '[agents.services.records]\nurl = "http://127.0.0.1:9"\n'
    )
    checked = run("check", "-d", str(deployment))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return deployment


def test_the_initiator_comes_from_the_command_line(probe: Path) -> None:
    done = run(
        *("call", "-d", str(probe), "records", "probe__echo", '{"n": 1}'),
        *("--initiator", "channelSender", "--verified"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["initiator"] == {
        "kind": "channelSender",
        "isVerifiedPerson": True,
    }
    bad = run("call", "-d", str(probe), "records", "probe__echo", "{}", "--initiator", "model")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_input_is_not_validated_against_the_schema(probe: Path) -> None:
    # Seed 002: "The platform doesn't validate it against your schema".
    done = run("call", "-d", str(probe), "records", "probe__echo", '{"n": "not a number"}')
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["input"] == {"n": "not a number"}
    # It must still be a JSON object.
    refused = run("call", "-d", str(probe), "records", "probe__echo", "[1]")
    assert refused.returncode == 2
    assert "the arguments must be a JSON object" in refused.stdout


@pytest.mark.hostile
def test_a_plugin_worker_refuses_a_lock_its_sources_do_not_match(
    probe: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "edited"
    shutil.copytree(probe.parent, folder)
    deployment = load_deployment(folder / "deployment.toml")
    check_plugin_locks(deployment)  # as written by check: accepted
    lock = folder / "plugins" / "probe" / "plugin.lock.json"
    data = json.loads(lock.read_text())
    data["permissions"] = ["host:fetch"]  # widened by hand; the sources' sha256 still match
    lock.write_text(json.dumps(data))
    edited = load_deployment(folder / "deployment.toml")
    with pytest.raises(ConfigError, match=r"do not register what plugin\.lock\.json records"):
        check_plugin_locks(edited)


@pytest.mark.hostile
def test_only_plugin_workers_hold_the_settings_secrets_and_results_redact_them(
    probe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = load_deployment(probe)
    monkeypatch.delenv("PROBE_KEY", raising=False)
    # A sandbox worker never reads the plugins' settings: it starts without the variable.
    sandbox, _ = build_executor(deployment, "sandbox")
    assert sandbox.sandbox is not None
    sandbox.sandbox.close()
    with pytest.raises(MissingSecret, match="PROBE_KEY") as caught:
        build_executor(deployment, "plugin")
    assert SECRET not in str(caught.value)
    monkeypatch.setenv("PROBE_KEY", SECRET)
    executor, _ = build_executor(deployment, "plugin")
    try:
        result = executor.run(
            CallRequest(
                call_id="c-secret", agent="records", tool="probe__secret", arguments={}, owner="a/b"
            )
        )
    finally:
        assert executor.plugin is not None
        executor.plugin.close()
        executor.plugin.bridge.close()
    assert result.outcome == "ok", result.output
    assert json.loads(result.output) == {"key": "[redacted]"}
