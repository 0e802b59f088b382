"""`[agents.mounts]`: sandbox path = host folder (relative to the deployment file), read-only."""

from __future__ import annotations

from pathlib import Path

from broker.loading.fields import Table, field_path, type_name
from broker.loading.sandbox_paths import mount_target_problem

__all__ = ["read_mounts"]


def _exposes_too_much(folder: Path, deployment_file: Path) -> str | None:
    """Why mounting host `folder` would show the sandbox what it must not see, or None."""
    if folder == Path(folder.anchor):
        return "is the host's root folder: mount the data folder itself"
    if deployment_file.is_relative_to(folder):
        # Grants may hold literal header values: the sandbox never sees a secret.
        return "holds the deployment file, whose grants may hold secrets"
    return None


def read_mounts(agent: Table, base: Path, deployment_file: Path) -> dict[str, Path] | None:
    """Target -> resolved host folder; None when a mount has problems (each added).

    `base` is the deployment file's folder, `deployment_file` its resolved path.
    """
    if not agent.has("mounts"):
        return {}
    raw = agent.mapping("mounts")
    if raw is None:
        return None
    found = len(agent.problems)
    mounts: dict[str, Path] = {}
    for target, source in raw.items():
        at = field_path(agent.field("mounts"), target)
        problem = mount_target_problem(target)
        if problem is not None:
            agent.problems.add(agent.file, at, problem)
        if not isinstance(source, str):
            agent.problems.add(
                agent.file, at, f"must be a string (a folder), not {type_name(source)}"
            )
            continue
        if not source:
            agent.problems.add(agent.file, at, "must name a folder")
            continue
        folder = base / source
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            agent.problems.add(agent.file, at, f"{str(folder)!r} {what}")
            continue
        resolved = folder.resolve()
        exposed = _exposes_too_much(resolved, deployment_file)
        if exposed is not None:
            agent.problems.add(agent.file, at, f"{source!r} {exposed}")
            continue
        mounts[target] = resolved
    if len(agent.problems) > found:
        return None
    return mounts
