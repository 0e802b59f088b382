"""Paths inside the sandbox an operator names: the workdir and mount targets.

The sandbox's layout is fixed (workers/sandbox/bwrap.py): the system folders
come from the host, /agent is the package, /tmp/vessel the turn's workspace.
A data mount may not cover any of them, nor sit inside one, or the tool
would see something other than what the layout promises.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from broker.constants import PACKAGE_PATH, SANDBOX_HOME, SYSTEM_FOLDERS

__all__ = ["mount_target_problem", "sandbox_path_problem", "workdir_problem"]

# A workdir may lie in these (the package, the workspace under /tmp, or / itself);
# the other system folders are the host's own and not a place to work in.
_WORKDIR_ALLOWED_SYSTEM = frozenset({"/", PACKAGE_PATH, "/tmp"})


def sandbox_path_problem(path: str) -> str | None:
    """Why `path` is not an absolute, normalised sandbox path, or None."""
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path (it must start with /)"
    if any(not c.isprintable() for c in path):
        return f"{path!r} holds control characters"
    if ".." in path.split("/"):
        return f'{path!r} may not hold a ".." segment'
    normal = str(PurePosixPath(path))
    # PurePosixPath keeps a leading "//" (POSIX leaves it implementation-defined).
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    if normal != path:
        return f"{path!r} is not normalised (write {normal!r})"
    return None


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder` or below it."""
    p, f = PurePosixPath(path), PurePosixPath(folder)
    return p == f or f in p.parents


def mount_target_problem(target: str) -> str | None:
    """Why a data mount may not be at `target`, or None."""
    problem = sandbox_path_problem(target)
    if problem is not None:
        return problem
    if target == "/":
        return "cannot mount over / (the sandbox's root)"
    if target == PACKAGE_PATH:
        return f"cannot mount over {PACKAGE_PATH} (the agent package)"
    if _inside(target, SANDBOX_HOME) or _inside(SANDBOX_HOME, target):
        return f"cannot mount over or inside the turn's workspace {SANDBOX_HOME}"
    for folder in sorted(SYSTEM_FOLDERS - {"/"}):
        if _inside(target, folder):
            return f"cannot mount inside the system folder {folder}"
        if _inside(folder, target):
            return f"cannot mount over the system folder {folder}"
    return None


def workdir_problem(workdir: str) -> str | None:
    """Why `workdir` cannot be where tool commands start, or None."""
    problem = sandbox_path_problem(workdir)
    if problem is not None:
        return problem
    for folder in sorted(SYSTEM_FOLDERS - _WORKDIR_ALLOWED_SYSTEM):
        if _inside(workdir, folder):
            return f"cannot be inside the system folder {folder}"
    return None
