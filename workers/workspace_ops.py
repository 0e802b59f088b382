"""Workspace operations on the host side: the task behind `client.files` (`broker.files`).

A sandbox worker receives an operation (put, get, list, delete) on its lane or
its home lane. It asks admission whether its host is the turn's home
(`take_home`, as a claim does for a call): if another live host is, the
operation is sent on to that host's home lane; if none is, this host becomes
it (emptying any folder it had of the turn when the turn was homed on a host
that died). Then it runs the operation in the turn's folder and stores the
answer as the task's result: `{"ok": true, ...}` or `{"ok": false, "error": ...}`.

Nothing a tool left in the workspace is trusted. Every path is opened part by
part, each relative to the folder opened before it (`dir_fd`), with
O_NOFOLLOW: a symlink is never followed, at any depth, so an operation never
leaves the workspace. Files are opened O_NONBLOCK (a fifo cannot hang the
worker) and fstat-checked to be regular. A put writes a fresh file next to the
target and renames it over (a tool reading at the same time sees the old file
or the new one, never half of one).

`perform` is the one implementation of these operations: `client.files` runs
it on the turn's home host, and so does a plugin's `host.workspace` (routed
there, or straight here when the plugin runs in the embedded default). Each
refusal carries a `reason` (`broker.files.REASONS`) besides its sentence, so a
caller can answer each kind of refusal its own way. A get takes `max_bytes`, a
list `max_entries` (lower than the caps, never higher), a delete `only_empty`
(a folder goes only when it holds nothing).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery

from broker.errors import UnknownAgent
from broker.files import MAX_FILE_BYTES, MAX_LIST_ENTRIES, OPERATIONS, REASONS, check_path
from broker.queues import WORKSPACE_OP_TASK, home_lane
from workers.sandbox.folders import DIR_FLAGS, share_with_workspace_owner

if TYPE_CHECKING:
    from workers.tasks import CallRuntime

__all__ = ["MAX_HOPS", "OpRefused", "perform", "register_workspace_ops", "run_workspace_op"]

_log = logging.getLogger(__name__)

#: Times an operation may be sent on to another host before it gives up: the
#: home changes only when a host dies, so more means hosts keep dying.
MAX_HOPS = 4
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1024 * 1024
_TEMPORARY_PREFIX = ".vessel-put-"


class OpRefused(Exception):
    """An operation that cannot be done; the message is the platform's answer,
    `reason` one of `broker.files.REASONS`."""

    def __init__(self, message: str, reason: str = "refused") -> None:
        if reason not in REASONS:  # a programming error, named
            raise ValueError(f"OpRefused: unknown reason {reason!r} (one of {sorted(REASONS)})")
        super().__init__(message)
        self.reason = reason


#: What a path that is not a file is, in a refusal's words.
_KIND_WORDS = {"dir": "a folder", "link": "a link", "other": "a fifo, socket or device"}


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _open_dir(name: str, dir_fd: int, *, make: bool, shown: str) -> int:
    """Open the folder `name` in `dir_fd` (made first if `make`), never through a link."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not make:
            raise OpRefused(f"{shown}: no such folder", "not_found") from None
    except OSError as exc:
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise OpRefused(f"{shown} is a symbolic link: not followed", "symlink") from None
        if isinstance(exc, NotADirectoryError):
            raise OpRefused(f"{shown} is not a folder", "not_a_file") from None
        raise OpRefused(f"{shown}: {exc.strerror}") from None
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    made = _open_dir(name, dir_fd, make=False, shown=shown)
    share_with_workspace_owner(made, dir_fd)
    return made


@contextlib.contextmanager
def _parent(workspace: Path, path: str, *, make: bool = False) -> Iterator[tuple[int, str]]:
    """(fd of the folder holding `path`'s last part, that part), walking with O_NOFOLLOW.

    `path` "." yields the workspace's own fd and ".".
    """
    fd = os.open(workspace, DIR_FLAGS)
    try:
        if path == ".":
            yield fd, "."
            return
        parts = path.split("/")
        for depth, part in enumerate(parts[:-1]):
            shown = "/".join(parts[: depth + 1])
            child = _open_dir(part, fd, make=make, shown=shown)
            os.close(fd)
            fd = child
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _put(workspace: Path, path: str, data: bytes) -> dict[str, Any]:
    with _parent(workspace, path, make=True) as (dir_fd, name):
        temporary = f"{_TEMPORARY_PREFIX}{secrets.token_hex(8)}"
        fd = os.open(temporary, _WRITE_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            share_with_workspace_owner(fd, dir_fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view[:_CHUNK]) :]
            finally:
                os.close(fd)
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                if stat.S_ISDIR(st.st_mode):
                    raise OpRefused(f"{path} is a folder", "not_a_file")
            # rename never follows a link at the target: it replaces the link.
            os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=dir_fd)
            raise
    return {"size": len(data)}


def _get(workspace: Path, path: str, cap: int) -> dict[str, Any]:
    with _parent(workspace, path) as (dir_fd, name):
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            raise OpRefused(f"{path}: no such file", "not_found") from None
        except OSError as exc:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise OpRefused(f"{path} is a symbolic link: not followed", "symlink") from None
            raise OpRefused(f"{path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            kind = _kind(st.st_mode)
            if kind != "file":
                raise OpRefused(f"{path} is not a file ({_KIND_WORDS[kind]})", "not_a_file")
            if st.st_size > cap:
                raise OpRefused(
                    f"{path} is {st.st_size:,} bytes, over the cap: no file larger than "
                    f"{cap:,} bytes",
                    "too_large",
                )
            chunks, total = [], 0
            while chunk := os.read(fd, min(_CHUNK, cap + 1 - total)):
                chunks.append(chunk)
                total += len(chunk)
                if total > cap:
                    raise OpRefused(
                        f"{path} grew over the cap: no file larger than {cap:,} bytes",
                        "too_large",
                    )
        finally:
            os.close(fd)
    return {"data": base64.b64encode(b"".join(chunks)).decode("ascii"), "size": total}


def _list(workspace: Path, path: str, cap: int) -> dict[str, Any]:
    with _parent(workspace, path) as (dir_fd, name):
        fd = dir_fd if name == "." else _open_dir(name, dir_fd, make=False, shown=path)
        try:
            entries = []
            # A put's temporary file is not an entry yet: it is renamed in place or removed.
            names = sorted(n for n in os.listdir(fd) if not n.startswith(_TEMPORARY_PREFIX))
            for entry in names[:cap]:
                try:
                    st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                kind = _kind(st.st_mode)
                entries.append(
                    {"name": entry, "size": st.st_size if kind == "file" else 0, "kind": kind}
                )
        finally:
            if fd != dir_fd:
                os.close(fd)
    return {"entries": entries}


def _delete(workspace: Path, path: str, *, only_empty: bool) -> dict[str, Any]:
    with _parent(workspace, path) as (dir_fd, name):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise OpRefused(f"{path}: no such file or folder", "not_found") from None
        if stat.S_ISDIR(st.st_mode) and only_empty:
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY:
                    raise OpRefused(f"the folder {path} is not empty", "not_empty") from None
                raise
        elif stat.S_ISDIR(st.st_mode):
            # rmtree with dir_fd walks by fds and never follows a link.
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)  # a link itself goes, never its target
    return {}


def _cap(given: int | None, cap: int) -> int:
    return cap if given is None else max(0, min(given, cap))


def perform(
    workspace: Path,
    op: str,
    path: str,
    data: bytes | None = None,
    *,
    put_cap: int | None = None,
    max_bytes: int | None = None,
    max_entries: int | None = None,
    only_empty: bool = False,
) -> dict[str, Any]:
    """Run one operation in `workspace`; raises OpRefused (or ValueError for the path).

    Caps: a put's `put_cap`, a get's `max_bytes`, a list's `max_entries`, each
    at most the protocol's (`MAX_FILE_BYTES`, `MAX_LIST_ENTRIES`).
    """
    path = check_path(path, allow_root=op == "list")
    try:
        if op == "put":
            if data is None:
                raise OpRefused(f"put {path}: no data was given")
            cap = _cap(put_cap, MAX_FILE_BYTES)
            if len(data) > cap:
                raise OpRefused(
                    f"{len(data):,} bytes is over the {cap:,}-byte limit of one file", "too_large"
                )
            return _put(workspace, path, data)
        if op == "get":
            return _get(workspace, path, _cap(max_bytes, MAX_FILE_BYTES))
        if op == "list":
            return _list(workspace, path, _cap(max_entries, MAX_LIST_ENTRIES))
        if op == "delete":
            return _delete(workspace, path, only_empty=only_empty)
    except OpRefused:
        raise
    except IsADirectoryError:
        raise OpRefused(f"{path} is a folder", "not_a_file") from None
    except OSError as exc:
        raise OpRefused(f"{op} {path}: {exc.strerror or exc}") from None
    raise OpRefused(f"{op!r} is not an operation ({', '.join(OPERATIONS)})")


def _options(message: dict[str, Any]) -> dict[str, Any]:
    """The operation's optional fields (`TurnFiles.get/list/delete`), checked."""
    options: dict[str, Any] = {}
    for name in ("max_bytes", "max_entries"):
        value = message.get(name)
        if value is not None:
            if type(value) is not int or value < 0:
                raise OpRefused(f"{name} must be a whole number of 0 or more")
            options[name] = value
    only_empty = message.get("only_empty", False)
    if not isinstance(only_empty, bool):
        raise OpRefused("only_empty must be true or false")
    options["only_empty"] = only_empty
    return options


def _answer(runtime: CallRuntime, op_id: str, answer: dict[str, Any]) -> None:
    runtime.app.backend.store_result(op_id, answer, "SUCCESS")


def run_workspace_op(runtime: CallRuntime, message: dict[str, Any]) -> str:
    """Handle one delivery of an operation's message; returns what happened (for logs)."""
    try:
        op_id = str(message["op_id"])
        agent, turn, op = str(message["agent"]), str(message["turn"]), str(message["op"])
        path, lane = str(message["path"]), str(message["lane"])
    except (KeyError, TypeError):
        _log.error("dropped a malformed workspace operation: %.200r", message)
        return "malformed"
    workspaces = runtime.workspaces
    try:
        settings = runtime.deployment.agent(agent).settings
        if workspaces is None:
            raise OpRefused("this worker keeps no workspaces")
        if op not in OPERATIONS:
            raise OpRefused(f"{op!r} is not an operation ({', '.join(OPERATIONS)})")
        check_path(path, allow_root=op == "list")
        mine = home_lane(lane, runtime.host_id) if runtime.host_id else lane
        home, lost = runtime.admission.take_home(
            agent,
            turn,
            mine,
            home_ttl_seconds=int(workspaces.ttl_seconds),
            here=runtime.has_turn(agent, turn),
            seen=bool(message.get("seen")),
        )
        if home != mine:
            hops = int(message.get("hops", 0)) + 1
            if hops > MAX_HOPS:
                raise OpRefused("the turn's home host kept changing: try again")
            runtime.app.send_task(
                WORKSPACE_OP_TASK,
                args=[{**message, "lane": home, "hops": hops}],
                task_id=op_id,
                queue=home,
                ignore_result=True,
            )
            return "moved"
        if lost == 2:
            runtime.forget_turn(agent, turn)
        workspace = workspaces.for_turn(agent, turn)
        data = None
        if op == "put":
            if not isinstance(message.get("data"), str):
                raise OpRefused("put: the message carries no data")
            data = base64.b64decode(message["data"], validate=True)
        answer = perform(
            workspace,
            op,
            path,
            data,
            put_cap=settings.disk_limit_mb * 1024 * 1024,
            **_options(message),
        )
        if op == "put":
            workspaces.touch(workspace)
        _answer(runtime, op_id, {"ok": True, "workspace_lost": lost > 0, **answer})
        return op
    except OpRefused as exc:
        _answer(runtime, op_id, {"ok": False, "error": str(exc), "reason": exc.reason})
        return "refused"
    except (UnknownAgent, ValueError) as exc:
        _answer(runtime, op_id, {"ok": False, "error": str(exc)})
        return "refused"
    except OSError as exc:
        _answer(runtime, op_id, {"ok": False, "error": f"{op} {path}: {exc.strerror or exc}"})
        return "refused"


def register_workspace_ops(app: Celery, runtime: CallRuntime) -> None:
    """Register the workspace operation task on a sandbox worker's app."""

    @app.task(  # type: ignore[untyped-decorator]
        name=WORKSPACE_OP_TASK,
        ignore_result=True,
        # This app's alone: Celery's default (shared) would add it, bound to this
        # runtime, to every app finalized later in the process.
        shared=False,
        acks_late=True,
        reject_on_worker_lost=True,
        typing=False,
    )
    def workspace_op(message: dict[str, Any]) -> str:
        return run_workspace_op(runtime, message)

    del workspace_op
