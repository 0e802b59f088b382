"""The checks a worker passes before it starts (`workers.worker.run_worker`).

Each refuses with one line saying what to fix (ConfigError, BrokerUnavailable):
the host id a sandbox or plugin worker belongs to, the plugins' locks run
confined here, and a broker or result backend Redis that may evict keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.constants import ENV_HOST_ID
from broker.errors import BrokerUnavailable, ConfigError
from broker.model import Deployment
from broker.queues import check_host_id

if TYPE_CHECKING:
    import redis

__all__ = ["check_eviction_policy", "check_plugin_locks", "host_id_from_environ"]

_log = logging.getLogger(__name__)


def host_id_from_environ(
    environ: Mapping[str, str] | None = None, workspace_root: Path | None = None
) -> str:
    """The host of a sandbox worker: `VESSEL_HOST_ID` (ConfigError if not a valid id).

    Unset: the machine's hostname; followed by `-` and a tag of the workspace
    root (8 hex of its path's sha256) when the root is not the default one, so
    that two roots on one machine are two hosts even when nobody set the id,
    and the processes sharing a root still share it.
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV_HOST_ID, "").strip()
    if value:
        try:
            return check_host_id(value)
        except ValueError as exc:
            raise ConfigError(f"{ENV_HOST_ID}: {exc}.") from None
    from workers.sandbox.workspace import (  # noqa: PLC0415
        DEFAULT_WORKSPACE_ROOT,
        default_workspace_root,
    )

    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-")[:80] or "host"
    root = os.path.realpath(workspace_root or default_workspace_root())
    if root != os.path.realpath(DEFAULT_WORKSPACE_ROOT):
        name = f"{name}-{hashlib.sha256(root.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"
    return check_host_id(name)


def check_plugin_locks(deployment: Deployment) -> None:
    """Run each plugin's sources confined, as `check` does; refuse a lock they no longer match.

    The loader already refused a lock whose sources' sha256 changed; this also
    catches a lock written by hand or by another version of the runtime. Raises
    ConfigError naming the plugin and the command to run.
    """
    from broker.loading.fields import Problems  # noqa: PLC0415
    from broker.loading.plugin import read_plugin_file  # noqa: PLC0415
    from workers.plugin.publish import publish  # noqa: PLC0415
    from workers.plugin.registration import register_sources  # noqa: PLC0415

    command = f"vessel-workers check -d {deployment.path}"
    for slug, plugin in deployment.plugins.items():
        problems = Problems()
        plugin_file = read_plugin_file(plugin.package_dir, shown=slug, problems=problems)
        if plugin_file is None:
            raise ConfigError(f"plugin {slug!r}: plugin.toml has problems; run {command}")
        try:
            registration = register_sources(plugin.package_dir, plugin.sources)
        except OSError as exc:
            raise ConfigError(
                f"plugin {slug!r}: the plugin runtime cannot run here: {exc}"
            ) from exc
        published = publish(plugin_file, registration)
        try:
            recorded = json.loads(plugin.lock_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"plugin {slug!r}: its lock cannot be read ({exc}); run {command}"
            ) from None
        if published.lock is None or published.lock.to_json() != recorded:
            raise ConfigError(
                f"plugin {slug!r}: its sources, run here, do not register what "
                f"{plugin.lock_path.name} records; run {command}"
            )


def check_eviction_policy(client: redis.Redis[Any], what: str) -> None:
    """Refuse a Redis that may evict keys; warn if CONFIG is not allowed."""
    import redis  # noqa: PLC0415 (the embedded default never needs redis-py)

    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        detail = " ".join(str(exc).split())
        raise BrokerUnavailable(
            f"cannot reach the {what} ({detail}): check that Redis runs there and that "
            "the URL names it (host, port, password, database, TLS)"
        ) from None
    except redis.ResponseError as exc:
        _log.warning(
            "cannot read maxmemory-policy of the %s (%s): make sure it is noeviction", what, exc
        )
        return
    if policy != "noeviction":
        raise ConfigError(
            f"the {what} runs with maxmemory-policy {policy}: it may evict queued calls and "
            "results. Set `maxmemory-policy noeviction` in redis.conf (or run "
            "`redis-cli CONFIG SET maxmemory-policy noeviction`) and start the worker again."
        )
