"""`host.workspace` through routed workspace operations (`RoutedFiles`) never waits
longer than its call: cancelled, or out of time, against a real Redis that no sandbox
worker consumes. The answers of routed operations across real hosts are in
tests/cluster/test_cluster_plugin_workspace.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import VesselClient
from broker.config import Settings
from broker.model import Deployment
from workers.plugin.host import HostFailed, PluginHost
from workers.plugin.host.routed import RoutedFiles

from .host_support import HostSetup, make_agent, make_plugin


def _setup(files: RoutedFiles, *, disk_limit_mb: int = 1) -> HostSetup:
    plugin = make_plugin()
    agent = make_agent((plugin,), disk_limit_mb=disk_limit_mb)
    deployment = Deployment(
        path=Path("deployment.toml"), agents={agent.id: agent}, plugins={plugin.slug: plugin}
    )
    host = PluginHost(deployment, workspaces=files, environ={})
    return HostSetup(host=host, plugin=plugin, agent=agent, workspaces=None)


@pytest.fixture
def no_worker(redis_url: str) -> Iterator[HostSetup]:
    """Routed operations to a broker no sandbox worker consumes: they never get an answer."""
    setup = _setup(RoutedFiles(lambda: VesselClient(deployment, Settings(broker_url=redis_url))))
    deployment = Deployment(
        path=Path("deployment.toml"), agents={setup.agent.id: setup.agent}, plugins={}
    )
    try:
        yield setup
    finally:
        setup.host.close()


def test_a_host_call_stops_waiting_when_its_call_ends(no_worker: HostSetup) -> None:
    ended = threading.Event()
    threading.Timer(0.3, ended.set).start()
    # 10 s left in the call and 30 s for the operation: only the end stops the wait.
    with pytest.raises(HostFailed, match=r"host\.workspace\.read failed: the call ended"):
        no_worker.call("workspace.read", "a.txt", cancel=ended, seconds=10)


def test_a_host_call_waits_no_longer_than_its_call_has_left(no_worker: HostSetup) -> None:
    with pytest.raises(HostFailed, match=r"no answer from the turn.s home host within 0\.[45]"):
        no_worker.call("workspace.write", "a.txt", "x", seconds=0.5)
    with pytest.raises(HostFailed, match="the call's time is up"):
        no_worker.call("workspace.write", "a.txt", "x", seconds=0)
