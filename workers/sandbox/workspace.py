"""Per-turn workspaces: the only place a tool may write (/tmp/vessel in the sandbox).

Layout under the root (mode 0700 at every level, owned by the worker's user):

    <root>/<agent id>/<turn key>/        one turn's workspace, kept between its calls
    <root>/<agent id>/.call-<random>/    a one-call workspace (turn None), removed after it
    <root>/.outbox/<random>/             one call's $VESSEL_OUTBOX, removed once read

A turn id is the platform's, so it is never used as a path as is: it becomes a
fixed-length hex key (sha256), which also keeps `..` and `/` out of paths.
Each call gets its own outbox folder, bind-mounted over the workspace's
`outbox/`: two calls of one turn running at once (parallel tool calls) never
see or clear each other's files, and nothing a tool leaves there survives it.

A workspace's modification time is refreshed at each use; `sweep` removes those
idle past the TTL (run it periodically: the sandbox worker does at start and
between calls).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

from broker.constants import ENV_WORKSPACE_ROOT

__all__ = ["DEFAULT_WORKSPACE_ROOT", "WorkspaceStore", "default_workspace_root", "remove_tree"]

#: Used when $VESSEL_WORKSPACE_ROOT is unset: a root-only folder on local disk.
#: /var/lib is where a service keeps its state; /tmp would let other users
#: pre-create the path.
DEFAULT_WORKSPACE_ROOT = Path("/var/lib/vessel-workers/workspaces")

_ONE_CALL_PREFIX = ".call-"
_OUTBOXES = ".outbox"


def default_workspace_root() -> Path:
    """$VESSEL_WORKSPACE_ROOT, else `DEFAULT_WORKSPACE_ROOT`."""
    value = os.environ.get(ENV_WORKSPACE_ROOT, "").strip()
    return Path(value) if value else DEFAULT_WORKSPACE_ROOT


def _turn_key(turn: str) -> str:
    return hashlib.sha256(turn.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def remove_tree(path: Path) -> None:
    """Remove a workspace whatever a tool left in it (read-only dirs included)."""

    def onerror(func: object, name: str, exc: object) -> None:
        # A tool may chmod a folder 000: make it writable and retry once.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o700)
            os.chmod(name, 0o700)
        with contextlib.suppress(OSError):
            if os.path.isdir(name) and not os.path.islink(name):
                shutil.rmtree(name, ignore_errors=True)
            else:
                os.unlink(name)

    if path.is_symlink():
        path.unlink()
        return
    if path.exists():
        shutil.rmtree(path, onerror=onerror)


class WorkspaceStore:
    """One workspace per (agent, turn) under `root`, mode 0700."""

    def __init__(self, root: Path, *, ttl_seconds: float = 3600.0) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, not {ttl_seconds!r}.")
        self.root = Path(root)
        self.ttl_seconds = ttl_seconds
        self._lock = threading.Lock()
        #: Parent folders made (and chmod-ed) once by this store: the root, the
        #: agents' folders, the outboxes' folder. Nothing here removes them; if
        #: something else does, the next mkdir below fails and they are redone.
        self._ready: set[Path] = set()
        self._resolved_root: Path | None = None

    def _agent_dir(self, agent_id: str) -> Path:
        if not agent_id or "/" in agent_id or agent_id.startswith("."):
            raise ValueError(f"{agent_id!r} is not an agent id.")
        return self.root / agent_id

    def _ensure_dir(self, path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)

    def _ensure_parents(self, *paths: Path) -> None:
        """`_ensure_dir` each of `paths` not yet made by this store (under the lock)."""
        for path in paths:
            if path not in self._ready:
                self._ensure_dir(path)
                self._ready.add(path)

    def _make_fresh(self, path: Path, *parents: Path) -> None:
        """mkdir `path` (0700) under `parents`, redoing them if they went missing."""
        with self._lock:
            self._ensure_parents(*parents)
            try:
                path.mkdir(mode=0o700)
            except FileNotFoundError:
                self._ready.difference_update(parents)
                self._ensure_parents(*parents)
                path.mkdir(mode=0o700)

    def for_turn(self, agent_id: str, turn: str | None) -> Path:
        """The turn's workspace, created if absent; turn None gives a fresh one-call one.

        A one-call workspace is the caller's to remove (`discard`) after the call.
        """
        agent_dir = self._agent_dir(agent_id)
        if turn is None:
            path = agent_dir / f"{_ONE_CALL_PREFIX}{secrets.token_hex(12)}"
            self._make_fresh(path, self.root, agent_dir)  # new: its mtime is now
            return path
        with self._lock:
            self._ensure_dir(self.root)
            self._ensure_dir(agent_dir)
            path = agent_dir / _turn_key(turn)
            self._ensure_dir(path)
            os.utime(path)
        return path

    def new_outbox(self) -> Path:
        """A fresh, empty folder for one call's $VESSEL_OUTBOX (remove it with `discard`)."""
        path = self.root / _OUTBOXES / secrets.token_hex(12)
        self._make_fresh(path, self.root, self.root / _OUTBOXES)
        return path

    def is_one_call(self, path: Path) -> bool:
        """True for a workspace made by `for_turn(..., None)`."""
        return path.name.startswith(_ONE_CALL_PREFIX)

    def discard(self, path: Path) -> None:
        """Remove a workspace by path (a one-call workspace after its call)."""
        if self._resolved_root is None:
            self._resolved_root = self.root.resolve()
        if self._resolved_root not in path.resolve().parents:
            raise ValueError(f"{path} is not a workspace under {self.root}.")
        # Fast path: a call that left nothing (an empty outbox, a one-call
        # workspace holding only its empty outbox/); rmdir never follows a link.
        # Anything else (ENOTEMPTY, ENOTDIR...) goes the thorough way.
        with contextlib.suppress(OSError):
            if self.is_one_call(path):
                os.rmdir(path / "outbox")
            os.rmdir(path)
            return
        remove_tree(path)

    def touch(self, path: Path) -> None:
        """Mark a workspace as used now (the TTL counts from the last use)."""
        with contextlib.suppress(OSError):
            os.utime(path)

    def end_turn(self, agent_id: str, turn: str) -> None:
        """Remove the turn's workspace (nothing happens if it is already gone)."""
        remove_tree(self._agent_dir(agent_id) / _turn_key(turn))

    def sweep(self) -> int:
        """Remove workspaces idle past the TTL; return how many were removed."""
        if not self.root.is_dir():
            return 0
        cutoff = time.time() - self.ttl_seconds
        removed = 0
        for agent_dir in self.root.iterdir():
            if agent_dir.name != _OUTBOXES and (
                agent_dir.name.startswith(".") or not agent_dir.is_dir()
            ):
                continue
            for ws in agent_dir.iterdir():
                try:
                    idle = ws.lstat().st_mtime < cutoff
                except FileNotFoundError:
                    continue
                if idle:
                    remove_tree(ws)
                    removed += 1
        return removed
