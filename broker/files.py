"""A turn's workspace seen from the platform: `client.files(agent, turn)`.

    files = client.files("field-guide", "turn-42")
    files.put("uploads/notes.md", b"# Notes\\n")     # before a call: the user's upload
    client.call("field-guide", "word_count", {"path": "uploads/notes.md"}, ...)
    files.list("uploads")    # [{"name": "notes.md", "size": 8, "kind": "file"}]
    files.get("report.md")   # after a call: what the tool wrote, as bytes
    files.delete("uploads")  # a file, a link, or a folder with all it holds

Each operation is a small Celery task (`broker.queues.WORKSPACE_OP_TASK`) sent to
the turn's home lane, so it runs on the host whose folder the turn's calls use
(`broker.admission`, "Turns and homes"); a turn with no home yet gets one, like
at a first call. Operations take no slot of the agent's `max_concurrent_calls`.

Paths are relative to the workspace (the tool's `$HOME`, `/tmp/vessel`), `/`
separated, without `.` or `..` parts or empty ones; `.` alone names the
workspace itself (for `list`). The worker opens each part relative to the
folder before it with O_NOFOLLOW: a symlink a tool left is never followed, at
any depth. A file put or got is at most `MAX_FILE_BYTES` (and a put at most the
agent's `disk_limit_mb`, the largest file its tools may write).

A path of the wrong form raises ValueError here, before anything is sent; what
the worker refuses (no such file, a folder where a file is wanted, too large)
raises `WorkspaceError` (its `reason` says which of `REASONS`); no answer
within `timeout` raises `CallTimeout` (the home host may have died with the
operation: try again, it goes to the new home); `cancel`, once set, stops the
wait with `OperationCancelled` (a plugin call that ended stops waiting for its
host call).
`workspace_lost` turns True once an operation found that the turn's workspace
had been lost with its host (the next call's result says so too).
"""

from __future__ import annotations

import base64
import threading
import time
from typing import TYPE_CHECKING, Any

from broker.errors import CallTimeout, VesselError, WorkspaceError
from broker.protocol import new_call_id
from broker.queues import WORKSPACE_OP_TASK

if TYPE_CHECKING:
    from broker.client import VesselClient

__all__ = [
    "DEFAULT_OP_TIMEOUT_SECONDS",
    "MAX_FILE_BYTES",
    "MAX_LIST_ENTRIES",
    "MAX_PATH_CHARS",
    "OPERATIONS",
    "REASONS",
    "OperationCancelled",
    "TurnFiles",
    "check_path",
]

#: One file put or got: 10 MiB, as the outbox's total (it crosses Redis as
#: base64 JSON, x1.33, once each way). Bigger files belong in an object store.
MAX_FILE_BYTES = 10 * 1024 * 1024
#: Entries one `list` returns (name order); a folder of a million files cannot
#: stall the worker or flood Redis.
MAX_LIST_ENTRIES = 10_000
#: Characters of a path: Linux's PATH_MAX.
MAX_PATH_CHARS = 4096
#: How long an operation waits for its answer by default.
DEFAULT_OP_TIMEOUT_SECONDS = 30.0
OPERATIONS = ("put", "get", "list", "delete")
#: Why the worker refused an operation (the answer's `reason`, `WorkspaceError.reason`):
#: nothing at the path; a symbolic link on it; a folder, fifo... where a file is
#: wanted or a file where a folder is; over a size cap; a folder that is not empty
#: (a delete that keeps folders that hold something); anything else.
REASONS = ("not_found", "symlink", "not_a_file", "too_large", "not_empty", "refused")
#: The longest pause between two reads of an operation's answer.
_POLL_CAP_SECONDS = 0.02


def check_path(path: str, *, allow_root: bool = False) -> str:
    """`path` in canonical form (no trailing `/`), or ValueError saying what is wrong."""
    if not isinstance(path, str):
        raise ValueError(f"a workspace path is text, not {type(path).__name__}")
    if path in (".", "./", ""):
        if allow_root:
            return "."
        raise ValueError("the path must name a file or folder in the workspace, not the workspace")
    if len(path) > MAX_PATH_CHARS:
        raise ValueError(f"the path is longer than {MAX_PATH_CHARS} characters")
    if "\0" in path:
        raise ValueError("the path contains a NUL character")
    if path.startswith("/"):
        raise ValueError(f"{path!r} is absolute: give a path relative to the workspace")
    parts = path.removesuffix("/").split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(
                f"{path!r} has an empty, '.' or '..' part: paths stay inside the workspace"
            )
        if len(part.encode("utf-8", "surrogateescape")) > 255:
            raise ValueError(f"{path!r} has a part longer than 255 bytes")
    return "/".join(parts)


class OperationCancelled(VesselError):
    """The caller's `cancel` was set while the operation waited for its answer."""


class TurnFiles:
    """The workspace operations of one (agent, turn); see the module docstring."""

    def __init__(
        self,
        client: VesselClient,
        agent: str,
        turn: str,
        *,
        timeout: float = DEFAULT_OP_TIMEOUT_SECONDS,
        cancel: threading.Event | None = None,
    ) -> None:
        client.deployment.agent(agent)  # UnknownAgent now, not at the worker
        if not isinstance(turn, str) or not turn:
            raise ValueError("a turn id is a non-empty string")
        self.client = client
        self.agent = agent
        self.turn = turn
        self.timeout = timeout
        self.cancel = cancel
        self.workspace_lost = False

    def put(self, path: str, data: bytes) -> None:
        """Write `data` to `path` (parents made as needed; an existing file replaced)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"put takes bytes, not {type(data).__name__}")
        raw = bytes(data)
        if len(raw) > MAX_FILE_BYTES:
            raise ValueError(f"{len(raw)} bytes is over the {MAX_FILE_BYTES}-byte file cap")
        self._run("put", check_path(path), data=base64.b64encode(raw).decode("ascii"))

    def get(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The content of the regular file at `path`; a file over `max_bytes`
        (at most `MAX_FILE_BYTES`) is refused at the home host, never sent."""
        fields = {} if max_bytes is None else {"max_bytes": int(max_bytes)}
        answer = self._run("get", check_path(path), **fields)
        return base64.b64decode(answer["data"])

    def list(self, path: str = ".", *, max_entries: int | None = None) -> list[dict[str, Any]]:
        """The entries of the folder at `path`: name, size (bytes; 0 but for
        files) and kind (`file`, `dir`, `link` or `other`), in name order; the
        first `max_entries` (at most `MAX_LIST_ENTRIES`)."""
        fields = {} if max_entries is None else {"max_entries": int(max_entries)}
        answer = self._run("list", check_path(path, allow_root=True), **fields)
        return [dict(entry) for entry in answer["entries"]]

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Remove the file, link or folder (with all it holds) at `path`;
        `recursive` False removes a folder only when empty (`not_empty` otherwise)."""
        fields = {} if recursive else {"only_empty": True}
        self._run("delete", check_path(path), **fields)

    def _wait(self, backend: Any, op_id: str, what: str) -> Any:
        """The operation's answer, read from the result backend until `timeout`.

        Polled (1 ms, doubling to 20 ms): an operation is rare next to calls,
        and a poll holds no subscription connection open.
        """
        deadline = time.monotonic() + self.timeout
        pause = 0.001
        while True:
            meta = backend.get_task_meta(op_id)
            if isinstance(meta, dict) and meta.get("status") == "SUCCESS":
                return meta.get("result")
            if self.cancel is not None and self.cancel.is_set():
                raise OperationCancelled(f"{what} of turn {self.turn!r} was cancelled")
            left = deadline - time.monotonic()
            if left <= 0:
                raise CallTimeout(
                    f"no answer to {what} of turn {self.turn!r} within {self.timeout} s"
                )
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_CAP_SECONDS)

    def _run(self, op: str, path: str, **fields: Any) -> dict[str, Any]:
        client = self.client
        op_id = new_call_id()
        lane = client.admission.route_turn("sandbox", self.agent, self.turn)
        message = {
            "op_id": op_id,
            "agent": self.agent,
            "turn": self.turn,
            "op": op,
            "path": path,
            "lane": lane,
            "seen": client.turn_seen(self.agent, self.turn),
            **fields,
        }
        backend = client.app.backend
        try:
            client.app.send_task(
                WORKSPACE_OP_TASK, args=[message], task_id=op_id, queue=lane, ignore_result=True
            )
            answer = self._wait(backend, op_id, f"{op} {path!r}")
        finally:
            backend.forget(op_id)  # a got file must not sit in Redis until results expire
        if not isinstance(answer, dict):
            raise WorkspaceError(f"{op} {path!r}: the worker's answer was not understood")
        if answer.get("workspace_lost"):
            self.workspace_lost = True
        client.saw_turn(self.agent, self.turn)
        if not answer.get("ok"):
            reason = answer.get("reason")
            raise WorkspaceError(
                str(answer.get("error") or f"{op} {path!r} failed"),
                reason if reason in REASONS else "refused",
            )
        return answer
