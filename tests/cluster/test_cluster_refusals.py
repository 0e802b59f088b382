"""A worker that cannot work refuses to start, with a message saying how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import REPO, Cluster, start_redis

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster({"svc-r": {}, "box-r": {}})


def worker(cluster: Cluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", *args, "-d", str(cluster.deployment_path)],
        env={**cluster.env, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_redis_that_may_evict_keys_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    proc, url = start_redis(tmp_path, policy="allkeys-lru")
    try:
        done = worker(cluster, "service", VESSEL_BROKER_URL=url)
    finally:
        proc.terminate()
        proc.wait(10)
    assert done.returncode == 2
    assert "maxmemory-policy allkeys-lru" in done.stderr
    assert "maxmemory-policy noeviction" in done.stderr  # how to fix it


def test_a_worker_without_a_broker_is_refused(cluster: Cluster) -> None:
    env = {k: v for k, v in cluster.env.items() if k != "VESSEL_BROKER_URL"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "worker",
            "service",
            "-d",
            str(cluster.deployment_path),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "VESSEL_BROKER_URL is not set" in done.stderr


def test_a_worker_dedicated_to_an_unknown_agent_is_refused(cluster: Cluster) -> None:
    done = worker(cluster, "service", "--agents", "svc-r,nobody")
    assert done.returncode == 2
    assert "nobody" in done.stderr


def test_a_missing_secret_stops_a_service_worker_naming_the_variable(
    cluster: Cluster, tmp_path: Path
) -> None:
    deployment = cluster.deployment_path.read_text().replace(
        'url = "http', 'headers = { "X-Token" = "env:VESSEL_TEST_TOKEN" }\nurl = "http', 1
    )
    path = cluster.deployment_path.with_name("secret.toml")
    path.write_text(deployment)
    env = {k: v for k, v in cluster.env.items() if k != "VESSEL_TEST_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "service", "-d", str(path)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "VESSEL_TEST_TOKEN" in done.stderr
    assert os.environ.get("VESSEL_TEST_TOKEN") is None
