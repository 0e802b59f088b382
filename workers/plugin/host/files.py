"""`host.workspace` on this host's workspaces: the embedded default's, where the turn's
declared tools run in this same process tree.

The file handling is `workers.workspace_ops.perform`, the one implementation of
the workspace operations, which the turn's home host runs for routed ones
(`workers.plugin.host.routed`): the same links refused, the same fifos never
opened, the same sentences, so `host.workspace` behaves one way wherever its
operation runs. A refusal is raised as `WorkspaceError` with its reason, as
`broker.files.TurnFiles` raises what the home host refused.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from broker.errors import WorkspaceError
from workers.workspace_ops import OpRefused, perform

if TYPE_CHECKING:
    from workers.plugin.host.context import HostContext
    from workers.sandbox.workspace import WorkspaceStore

__all__ = ["LocalFiles"]


class LocalFiles:
    """`WorkspaceFiles` on this host's `WorkspaceStore`: each operation run right here."""

    def __init__(self, store: WorkspaceStore) -> None:
        self.store = store

    def _perform(
        self, context: HostContext, op: str, path: str, data: bytes | None = None, **caps: Any
    ) -> dict[str, Any]:
        if context.turn is None:  # workspace_call refuses these first
            raise WorkspaceError(
                f"host.workspace.{op}: this call has no turn, so it has no workspace"
            )
        workspace = self.store.for_turn(context.agent.id, context.turn)
        disk = context.agent.settings.disk_limit_mb * 1024 * 1024
        try:
            answer = perform(workspace, op, path, data, put_cap=disk, **caps)
        except OpRefused as exc:
            raise WorkspaceError(str(exc), exc.reason) from None
        if op == "put":
            self.store.touch(workspace)
        return answer

    def read(self, context: HostContext, path: str, max_bytes: int) -> bytes:
        answer = self._perform(context, "get", path, max_bytes=max_bytes)
        return base64.b64decode(answer["data"])

    def write(self, context: HostContext, path: str, data: bytes) -> None:
        self._perform(context, "put", path, data)

    def entries(self, context: HostContext, path: str, max_entries: int) -> list[dict[str, Any]]:
        answer = self._perform(context, "list", path, max_entries=max_entries)
        return [dict(entry) for entry in answer["entries"]]

    def delete(self, context: HostContext, path: str) -> None:
        self._perform(context, "delete", path, only_empty=True)

    def close(self) -> None:
        """Nothing to close: the store belongs to the worker."""
