"""The one checked boundary between a plugin's handler and everything else.

Every `host.<chain>(...args)` a handler makes reaches `PluginHost.call`, and
only there (Deno's permission checks and Stripe smokescreen's egress checks
have the same shape: one function, checked in one order, one sentence when it
says no). In order:

1. the chain's form: names joined by '.', at most `MAX_CHAIN_PARTS`, the
   arguments a list of at most `MAX_ARGS`;
2. the derived permission: `host:` + the chain with ':' for '.', which must
   be in the plugin's permissions (derived from its sources by the publish
   check, so a handler that builds a member name at run time cannot widen its
   rights: `host["fe" + "tch"]` derives nothing and is refused);
3. the namespace's own rules: `host.fetch` (`fetch`, `egress`), `host.settings`,
   `host.crypto`, `host.log`, `host.workspace` (`workspace`; its files on the
   turn's home host, `routed`, or here, `files`), and the platform's
   namespaces (`platform`).

A refusal raises `HostRefused`, a failure `HostFailed`; both reject the
handler's promise with their one sentence. Nothing else escapes: an
unexpected error is logged here with the call id and rejects as a failure.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from broker.model import Deployment
from workers.plugin.host.context import HostContext, HostFailed, HostRefused
from workers.plugin.host.crypto import crypto_call
from workers.plugin.host.fetch import Fetcher
from workers.plugin.host.files import LocalFiles
from workers.plugin.host.logs import CallLogs
from workers.plugin.host.platform import PLATFORM_NAMESPACES, forward
from workers.plugin.host.settings import (
    ResolvedSettings,
    redactable,
    resolve_platform,
    resolve_settings,
)
from workers.plugin.host.workspace import WorkspaceFiles, workspace_call
from workers.sandbox.workspace import WorkspaceStore

__all__ = ["MAX_ARGS", "MAX_CHAIN_PARTS", "PluginHost", "permission_of"]

_log = logging.getLogger(__name__)

#: `host.a.b.c...`: the deepest chain the host API has is three names.
MAX_CHAIN_PARTS = 6
#: Arguments of one host call: every method takes one to three.
MAX_ARGS = 16
_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]{0,63}")


def permission_of(chain: str) -> str:
    """The permission a chain derives: `workspace.write` -> `host:workspace:write`."""
    return "host:" + chain.replace(".", ":")


class PluginHost:
    """`HostBridge` for one worker process: answers every host call of every plugin.

    Resolves the plugins' settings and `[platform]` now (`MissingSecret` names
    each missing variable). `workspaces` is where `host.workspace` works: this
    host's `WorkspaceStore` (the embedded default), or any `WorkspaceFiles`
    (a plugin worker's `RoutedFiles`: the turn's home host); None leaves
    `host.workspace` unavailable. Thread-safe.
    """

    def __init__(
        self,
        deployment: Deployment,
        *,
        workspaces: WorkspaceStore | WorkspaceFiles | None,
        plugins: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._settings: dict[str, ResolvedSettings] = resolve_settings(deployment, plugins, environ)
        self._platform = resolve_platform(deployment.platform, environ)
        self._files: WorkspaceFiles | None = (
            LocalFiles(workspaces) if isinstance(workspaces, WorkspaceStore) else workspaces
        )
        self._fetcher = Fetcher()
        self._logs = CallLogs()

    def __repr__(self) -> str:
        # Slugs only: the settings hold secrets.
        return f"PluginHost(plugins={sorted(self._settings)!r}, platform={bool(self._platform)})"

    # --- the boundary ----------------------------------------------------------

    def call(self, context: HostContext, chain: str, args: list[Any]) -> Any:
        """Answer `host.<chain>(...args)` for the context's plugin (HostRefused/HostFailed)."""
        parts = chain.split(".") if isinstance(chain, str) else []
        if not parts or len(parts) > MAX_CHAIN_PARTS or not all(map(_NAME.fullmatch, parts)):
            raise HostRefused(f"host call refused: {str(chain)[:80]!r} is not a host member")
        name = f"host.{chain}"
        if not isinstance(args, list) or len(args) > MAX_ARGS:
            raise HostRefused(f"{name} refused: it takes at most {MAX_ARGS} arguments")
        permission = permission_of(chain)
        if permission not in context.plugin.permissions:
            raise HostRefused(
                f"{name} refused: this plugin's sources do not call {name}, so it does not "
                f"hold {permission}"
            )
        try:
            return self._namespace(context, parts, args)
        except (HostRefused, HostFailed):
            raise
        except Exception:
            _log.exception("call %s: %s failed inside the worker", context.call_id, name)
            raise HostFailed(f"{name} failed inside the worker") from None

    def _namespace(self, context: HostContext, parts: list[str], args: list[Any]) -> Any:
        head, rest = parts[0], parts[1:]
        chain = ".".join(parts)
        if head == "fetch" and not rest:
            return self._fetcher.fetch(context, args)
        if head == "settings" and len(rest) == 1:
            return self._settings_call(context, rest[0], args)
        if head == "crypto" and len(rest) == 1:
            return crypto_call(rest[0], args)
        if head == "log" and len(rest) == 1:
            self._logs.write(context, rest[0], args)
            return None
        if head == "workspace" and len(rest) == 1:
            if self._files is None:
                raise HostFailed(f"host.{chain} is not available: this worker has no workspaces")
            return workspace_call(self._files, context, rest[0], args)
        if head in PLATFORM_NAMESPACES:
            return forward(self._fetcher.client, self._platform, context, chain, args)
        raise HostRefused(f"host.{chain} refused: it is not part of the host API")

    def _settings_call(self, context: HostContext, method: str, args: list[Any]) -> Any:
        resolved = self._settings.get(context.plugin.slug)
        if resolved is None:
            raise HostFailed(
                f"host.settings.{method} failed: this worker did not load the settings of "
                f"plugin {context.plugin.slug!r}"
            )
        if method == "get":
            if len(args) != 1 or not isinstance(args[0], str):
                raise HostRefused("host.settings.get refused: it takes one key, a string")
            return resolved.values.get(args[0])
        if method == "all":
            if args:
                raise HostRefused("host.settings.all refused: it takes no arguments")
            return dict(resolved.values)
        raise HostRefused(f"host.settings.{method} refused: host.settings has get and all")

    # --- the rest of HostBridge ------------------------------------------------

    def logs(self, call_id: str) -> list[dict[str, Any]]:
        """The call's `host.log` entries, forgotten here (call once, at the call's end)."""
        return self._logs.take(call_id)

    def secrets(self, plugin: str) -> list[str]:
        """Resolved `env:` values of 8+ characters of the plugin's settings and `[platform]`."""
        values: list[str] = []
        resolved = self._settings.get(plugin)
        if resolved is not None:
            values += resolved.from_env
        if self._platform is not None:
            values += self._platform.from_env
        return redactable(values)

    def close(self) -> None:
        self._fetcher.close()
        if self._files is not None:
            self._files.close()
