"""`host.workspace.read/write/list/delete`: the calling turn's workspace, the folder its
declared tools see as $HOME (/tmp/vessel).

    write({path, content, encoding?})  -> {path, size}
    read({path, encoding?})            -> {path, content, size}
    list({path?})                      -> {path, entries: [{name, type, size}], truncated}
    delete({path})                     -> {path, deleted: true}

Each also takes the path as a bare string first argument (`read("notes/a.md")`,
`write("notes/a.md", "text")`). `encoding` is "utf-8" (the default) or
"base64"; a file that is not UTF-8 must be read with "base64". `type` is
"file", "directory", "symlink" or "other".

Rules (each refusal says which one): a call with no turn has no workspace; a
path is relative, at most `MAX_PATH_CHARS` characters and `MAX_DEPTH` parts, with
no empty, `.` or `..` part and no NUL; nothing is read, written or listed through
a symbolic link; one file read or written is at most `MAX_FILE_BYTES` and never
more than the agent's `disk_limit_mb` (the workspace limit of declared tools: no
single file larger); `delete` removes a file, a link (never its target) or an
empty folder. Folders on a written path are made as needed.

Where the files are is a `WorkspaceFiles`: the workspace operations on the
turn's home host (`routed.RoutedFiles`, a plugin worker's), or on this host
(`files.LocalFiles`, the embedded default's). Both run the same operations
(`workers.workspace_ops.perform`) and raise what they refuse as
`WorkspaceError` with its reason, which this module turns into the handler's
rejection: a symbolic link is refused (`HostRefused`), the rest fail
(`HostFailed`). The operations hold no admission slot, so they never count
against the agent's `max_concurrent_calls` (a call holding the agent's last
slot does not wait on itself).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, Protocol

from broker.errors import WorkspaceError
from workers.plugin.host.context import HostContext, HostFailed, HostRefused

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_LIST_ENTRIES",
    "MAX_PATH_CHARS",
    "WorkspaceFiles",
    "workspace_call",
]

#: One read or write: the content crosses the runtime's pipe as JSON (base64
#: adds a third), and a workspace holds notes and working files, not media.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_PATH_CHARS = 1024
MAX_DEPTH = 32
#: Entries one `list` returns; the rest are not read (a million files cannot stall the worker).
MAX_LIST_ENTRIES = 1_000
_ENCODINGS = ("utf-8", "base64")
#: The workspace operations' kinds of entry, as the handler sees them.
_TYPES = {"file": "file", "dir": "directory", "link": "symlink"}


class WorkspaceFiles(Protocol):
    """Where the turn's files are (`routed.RoutedFiles`, `files.LocalFiles`).

    Paths arrive checked and canonical (`a/b`, "." for the workspace itself);
    a refusal raises `WorkspaceError` (its `reason` one of `broker.files.REASONS`),
    a path the operations' own check refuses ValueError.
    """

    def read(self, context: HostContext, path: str, max_bytes: int) -> bytes: ...
    def write(self, context: HostContext, path: str, data: bytes) -> None: ...
    def entries(
        self, context: HostContext, path: str, max_entries: int
    ) -> list[dict[str, Any]]: ...
    def delete(self, context: HostContext, path: str) -> None:
        """A file, a link or an empty folder (`not_empty` otherwise)."""
        ...

    def close(self) -> None: ...


def _refuse(method: str, what: str) -> HostRefused:
    return HostRefused(f"host.workspace.{method} refused: {what}")


def _parts(method: str, path: object, *, allow_root: bool = False) -> list[str]:
    if not isinstance(path, str):
        raise _refuse(method, "`path` must be a string")
    if allow_root and path in ("", ".", "./"):
        return []
    if not path:
        raise _refuse(method, "`path` is empty")
    if len(path) > MAX_PATH_CHARS:
        raise _refuse(method, f"the path is longer than {MAX_PATH_CHARS} characters")
    if "\0" in path:
        raise _refuse(method, "the path holds a NUL character")
    if path.startswith("/"):
        raise _refuse(method, f"{path[:200]!r} is absolute: paths are relative to the workspace")
    parts = path.removesuffix("/").split("/")
    if ".." in parts:
        raise _refuse(method, f"{path[:200]!r} leads outside the workspace (`..`)")
    if any(p in ("", ".") for p in parts):
        raise _refuse(method, f"{path[:200]!r} has an empty or `.` part")
    if len(parts) > MAX_DEPTH:
        raise _refuse(method, f"the path has more than {MAX_DEPTH} parts")
    return parts


def _spec(method: str, args: list[Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The call's fields, from `({path, ...})` or positional `(path, content?)`."""
    if len(args) == 1 and isinstance(args[0], Mapping):
        spec = dict(args[0])
        unknown = sorted(set(spec) - set(fields))
        if unknown:
            raise _refuse(method, f"unknown field {unknown[0]!r} (fields: {', '.join(fields)})")
        return spec
    if 0 < len(args) <= len(fields) and all(not isinstance(a, Mapping) for a in args):
        return dict(zip(fields, args, strict=False))
    if not args and method == "list":
        return {}
    raise _refuse(method, f"it takes {{{', '.join(fields)}}}")


def _encoding(method: str, spec: Mapping[str, Any]) -> str:
    encoding = spec.get("encoding", "utf-8")
    if encoding not in _ENCODINGS:
        raise _refuse(method, "encoding must be 'utf-8' or 'base64'")
    return str(encoding)


def _file_limit(context: HostContext) -> int:
    return min(MAX_FILE_BYTES, context.agent.settings.disk_limit_mb * 1024 * 1024)


def workspace_call(
    files: WorkspaceFiles, context: HostContext, method: str, args: list[Any]
) -> dict[str, Any]:
    """Answer `host.workspace.<method>(...args)`."""
    if method not in ("read", "write", "list", "delete"):
        raise _refuse(method, "host.workspace has read, write, list and delete")
    if context.turn is None:
        raise _refuse(
            method, "this call has no turn, so it has no workspace (call it within a turn)"
        )
    limit = _file_limit(context)
    try:
        if method == "write":
            spec = _spec(method, args, ("path", "content", "encoding"))
            parts = _parts(method, spec.get("path"))
            encoding = _encoding(method, spec)
            content = spec.get("content")
            if not isinstance(content, str):
                raise _refuse(method, "`content` must be a string")
            if encoding == "base64":
                try:
                    data = base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError):
                    raise _refuse(method, "`content` is not valid base64") from None
            else:
                data = content.encode("utf-8", "surrogatepass")
            if len(data) > limit:
                raise _refuse(method, f"the content is larger than {limit:,} bytes")
            files.write(context, "/".join(parts), data)
            return {"path": "/".join(parts), "size": len(data)}
        if method == "read":
            spec = _spec(method, args, ("path", "encoding"))
            parts = _parts(method, spec.get("path"))
            encoding = _encoding(method, spec)
            data = files.read(context, "/".join(parts), limit)
            if encoding == "base64":
                text = base64.b64encode(data).decode("ascii")
            else:
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise HostFailed(
                        f"host.workspace.read failed: {'/'.join(parts)} is not UTF-8 text "
                        "(read it with encoding: 'base64')"
                    ) from None
            return {"path": "/".join(parts), "content": text, "size": len(data)}
        if method == "list":
            spec = _spec(method, args, ("path",))
            parts = _parts(method, spec.get("path", "."), allow_root=True)
            shown = "/".join(parts) or "."
            # One more than kept: whether the folder holds more, without reading it all.
            entries = files.entries(context, shown, MAX_LIST_ENTRIES + 1)
            return {
                "path": shown,
                "entries": [
                    {
                        "name": e["name"],
                        "type": _TYPES.get(e["kind"], "other"),
                        "size": e["size"],
                    }
                    for e in entries[:MAX_LIST_ENTRIES]
                ],
                "truncated": len(entries) > MAX_LIST_ENTRIES,
            }
        spec = _spec(method, args, ("path",))
        parts = _parts(method, spec.get("path"))
        files.delete(context, "/".join(parts))
        return {"path": "/".join(parts), "deleted": True}
    except WorkspaceError as exc:
        # The operations' sentences name the path in the workspace, never a host folder.
        if exc.reason == "symlink":
            raise _refuse(method, str(exc)) from None
        raise HostFailed(f"host.workspace.{method} failed: {exc}") from None
    except ValueError as exc:  # the operations' own check of the path
        raise _refuse(method, str(exc)) from None
