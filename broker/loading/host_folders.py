"""Host folders the sandbox is shown (packages, data mounts, later plugin folders).

One rule for every folder bound into a sandbox: the tool reads whatever the
folder holds, at any depth, so a folder is refused when it would show

- the host's root folder (everything, the deployment file included);
- the deployment file, whose grants may hold literal header values;
- the workspace root (`$VESSEL_WORKSPACE_ROOT`), where other turns' and
  other agents' workspaces live, or any folder inside it or holding it;
- the kernel's own trees, /proc, /sys and /dev (or anything under them).

Paths are compared resolved, so a symlink or a `..` cannot walk around the rule.
"""

from __future__ import annotations

import os
from pathlib import Path

from broker.constants import DEFAULT_WORKSPACE_ROOT, ENV_WORKSPACE_ROOT

__all__ = ["KERNEL_FOLDERS", "exposed_folder_problem", "workspace_root"]

#: Host trees that belong to the kernel: never a package or data folder.
KERNEL_FOLDERS: tuple[Path, ...] = (Path("/proc"), Path("/sys"), Path("/dev"))


def workspace_root() -> Path:
    """The host folder of the per-turn workspaces: $VESSEL_WORKSPACE_ROOT, else the default."""
    value = os.environ.get(ENV_WORKSPACE_ROOT, "").strip()
    return Path(value) if value else DEFAULT_WORKSPACE_ROOT


def exposed_folder_problem(folder: Path, deployment_file: Path) -> str | None:
    """Why binding host `folder` into a sandbox would show what it must not, or None.

    `folder` and `deployment_file` are resolved paths; the answer completes a
    sentence whose subject is the folder as the operator wrote it.
    """
    if folder == Path(folder.anchor):
        return "is the host's root folder: name the folder itself"
    if deployment_file.is_relative_to(folder):
        # Grants may hold literal header values: the sandbox never sees a secret.
        return "holds the deployment file, whose grants may hold secrets"
    for kernel in KERNEL_FOLDERS:
        if folder.is_relative_to(kernel):
            return f"is inside {kernel}, the kernel's own folder"
    workspaces = workspace_root().resolve()
    if folder.is_relative_to(workspaces):
        return f"is inside the workspace root {str(workspaces)!r} (${ENV_WORKSPACE_ROOT})"
    if workspaces.is_relative_to(folder):
        return f"holds the workspace root {str(workspaces)!r} (${ENV_WORKSPACE_ROOT})"
    return None
