"""`host.workspace` on the turn's home host: each operation routed as `client.files` routes it.

A plugin worker keeps no workspaces. Each `host.workspace` operation is a
workspace operation (`broker.files.TurnFiles`, the task `vessel.workspace_op`)
sent to the turn's home lane, so it runs on the host whose folder the turn's
declared calls use, by the same code (`workers.workspace_ops.perform`): a
plugin call and a declared call of one turn see one folder wherever each runs.
A turn with no home yet gets one, as at a first call.

An operation takes no admission slot: it is a task of its own on the home
lane, never a call, so a plugin call holding its agent's last slot of
`max_concurrent_calls` does not wait on itself.

The wait for the answer ends at the earliest of the protocol's 30 s, the
call's own time limit and the call's end (its `cancel` event, set when the call
is cancelled, times out or returns): a host call never outlives its call.

The plugin worker has a client connection of its own (`VesselClient`, made at
the first operation: a worker that serves no `host.workspace` opens none).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.errors import CallTimeout, TransientError
from broker.files import DEFAULT_OP_TIMEOUT_SECONDS, OperationCancelled, TurnFiles
from workers.plugin.host.context import HostFailed

if TYPE_CHECKING:
    from broker.client import VesselClient
    from broker.config import Settings
    from broker.model import Deployment
    from workers.plugin.host.context import HostContext

__all__ = ["RoutedFiles"]

#: Less time than this left in the call: the operation is not sent (its answer
#: could not come back in time).
_MIN_SECONDS = 0.05


class RoutedFiles:
    """`WorkspaceFiles` whose operations run on the turn's home host. Thread-safe."""

    def __init__(self, connect: Callable[[], VesselClient]) -> None:
        self._connect = connect
        self._client: VesselClient | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, deployment: Deployment, settings: Settings) -> RoutedFiles:
        """Routed through a client of the worker's own for this deployment."""
        from broker.client import VesselClient  # noqa: PLC0415 (only plugin workers use one)

        return cls(functools.partial(VesselClient, deployment, settings))

    def _client_now(self) -> VesselClient:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _files(self, context: HostContext, method: str) -> TurnFiles:
        if context.turn is None:  # workspace_call refuses these first
            raise HostFailed(f"host.workspace.{method} failed: this call has no turn")
        left = context.seconds_left()
        if left < _MIN_SECONDS:
            raise HostFailed(f"host.workspace.{method} failed: the call's time is up")
        return TurnFiles(
            self._client_now(),
            context.agent.id,
            context.turn,
            timeout=min(DEFAULT_OP_TIMEOUT_SECONDS, left),
            cancel=context.cancel,
        )

    def _run(self, context: HostContext, method: str, operation: Callable[[TurnFiles], Any]) -> Any:
        files = self._files(context, method)
        try:
            return operation(files)
        except CallTimeout:
            raise HostFailed(
                f"host.workspace.{method} failed: no answer from the turn's home host within "
                f"{files.timeout:.3g} s"
            ) from None
        except OperationCancelled:
            raise HostFailed(f"host.workspace.{method} failed: the call ended") from None
        except TransientError as exc:
            raise HostFailed(f"host.workspace.{method} failed: {exc}") from None

    def read(self, context: HostContext, path: str, max_bytes: int) -> bytes:
        return bytes(self._run(context, "read", lambda f: f.get(path, max_bytes=max_bytes)))

    def write(self, context: HostContext, path: str, data: bytes) -> None:
        self._run(context, "write", lambda f: f.put(path, data))

    def entries(self, context: HostContext, path: str, max_entries: int) -> list[dict[str, Any]]:
        return list(self._run(context, "list", lambda f: f.list(path, max_entries=max_entries)))

    def delete(self, context: HostContext, path: str) -> None:
        self._run(context, "delete", lambda f: f.delete(path, recursive=False))

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
