"""Loading and validating a deployment and its agent packages.

    load_deployment(path)   the frozen `Deployment`, or `InvalidDeployment` listing every problem
    check_deployment(path)  every problem as a list (empty when valid)

A problem is one `FILE: FIELD: what is wrong` line: FILE as reachable from the
working directory (paths are joined to the deployment path, never resolved),
FIELD a dotted path such as `agents[1].services.records.url`.
"""

from __future__ import annotations

import os
from pathlib import Path

from broker.constants import ENV_PLUGIN_LOCK_DIR
from broker.errors import InvalidDeployment, Problem
from broker.loading.deployment import read_deployment
from broker.loading.fields import Problems
from broker.model import Deployment

__all__ = ["check_deployment", "default_lock_dir", "load_deployment"]


def default_lock_dir() -> Path | None:
    """`$VESSEL_PLUGIN_LOCK_DIR`, or None: each plugin's lock is in its own folder."""
    value = os.environ.get(ENV_PLUGIN_LOCK_DIR, "").strip()
    return Path(value) if value else None


def load_deployment(path: Path | str, *, lock_dir: Path | None = None) -> Deployment:
    """The deployment at `path`, validated; raises `InvalidDeployment` with all problems.

    `lock_dir`: where the plugins' locks are (None: `default_lock_dir()`).
    """
    problems = Problems()
    deployment = read_deployment(Path(path), problems, lock_dir=lock_dir or default_lock_dir())
    if deployment is None or problems:
        raise InvalidDeployment(problems.as_list())
    return deployment


def check_deployment(path: Path | str, *, lock_dir: Path | None = None) -> list[Problem]:
    """Every problem of the deployment at `path` and its packages; [] when it is valid."""
    problems = Problems()
    read_deployment(Path(path), problems, lock_dir=lock_dir or default_lock_dir())
    return problems.as_list()
