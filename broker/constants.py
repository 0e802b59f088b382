"""Names, defaults and fixed limits, each defined and explained once.

Everything an operator may set has its default here; everything the seeds fix
(name patterns, the built-in tool names, the service body cap) is here too, so a
reader can check the spec against one page.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "AGENT_ID_PATTERN",
    "BUILTIN_TOOLS",
    "DEFAULT_CPU_LIMIT",
    "DEFAULT_DEPLOYMENT_FILE",
    "DEFAULT_DISK_LIMIT_MB",
    "DEFAULT_INPUT",
    "DEFAULT_MAX_ARGUMENT_BYTES",
    "DEFAULT_MAX_CONCURRENT_CALLS",
    "DEFAULT_MAX_LISTED_TOOLS",
    "DEFAULT_MEMORY_LIMIT_MB",
    "DEFAULT_PARAMETERS",
    "DEFAULT_SCOPE",
    "DEFAULT_TOOL_OUTPUT_CHARS",
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "DEFAULT_WORKDIR",
    "DEFAULT_WORKSPACE_FILES",
    "DEFAULT_WORKSPACE_LIMIT_MB",
    "DEFAULT_WORKSPACE_ROOT",
    "ENV_BROKER_URL",
    "ENV_DEPLOYMENT",
    "ENV_HOST_ID",
    "ENV_PLUGIN_LOCK_DIR",
    "ENV_RESULT_BACKEND",
    "ENV_WORKSPACE_ROOT",
    "INPUT_MODES",
    "MAX_ARGUMENT_DEPTH",
    "OUTBOX_PATH",
    "PACKAGE_PATH",
    "PLUGIN_MAX_ALWAYS_LISTED",
    "PLUGIN_MEMORY_LIMIT_MB",
    "PLUGIN_SLUG_PATTERN",
    "PLUGIN_TIMEOUT_SECONDS",
    "PLUGIN_TOOL_KEY_PATTERN",
    "REDIS_PREFIX",
    "SANDBOX_HOME",
    "SERVICE_BODY_LIMIT_BYTES",
    "SERVICE_NAME_PATTERN",
    "SYSTEM_FOLDERS",
    "TOOL_NAME_PATTERN",
    "VESSEL_HEADER_PREFIX",
    "WORKSPACE_IDLE_TTL_SECONDS",
]

# --- names (seeds 000 and 001, DESIGN.md) -----------------------------------

#: Seed 000: lowercase letters, digits and underscores, starting with a letter,
#: up to 63 characters.
TOOL_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,62}")
#: Seed 001: lowercase letters, digits and hyphens, starting with a letter.
SERVICE_NAME_PATTERN = re.compile(r"[a-z][a-z0-9-]*")
#: DESIGN.md: lowercase letters, digits and hyphens, starting with a letter.
#: Capped at 63 so an id always fits a hostname label and a queue name.
AGENT_ID_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,62}")

#: Issue 16: a plugin's slug, lowercase letters, digits and hyphens, up to 32 characters.
PLUGIN_SLUG_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,31}")
#: Seed 002: a plugin tool's registry key (its final name is `<slug>__<key>`).
PLUGIN_TOOL_KEY_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: Seed 002: at most 3 `alwaysListed` tools per plugin; a 4th fails the publish.
PLUGIN_MAX_ALWAYS_LISTED = 3
#: Seed 002 "Limits": 30 s wall clock and 128 MB per call (floors; see
#: broker/loading/plugin.py for the raised floors and plugin.toml's own values).
PLUGIN_TIMEOUT_SECONDS = 30.0
PLUGIN_MEMORY_LIMIT_MB = 128

#: The vessel's built-in tools; a declared or service tool may not take one of
#: these names. The one list, used by loading and by the catalogue.
BUILTIN_TOOLS: frozenset[str] = frozenset(
    {
        "web_search",
        "web_fetch",
        "workspace_read_file",
        "workspace_write_file",
        "workspace_list_files",
        "search_tools",
        "call_tool",
    }
)

#: Seed 001: header names the deployment may not set (compared case-insensitively).
VESSEL_HEADER_PREFIX = "x-vessel-"

#: Seed 001: a service body larger than this is refused, and reading stops here.
SERVICE_BODY_LIMIT_BYTES = 1_000_000

# --- agent settings defaults (DESIGN.md, vessel.toml) -----------------------

DEFAULT_WORKDIR = "/data"
DEFAULT_TOOL_TIMEOUT_SECONDS = 30.0
DEFAULT_TOOL_OUTPUT_CHARS = 20_000
DEFAULT_DISK_LIMIT_MB = 256
DEFAULT_MEMORY_LIMIT_MB = 512
#: The turn's whole workspace (every file, folder and the outbox): 1 GiB, four
#: times disk_limit_mb's single file, and the host's disk is shared by every turn.
DEFAULT_WORKSPACE_LIMIT_MB = 1024
#: Files, folders and links in the turn's workspace: a node_modules or a small
#: git checkout fits; the host's inodes are shared by every turn.
DEFAULT_WORKSPACE_FILES = 100_000
#: Cores one call may use at once (a cgroup CPU quota where cgroups are writable),
#: and with the timeout the CPU seconds of each process (RLIMIT_CPU).
DEFAULT_CPU_LIMIT = 1.0
#: Calls of one agent that may run at once across every worker and host.
DEFAULT_MAX_CONCURRENT_CALLS = 16
#: Tools the model is given at most (OpenAI's limit is 128); the rest are
#: found with `search_tools` and run with `call_tool` (broker/catalogue).
DEFAULT_MAX_LISTED_TOOLS = 128
#: The model's arguments of one call, as compact JSON in UTF-8: a million
#: bytes is far more than a model writes, and keeps a worker's memory per call
#: bounded (a 50 MB argument took a call process to 530 MB).
DEFAULT_MAX_ARGUMENT_BYTES = 1_000_000

#: Objects and arrays nested deeper than this are refused before validation:
#: the JSON parser and the schema validator recurse once or more per level,
#: and Python stops at 1,000 frames. No tool's parameters need more.
MAX_ARGUMENT_DEPTH = 64

# --- tool file defaults (seed 000) -------------------------------------------

DEFAULT_SCOPE = "tools:read"
DEFAULT_INPUT = "json-stdin"
INPUT_MODES: frozenset[str] = frozenset({"json-stdin", "args"})
#: Returned fresh by loading (callers get a copy), never mutated here.
DEFAULT_PARAMETERS: dict[str, object] = {"type": "object", "properties": {}}

# --- sandbox layout ----------------------------------------------------------

#: Seed 000: `{package}` is replaced with the agent folder's path in the sandbox.
PACKAGE_PATH = "/agent"
#: The turn's workspace, writable; also $HOME and $TMPDIR.
SANDBOX_HOME = "/tmp/vessel"
#: Where tools write files to return ($VESSEL_OUTBOX), inside the workspace.
OUTBOX_PATH = "/tmp/vessel/outbox"
#: Mount targets may not cover these: the sandbox needs them as the host has them.
SYSTEM_FOLDERS: frozenset[str] = frozenset(
    {
        "/",
        "/agent",
        "/bin",
        "/dev",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/proc",
        "/sbin",
        "/sys",
        "/tmp",
        "/usr",
        "/.vessel",  # the staged /etc is mounted at /.vessel/etc (workers/sandbox/bwrap.py)
    }
)

# --- environment and files -----------------------------------------------------

ENV_DEPLOYMENT = "VESSEL_DEPLOYMENT"
ENV_BROKER_URL = "VESSEL_BROKER_URL"
ENV_RESULT_BACKEND = "VESSEL_RESULT_BACKEND"
#: Where every loader looks for plugin locks (`<dir>/<slug>.lock.json`) when
#: `check --lock-dir` wrote them away from the plugin folders.
ENV_PLUGIN_LOCK_DIR = "VESSEL_PLUGIN_LOCK_DIR"
#: Host folder under which per-turn workspaces are created.
ENV_WORKSPACE_ROOT = "VESSEL_WORKSPACE_ROOT"
#: Used when $VESSEL_WORKSPACE_ROOT is unset: a root-only folder on local disk.
#: /var/lib is where a service keeps its state; /tmp would let other users
#: pre-create the path. Packages and mounts may not show it (broker.loading).
DEFAULT_WORKSPACE_ROOT = Path("/var/lib/vessel-workers/workspaces")
DEFAULT_DEPLOYMENT_FILE = "deployment.toml"
#: The host a sandbox worker belongs to: one workspace root (default: the
#: machine's hostname, tagged with the root when it is not the default one;
#: `workers.worker.host_id_from_environ`). Workers sharing a root share the id.
ENV_HOST_ID = "VESSEL_HOST_ID"
#: A turn's workspace (and its home in Redis) is removed after this long unused.
WORKSPACE_IDLE_TTL_SECONDS = 3600

#: Every Redis key this project writes starts with this, so an operator can
#: find (and a test can flush) them with one pattern.
REDIS_PREFIX = "vessel:"
