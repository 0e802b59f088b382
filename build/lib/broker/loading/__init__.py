"""Loading and validating a deployment and its agent packages.

    load_deployment(path)   the frozen `Deployment`, or `InvalidDeployment` listing every problem
    check_deployment(path)  every problem as a list (empty when valid)

A problem is one `FILE: FIELD: what is wrong` line: FILE as reachable from the
working directory (paths are joined to the deployment path, never resolved),
FIELD a dotted path such as `agents[1].services.records.url`.
"""

from __future__ import annotations

from pathlib import Path

from broker.errors import InvalidDeployment, Problem
from broker.loading.deployment import read_deployment
from broker.loading.fields import Problems
from broker.model import Deployment

__all__ = ["check_deployment", "load_deployment"]


def load_deployment(path: Path | str) -> Deployment:
    """The deployment at `path`, validated; raises `InvalidDeployment` with all problems."""
    problems = Problems()
    deployment = read_deployment(Path(path), problems)
    if deployment is None or problems:
        raise InvalidDeployment(problems.as_list())
    return deployment


def check_deployment(path: Path | str) -> list[Problem]:
    """Every problem of the deployment at `path` and its packages; [] when it is valid."""
    problems = Problems()
    read_deployment(Path(path), problems)
    return problems.as_list()
