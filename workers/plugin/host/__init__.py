"""The host API behind a plugin handler's `host` global (seed 002), answered by the worker.

`PluginHost` is the `HostBridge` the runtime (`workers.plugin`) hands every
`host.<chain>(...)` call to; `bridge` is its one checked boundary.
"""

from workers.plugin.host.bridge import PluginHost, permission_of
from workers.plugin.host.context import HostBridge, HostContext, HostFailed, HostRefused

__all__ = [
    "HostBridge",
    "HostContext",
    "HostFailed",
    "HostRefused",
    "PluginHost",
    "permission_of",
]
