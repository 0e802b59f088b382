"""Per-turn workspaces: the only place a tool may write (/tmp/vessel in the sandbox).

Layout under the root (mode 0700 at every level, owned by the worker's user):

    <root>/<agent id>/<turn key>/        one turn's workspace, kept between its calls
    <root>/<agent id>/.call-<random>/    a one-call workspace (turn None), removed after it
    <root>/.outbox/<random>/             one call's $VESSEL_OUTBOX, removed once read
    <root>/.turn-secret                  the key of turn keys (0600), made at the first turn

For a root worker, whose calls run as the sandbox uid (`identity.py`), the
workspaces and outboxes belong to that uid (0700) and the folders above them
(the root, the agents' folders, `.outbox`, `.system`) to root with mode 0710
and the sandbox gid: that gid may pass through them, nobody else may even do
that. Ownership and modes are set through a descriptor opened with O_NOFOLLOW:
never through a symlink.

A one-call workspace holds its call's outbox as its own `outbox/` (nothing
else shares it); a turn's workspace is shared by the turn's calls, so each
of those gets a folder of its own under `.outbox`, bound over `outbox/`.

Both are handed to a background thread once the call's result is made
(`discard_later`), off the call's path: the sandbox that used them is dead by
then, and nothing of theirs is read again. That thread keeps a couple of them
ready for later calls (`for_turn(..., None)` and `new_outbox` hand those out
first): one the call left as a new mkdir would make it (`looks_fresh`: empty,
the same mode, owner, size, extended attributes and inode flags as a folder
this store just made in the same parent) is kept as it is, which spares a
mkdir and an rmdir per call (on ext4 about 0.5 ms of CPU together, and the
rmdir of a former mount point waits for its namespace's teardown); anything
else is removed and a fresh one made instead. `close` removes them, and the
parents left empty, so a worker that only ran calls without a turn leaves
nothing behind.

A turn id is the platform's, so it is never used as a path as is: it becomes a
fixed-length hex key, an HMAC-SHA256 of the turn id under a secret kept in the
root (`.turn-secret`, 0600, shared by every worker of that root, never
mounted). A plain hash would let a tool that reads its mount table
(/proc/self/mountinfo shows the workspace's host path) confirm a guess of its
turn id; the key also keeps `..` and `/` out of paths.
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
import hmac
import os
import queue
import secrets
import threading
import time
from pathlib import Path

from broker.constants import DEFAULT_WORKSPACE_ROOT
from broker.loading.host_folders import workspace_root
from workers.sandbox.folder_state import FolderState, folder_state
from workers.sandbox.folders import remove_tree, set_owner, share_with_workspace_owner
from workers.sandbox.identity import SandboxIdentity

__all__ = [
    "DEFAULT_WORKSPACE_ROOT",
    "OUTBOX_NAME",
    "WorkspaceStore",
    "default_workspace_root",
    # Folder operations (`folders.py`), named here too for the workspaces' users.
    "remove_tree",
    "set_owner",
    "share_with_workspace_owner",
]


_ONE_CALL_PREFIX = ".call-"
#: Tries at making a parent folder that another worker's close keeps removing.
_PARENT_ATTEMPTS = 20
#: A one-call workspace's own outbox folder ($VESSEL_OUTBOX is /tmp/vessel/outbox).
OUTBOX_NAME = "outbox"
#: Hex characters of a one-call workspace's or an outbox's random name.
_RANDOM_CHARS = 24
#: Folders of each kind the janitor keeps ready, per parent. Two slots' calls in a
#: burst outrun a janitor holding two: 4% of a 500-call burst's calls made their
#: own (a mkdir, then an rmdir once the janitor caught up); with four, 0.4%.
_SPARES = 4
#: The janitor thread (`discard_later`) ends after this long without work.
_JANITOR_IDLE_SECONDS = 10.0
_OUTBOXES = ".outbox"
#: The slot launchers' hole folders (`launcher_holes.py`), one per launcher.
_HOLES = ".holes"
#: The HMAC key of turn keys: 32 random bytes, 0600, in the root.
_TURN_SECRET = ".turn-secret"  # noqa: S105 (a file name, not a secret)
_SECRET_BYTES = 32
#: Hex characters of a turn key (128 bits of the HMAC).
_TURN_KEY_CHARS = 32
#: A root worker's parents: root's, searchable by the sandbox gid only.
_PARENT_MODE = 0o710


def default_workspace_root() -> Path:
    """$VESSEL_WORKSPACE_ROOT, else `DEFAULT_WORKSPACE_ROOT` (the rule lives in broker)."""
    return workspace_root()


def _turn_key(secret: bytes, turn: str) -> str:
    digest = hmac.new(secret, turn.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return digest.hexdigest()[:_TURN_KEY_CHARS]


class WorkspaceStore:
    """One workspace per (agent, turn) under `root`, mode 0700."""

    def __init__(
        self,
        root: Path,
        *,
        ttl_seconds: float = 3600.0,
        identity: SandboxIdentity | None = None,
    ) -> None:
        """`identity`: whose calls use the workspaces (default: this worker's,
        `SandboxIdentity.for_worker`, which raises ValueError for a bad setting)."""
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, not {ttl_seconds!r}.")
        self.root = Path(root)
        self.ttl_seconds = ttl_seconds
        self.identity = identity if identity is not None else SandboxIdentity.for_worker()
        self._secret: bytes | None = None
        self._lock = threading.Lock()
        #: Parent folders made (and chmod-ed) once by this store: the root, the
        #: agents' folders, the outboxes' folder. Nothing here removes them; if
        #: something else does, the next mkdir below fails and they are redone.
        self._ready: set[Path] = set()
        self._resolved_root: Path | None = None
        #: Folders `discard_later` hands to this process's janitor thread.
        self._later: queue.Queue[Path] = queue.Queue()
        self._janitor_pid: int | None = None
        #: Fresh folders the janitor made ahead, by parent: one-call workspaces
        #: (with their outbox/ mount point) and outboxes. This process's only.
        self._spares: dict[Path, list[Path]] = {}
        self._spares_pid = os.getpid()
        #: What a folder this store just made looks like, by parent (a one-call
        #: workspace's outbox/: by the workspace's parent and the name): what
        #: a used one must still look like to be handed out again.
        self._fresh: dict[tuple[Path, str], FolderState] = {}

    def _agent_dir(self, agent_id: str) -> Path:
        if not agent_id or "/" in agent_id or agent_id.startswith("."):
            raise ValueError(f"{agent_id!r} is not an agent id.")
        return self.root / agent_id

    def _ensure_dir(self, path: Path) -> None:
        """A parent folder: 0700, or root's 0710 with the sandbox gid for a root worker.

        Another worker's `close` removes the parents it made once they are
        empty, so one may vanish between our mkdir and chmod (or between the
        EEXIST and the is_dir that `exist_ok` checks it with): made again.
        """
        for attempt in range(_PARENT_ATTEMPTS):
            try:
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
                if self.identity.drop:
                    set_owner(path, uid=os.geteuid(), gid=self.identity.gid, mode=_PARENT_MODE)
                else:
                    os.chmod(path, 0o700)
                return
            except (FileExistsError, FileNotFoundError):
                if attempt == _PARENT_ATTEMPTS - 1 or path.is_symlink():
                    raise

    def _give(self, path: Path) -> None:
        """A workspace or an outbox, just made or about to be used: the sandbox uid's, 0700."""
        if self.identity.drop:
            set_owner(path, uid=self.identity.uid, gid=self.identity.gid, mode=0o700)

    def _turn_secret(self) -> bytes:
        """The root's HMAC key of turn keys, made once (atomically: a link of a full file)."""
        if self._secret is not None:
            return self._secret
        path = self.root / _TURN_SECRET
        try:
            secret = self._read_secret(path)
        except FileNotFoundError:
            tmp = self.root / f"{_TURN_SECRET}.{secrets.token_hex(6)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, secrets.token_bytes(_SECRET_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # EEXIST: another worker made it first; use theirs
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
            secret = self._read_secret(path)
        self._secret = secret
        return secret

    @staticmethod
    def _read_secret(path: Path) -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            secret = os.read(fd, _SECRET_BYTES + 1)
        finally:
            os.close(fd)
        if len(secret) != _SECRET_BYTES:
            raise ValueError(f"{path} is not a turn secret ({len(secret)} bytes): remove it.")
        return secret

    def turn_dir(self, agent_id: str, turn: str) -> Path:
        """Where the turn's workspace is (made or not)."""
        with self._lock:
            self._ensure_parents(self.root)
            secret = self._turn_secret()
        return self._agent_dir(agent_id) / _turn_key(secret, turn)

    def ensure_root(self) -> None:
        """Make the root (0700, or 0710 root:sandbox gid for a root worker) if needed."""
        with self._lock:
            self._ensure_parents(self.root)

    def _ensure_parents(self, *paths: Path) -> None:
        """`_ensure_dir` each of `paths` not yet made by this store (under the lock)."""
        for path in paths:
            if path not in self._ready:
                self._ensure_dir(path)
                self._ready.add(path)

    def _make_fresh(self, path: Path, *parents: Path) -> None:
        """mkdir `path` (0700) under `parents`, redoing them if they went missing;
        a one-call workspace with its outbox/."""
        with self._lock:
            for attempt in range(_PARENT_ATTEMPTS):
                self._ensure_parents(*parents)
                try:
                    path.mkdir(mode=0o700)
                    break
                except FileNotFoundError:  # a parent removed by another worker's close
                    if attempt == _PARENT_ATTEMPTS - 1:
                        raise
                    self._ready.difference_update(parents)
        self._fill(path)

    def _fill(self, path: Path) -> None:
        """Finish a folder just made: a one-call workspace's outbox/ in it, both
        given to the sandbox uid; their looks kept as the fresh ones' (`_fresh`)."""
        one_call = self.is_one_call(path)
        if one_call:
            (path / OUTBOX_NAME).mkdir(mode=0o700)
            self._give(path / OUTBOX_NAME)
        self._give(path)
        key = (path.parent, "")
        if key not in self._fresh:
            with contextlib.suppress(OSError):
                self._fresh[key] = folder_state(path)
                if one_call:
                    self._fresh[(path.parent, OUTBOX_NAME)] = folder_state(path / OUTBOX_NAME)

    def looks_fresh(self, path: Path) -> bool:
        """True if `path` (a used one-call workspace or outbox) looks as a folder this
        store just made in the same parent does: empty (a one-call workspace: but
        for its outbox/, which looks fresh too), and the same type, mode, owner,
        group, size, link count, extended attributes (ACLs among them) and inode
        flags. A tool may chmod or chattr its folders, set an ACL or an
        encryption policy: those are never handed to a later call."""
        parent = path.parent
        fresh = self._fresh.get((parent, ""))
        if fresh is None or not fresh.comparable:
            return False
        try:
            if folder_state(path) != fresh:
                return False
            if not self.is_one_call(path):
                return True
            inner = self._fresh.get((parent, OUTBOX_NAME))
            return inner is not None and folder_state(path / OUTBOX_NAME) == inner
        except OSError:
            return False

    def _take_spare(self, parent: Path) -> Path | None:
        """A folder the janitor made ahead under `parent`, its mtime now; None if none."""
        with self._lock:
            if self._spares_pid != os.getpid():  # a forked child: the parent's are the parent's
                self._spares, self._spares_pid = {}, os.getpid()
            stock = self._spares.get(parent)
            path = stock.pop() if stock else None
        if path is None:
            return None
        try:
            # Well inside the TTL, so `sweep` cannot be removing it now.
            if time.time() - path.lstat().st_mtime > self.ttl_seconds / 2:
                raise FileNotFoundError(path)
            os.utime(path, follow_symlinks=False)
        except OSError:
            self.discard_later(path)
            return None
        return path

    def _make_spare(self, used: Path) -> None:
        """In the janitor: make a fresh folder like `used` (just discarded) for a later call."""
        parent = used.parent
        with self._lock:
            if self._spares_pid != os.getpid() or len(self._spares.get(parent, ())) >= _SPARES:
                return
        spare = parent / f"{used.name[:-_RANDOM_CHARS]}{secrets.token_hex(_RANDOM_CHARS // 2)}"
        try:
            spare.mkdir(mode=0o700)
            self._fill(spare)
        except OSError:
            return
        with self._lock:
            self._spares.setdefault(parent, []).append(spare)

    def _keep_as_spare(self, used: Path) -> bool:
        """In the janitor: keep `used` for a later call if it looks fresh and a spare
        is wanted; False: it must be removed."""
        parent = used.parent
        with self._lock:
            if self._spares_pid != os.getpid() or len(self._spares.get(parent, ())) >= _SPARES:
                return False
        if not self.looks_fresh(used):
            return False
        with self._lock:
            self._spares.setdefault(parent, []).append(used)
        return True

    def for_turn(self, agent_id: str, turn: str | None) -> Path:
        """The turn's workspace, created if absent; turn None gives a fresh one-call one
        (holding its call's outbox, `outbox/`, empty and the sandbox uid's).

        A one-call workspace is the caller's to remove (`discard`) after the call.
        """
        agent_dir = self._agent_dir(agent_id)
        if turn is None:
            spare = self._take_spare(agent_dir)
            if spare is not None:
                return spare
            path = agent_dir / f"{_ONE_CALL_PREFIX}{secrets.token_hex(_RANDOM_CHARS // 2)}"
            self._make_fresh(path, self.root, agent_dir)  # new: its mtime is now
            return path
        with self._lock:
            self._ensure_dir(self.root)
            path = agent_dir / _turn_key(self._turn_secret(), turn)
            for attempt in range(_PARENT_ATTEMPTS):
                self._ensure_dir(agent_dir)
                try:
                    path.mkdir(mode=0o700, exist_ok=True)
                    break
                except FileNotFoundError:  # the agent's folder removed just now (`_ensure_dir`)
                    if attempt == _PARENT_ATTEMPTS - 1:
                        raise
            if self.identity.drop:
                self._give(path)
            else:
                os.chmod(path, 0o700)
            os.utime(path)
        return path

    def new_outbox(self) -> Path:
        """A fresh, empty folder for one call's $VESSEL_OUTBOX (remove it with `discard`)."""
        spare = self._take_spare(self.root / _OUTBOXES)
        if spare is not None:
            return spare
        path = self.root / _OUTBOXES / secrets.token_hex(_RANDOM_CHARS // 2)
        self._make_fresh(path, self.root, self.root / _OUTBOXES)
        return path

    def is_one_call(self, path: Path) -> bool:
        """True for a workspace made by `for_turn(..., None)`."""
        return path.name.startswith(_ONE_CALL_PREFIX)

    def _check_under_root(self, path: Path) -> None:
        if self._resolved_root is None:
            self._resolved_root = self.root.resolve()
        if self._resolved_root not in path.resolve().parents:
            raise ValueError(f"{path} is not a workspace under {self.root}.")

    def discard(self, path: Path) -> None:
        """Remove a workspace by path (a one-call workspace after its call)."""
        self._check_under_root(path)
        # Fast path: a call that left nothing (an empty outbox, a one-call
        # workspace holding only its empty outbox/); rmdir never follows a link.
        # Anything else (ENOTEMPTY, ENOTDIR...) goes the thorough way.
        with contextlib.suppress(OSError):
            if self.is_one_call(path):
                os.rmdir(path / OUTBOX_NAME)
            os.rmdir(path)
            return
        remove_tree(path)

    def discard_later(self, path: Path) -> None:
        """`discard`, done by a background thread: off the call's path.

        For a folder no process uses any more (a call's outbox once read, a
        one-call workspace after its call). Removing a folder that was a mount
        point in a sandbox's namespace waits for that namespace's teardown
        (about 1 ms each here). `flush` waits for what is pending; what a dead
        worker left pending, `sweep` removes once past the TTL. The janitor's
        `discard` checks that `path` is under the root (and skips it if not).
        """
        with self._lock:
            if self._janitor_pid != os.getpid():  # none running, or the parent's (a fork)
                # Empty here, or the parent's (its items and locks are the parent's).
                self._later = queue.Queue()
                threading.Thread(
                    target=self._janitor, args=(self._later,), name="workspace-janitor", daemon=True
                ).start()
                self._janitor_pid = os.getpid()
            self._later.put(path)

    def _janitor(self, later: queue.Queue[Path]) -> None:
        while True:
            try:
                path = later.get(timeout=_JANITOR_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:  # discard_later starts another one if it must
                    if later.empty():
                        self._janitor_pid = None
                        return
                continue
            try:
                with contextlib.suppress(OSError, ValueError):
                    reusable = self.is_one_call(path) or path.parent.name == _OUTBOXES
                    if reusable and self._keep_as_spare(path):
                        continue
                    self.discard(path)
                    if reusable:
                        self._make_spare(path)
            finally:
                later.task_done()

    def flush(self) -> None:
        """Wait until every `discard_later` folder of this process is removed."""
        if self._janitor_pid in (os.getpid(), None):
            self._later.join()

    def touch(self, path: Path) -> None:
        """Mark a workspace as used now (the TTL counts from the last use)."""
        with contextlib.suppress(OSError):
            os.utime(path)

    def has_turn(self, agent_id: str, turn: str) -> bool:
        """True if the turn's workspace exists here (turn affinity: was this host its home?)."""
        return self.turn_dir(agent_id, turn).is_dir()

    def end_turn(self, agent_id: str, turn: str) -> None:
        """Remove the turn's workspace (nothing happens if it is already gone)."""
        remove_tree(self.turn_dir(agent_id, turn))

    def holes_folder(self) -> Path:
        """The folder of the slot launchers' hole folders (`launcher_holes.py`): each
        an empty folder here, named `<worker pid>-<n>` (the tmpfs on it is in its
        launcher's own mount namespace only); those of processes gone are removed."""
        folder = self.root / _HOLES
        with self._lock:
            self._ensure_parents(self.root, folder)  # `close` removes it if empty
        with contextlib.suppress(OSError):
            for each in folder.iterdir():
                owner = each.name.split("-", 1)[0]
                if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    with contextlib.suppress(OSError):
                        each.rmdir()
        return folder

    def close(self) -> None:
        """Leave nothing of this process's behind: wait for the janitor, remove the
        spares it made, then the parent folders this store made if they are empty
        (another worker's next mkdir below them makes them again)."""
        self.flush()
        with self._lock:
            spares = [p for stock in self._spares.values() for p in stock]
            self._spares = {}
            parents = sorted(self._ready - {self.root}, key=lambda p: -len(p.parts))
            self._ready.clear()
        if self._spares_pid != os.getpid():
            spares = []  # a forked child's copy: the parent's to remove
        for spare in spares:
            with contextlib.suppress(OSError, ValueError):
                self.discard(spare)
        for parent in parents:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if empty

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
