"""Names, defaults and fixed limits, each defined and explained once.

Everything an operator may set has its default here; everything the seeds fix
(name patterns, the built-in tool names, the service body cap) is here too, so a
reader can check the spec against one page.
"""

from __future__ import annotations

import re

__all__ = [
    "AGENT_ID_PATTERN",
    "BUILTIN_TOOLS",
    "DEFAULT_CPU_LIMIT",
    "DEFAULT_DEPLOYMENT_FILE",
    "DEFAULT_DISK_LIMIT_MB",
    "DEFAULT_INPUT",
    "DEFAULT_MAX_CONCURRENT_CALLS",
    "DEFAULT_MEMORY_LIMIT_MB",
    "DEFAULT_PARAMETERS",
    "DEFAULT_SCOPE",
    "DEFAULT_TOOL_OUTPUT_CHARS",
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "DEFAULT_WORKDIR",
    "DEFAULT_WORKSPACE_FILES",
    "DEFAULT_WORKSPACE_LIMIT_MB",
    "ENV_BROKER_URL",
    "ENV_DEPLOYMENT",
    "ENV_HOST_ID",
    "ENV_RESULT_BACKEND",
    "ENV_WORKSPACE_ROOT",
    "INPUT_MODES",
    "OUTBOX_PATH",
    "PACKAGE_PATH",
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
#: Host folder under which per-turn workspaces are created.
ENV_WORKSPACE_ROOT = "VESSEL_WORKSPACE_ROOT"
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
