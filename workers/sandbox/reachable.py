"""A root worker's check that the sandbox uid can reach what a call binds.

A root worker's calls run as the sandbox uid (`identity.py`), so the workspace
root must be searchable by it and each agent's package folder and data mounts
readable by it. A call whose are not gets a clear error naming sandbox paths
only (the host path goes to the log for the operator), not bwrap's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from broker.constants import PACKAGE_PATH
from broker.model import Agent
from workers.sandbox.identity import ENV_SANDBOX_UID, SandboxIdentity, unreachable
from workers.sandbox.workspace import WorkspaceStore

__all__ = ["ReachabilityCheck"]

#: A package or data folder found readable by the sandbox uid is checked again
#: after this long (the check stats every folder above it: ~0.1 ms each; a
#: folder made unreadable meanwhile fails its bind, with a scrubbed bwrap error).
_READABLE_SECONDS = 10.0

_log = logging.getLogger("workers.sandbox.runner")


class ReachabilityCheck:
    """What the sandbox uid was found able to reach, remembered for a while."""

    def __init__(self, workspaces: WorkspaceStore, identity: SandboxIdentity) -> None:
        self.workspaces = workspaces
        self.identity = identity
        #: The workspace root was found reachable by the sandbox uid (checked once).
        self._root_reachable = False
        #: Host folders found readable by the sandbox uid, and when (monotonic).
        self._readable: dict[Path, float] = {}

    def refusal(self, agent: Agent) -> str | None:
        """A root worker's check that the sandbox uid can read what a call binds:
        None if it can, else the call's error (sandbox paths only; the host path
        goes to the log for the operator)."""
        uid, gid = self.identity.uid, self.identity.gid
        if not self._root_reachable:
            self.workspaces.ensure_root()
            blocked = unreachable(self.workspaces.root, uid, gid, read=False)
            if blocked is not None:
                _log.warning(
                    "sandbox: %s is not searchable by uid %d (gid %d), so the workspace root "
                    "%s cannot be bound: make every folder above the root searchable by it "
                    "(chmod o+x) or set VESSEL_WORKSPACE_ROOT elsewhere",
                    blocked,
                    uid,
                    gid,
                    self.workspaces.root,
                )
                return (
                    f"[sandbox error: the workspace root is not reachable by the sandbox's "
                    f"uid {uid} (see the worker's log)]"
                )
            self._root_reachable = True
        sources = [(PACKAGE_PATH, "the agent folder", agent.package_dir)]
        sources += [(target, "the data mount", src) for target, src in sorted(agent.mounts.items())]
        now = time.monotonic()
        for shown, what, host in sources:
            if now - self._readable.get(host, -_READABLE_SECONDS) < _READABLE_SECONDS:
                continue
            blocked = unreachable(host, uid, gid)
            if blocked is None:
                self._readable[host] = now
                continue
            _log.warning(
                "sandbox: agent %s: %s %s (%s) is not readable by uid %d (gid %d): %s is "
                "not %s by it",
                agent.id,
                what,
                host,
                shown,
                uid,
                gid,
                blocked,
                "readable" if blocked == host.resolve() else "searchable",
            )
            return (
                f"[sandbox error: {what} {shown} is not readable by the sandbox's uid {uid}: "
                f"its host folder, and every folder above it, must be readable by that uid "
                f"(or set {ENV_SANDBOX_UID} to one that can read it)]"
            )
        return None
