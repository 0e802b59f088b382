"""Shared fixtures: a real Redis server started on a free port for the session,
and a clean database for each test that asks for one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bench.redis_server import free_port, start_redis_server

__all__ = ["EXAMPLES", "REPO", "free_port"]

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def pytest_configure(config: pytest.Config) -> None:
    """Run as root, the sandbox's calls are an unprivileged uid (docs/confinement.md)
    that must reach the packages, data and workspace roots tests make in their temp
    folders. pytest makes those 0700 under /tmp/pytest-of-root, which every root
    session on the host resets to 0700: so a root session gets a base folder of
    its own (removed at its end, unless --basetemp is given), and each new temp
    folder, and the folders above it, is made searchable by others (0711, never
    listable)."""
    if os.geteuid() != 0:
        return
    if config.option.basetemp is None:
        base = Path(tempfile.mkdtemp(prefix="vessel-tests-"))
        os.chmod(base, 0o711)
        config.option.basetemp = str(base / "base")
        config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))
    made = pytest.TempPathFactory.mktemp

    def mktemp(self: pytest.TempPathFactory, basename: str, numbered: bool = True) -> Path:
        path = made(self, basename, numbered)
        top = Path(tempfile.gettempdir()).resolve()
        for folder in (path, *path.parents):
            if folder == top or top not in folder.parents:
                break
            mode = folder.stat().st_mode
            if not mode & 0o001:
                folder.chmod((mode & 0o7777) | 0o011)
        return path

    pytest.TempPathFactory.mktemp = mktemp  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server of our own (noeviction, no persistence), as a base URL."""
    server = start_redis_server(tmp_path_factory.mktemp("redis"), databases=64)
    try:
        yield server.url
    finally:
        server.stop()


_next_db = iter(range(1, 64))


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """A Redis database no other test in this session uses, flushed before use."""
    db = next(_next_db, None)
    if db is None:  # more than 63 tests asked: reuse database 63, flushed
        db = 63
    url = f"{redis_server}/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    yield url


#: Modules whose tests start real worker clusters with tool limits of a few seconds:
#: under pytest-xdist they share one group (one process), so two of them never run at once.
_CLUSTER_FOLDERS = ("cluster", "watch")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test an xdist_group (`--dist loadgroup`, pyproject.toml): its module's,
    so a module's fixtures start once, or one shared by the cluster modules."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = item.path.relative_to(REPO / "tests")
        group = "cluster" if path.parts[0] in _CLUSTER_FOLDERS else str(path)
        item.add_marker(pytest.mark.xdist_group(group))
