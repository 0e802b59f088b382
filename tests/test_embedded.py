"""The embedded default (`workers/embedded.py`) in a long-lived process: its
housekeeping (a long-lived embedded client, `vessel-workers mcp` with no broker,
sweeps expired workspaces and kills the standby sandboxes no call took, on a sandbox
worker's periods, shortened here), and clients made one after another in it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES

import workers.sandbox.runner as runner_module
from broker.client import VesselClient
from broker.config import Settings
from broker.loading import load_deployment
from workers import embedded, housekeeping
from workers.embedded import embedded_client

#: A page of the example's sample data that the field guide's word_count reads.
NOTE = "/data/notes/a.md"


def _word_count(client: VesselClient, **turn: str) -> None:
    result = client.call(
        "field-guide", "word_count", {"path": NOTE}, owner="web/a", timeout=30, **turn
    )
    assert not result.is_error, result.output


def _within(seconds: float, ready: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _workspaces(root: Path) -> list[Path]:
    """The turns' workspaces under `root`: agent folder / workspace (not the outboxes,
    nor the fresh one-call workspaces made ahead, named with a dot)."""
    return [
        ws
        for agent in root.iterdir()
        if not agent.name.startswith(".")
        for ws in agent.iterdir()
        if not ws.name.startswith(".")
    ]


def _recording_builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """The (executor, workspace store) of each embedded client made from now on."""
    built: list[tuple[Any, Any]] = []
    real_build = embedded.build_executor

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        built.append(made := real_build(*args, **kwargs))
        return made

    monkeypatch.setattr(embedded, "build_executor", recording_build)
    return built


def test_a_long_lived_embedded_client_sweeps_expired_workspaces_and_idle_standbys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ws"
    monkeypatch.setenv("VESSEL_WORKSPACE_ROOT", str(root))
    monkeypatch.setattr(housekeeping, "_WORKSPACE_SWEEP_SECONDS", 0.3)
    monkeypatch.setattr(runner_module, "STANDBY_IDLE_SECONDS", 1.0)
    built = _recording_builds(monkeypatch)
    deployment = load_deployment(str(EXAMPLES / "deployment.toml"))
    settings = Settings(heartbeat_seconds=0.1, sweep_seconds=0.1)
    with embedded_client(deployment, settings, "sandbox") as client:
        executor, workspaces = built[0]
        runner = executor.sandbox
        _word_count(client, turn="turn-kept")
        (kept,) = _workspaces(root)
        for _ in range(4):  # three like calls close together start a standby
            _word_count(client)
        time.sleep(1.0)  # three sweeps: the turn's workspace is young, kept
        assert _workspaces(root) == [kept]
        old = time.time() - 2 * workspaces.ttl_seconds
        os.utime(kept, (old, old))
        assert _within(10, lambda: not kept.exists()), "the expired workspace was not swept"
        if runner.standby_mode.startswith("on"):
            assert runner.standby_counts().started >= 1
            assert _within(10, lambda: runner.standby_counts().waiting == 0), (
                runner.standby_counts()
            )
            counts = runner.standby_counts()
            assert counts.unused >= 1 and counts.started == counts.used + counts.unused, counts
        _word_count(client)  # and calls still run


def test_embedded_clients_one_after_another_in_a_process_each_run_their_own_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Celery's tasks are shared by default: the first client's task, bound to its
    # (closed) runtime, was added to the second's app (and warned as a duplicate).
    monkeypatch.setenv("VESSEL_WORKSPACE_ROOT", str(tmp_path / "ws"))
    deployment = load_deployment(str(EXAMPLES / "deployment.toml"))
    for _ in range(2):
        with embedded_client(deployment, Settings(), "sandbox") as client:
            _word_count(client)


def test_a_one_off_embedded_client_sweeps_expired_workspaces_before_its_first_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vessel-workers call --turn …` without a broker ends long before the
    housekeeper's first sweep: the client sweeps once as it starts."""
    root = tmp_path / "ws"
    monkeypatch.setenv("VESSEL_WORKSPACE_ROOT", str(root))
    built = _recording_builds(monkeypatch)
    deployment = load_deployment(str(EXAMPLES / "deployment.toml"))
    with embedded_client(deployment, Settings(), "sandbox") as client:
        _word_count(client, turn="turn-old")
        (old,) = _workspaces(root)
        _word_count(client, turn="turn-young")
    (young,) = [ws for ws in _workspaces(root) if ws != old]
    aged = time.time() - 2 * built[0][1].ttl_seconds
    os.utime(old, (aged, aged))
    with embedded_client(deployment, Settings(), "sandbox"):
        assert not old.exists(), "the expired workspace outlived the next one-off client"
        assert young.exists()
