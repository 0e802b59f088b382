"""The deployments the bench runs against, written to a temp folder.

One agent package shared by every agent (a `/bin/true` tool, a small Python
tool and a service tool), a data folder mounted at the workdir, and a
`deployment.toml` naming 1 or 1,000 agents. All agents point at the same local
HTTP server (`bench.httpd`).

The plugin deployment (`write_plugin_deployment`) is one agent of the same
package with the trivial plugin installed: slug `trivial`, one tool `one`
whose handler returns 1 (`trivial__one`), its lock written by
`vessel-workers check` (which runs the publish check).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ECHO_SCRIPT",
    "PLUGIN_SOURCE",
    "TOOL_ECHO",
    "TOOL_ONE",
    "TOOL_PING",
    "TOOL_TRUE",
    "BenchDeployment",
    "agent_ids",
    "write_deployment",
    "write_package",
    "write_plugin_deployment",
]

TOOL_TRUE = "noop"
TOOL_ECHO = "echo"
TOOL_PING = "ping"
#: The trivial plugin's tool, by its final name.
TOOL_ONE = "trivial__one"
PLUGIN_SOURCE = """\
globalThis.tools.one = {
  description: "Returns 1 (measures the plugin runtime itself).",
  handler: () => 1,
};
"""
SERVICE_NAME = "records"
#: The small Python tool: reads the JSON request, writes it back.
ECHO_SCRIPT = (
    'import json, sys\nrequest = json.load(sys.stdin)\nprint(json.dumps({"echo": request}))\n'
)
#: High enough that a burst of one agent is bounded by the workers, not by the
#: per-agent cap (the default is 16): P3 measures throughput, not admission.
BENCH_MAX_CONCURRENT_CALLS = 1000


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchDeployment:
    path: Path
    agents: tuple[str, ...]
    package: Path
    data: Path


def agent_ids(count: int) -> tuple[str, ...]:
    if count == 1:
        return ("bench-solo",)
    return tuple(f"bench-{i:04d}" for i in range(count))


def write_package(folder: Path) -> Path:
    """The agent package; returns its folder."""
    package = folder / "agents" / "bench"
    (package / "tools").mkdir(parents=True, exist_ok=True)
    (package / "vessel.toml").write_text(
        'workdir = "/data"\n'
        "tool_timeout_seconds = 30\n"
        "tool_output_chars = 20000\n"
        "disk_limit_mb = 256\n"
        "memory_limit_mb = 512\n"
        "[tools]\n"
        'declared = ["tools/noop.toml", "tools/echo.toml", "tools/ping.toml"]\n'
    )
    (package / "tools" / "noop.toml").write_text(
        f'name = "{TOOL_TRUE}"\n'
        'description = "Does nothing and succeeds (measures the sandbox itself)."\n'
        'command = ["/bin/true"]\n'
        'input = "args"\n'
    )
    (package / "tools" / "echo.toml").write_text(
        f'name = "{TOOL_ECHO}"\n'
        'description = "Echoes its arguments back as JSON (a small Python tool)."\n'
        'command = ["python3", "{package}/tools/echo.py"]\n'
    )
    (package / "tools" / "echo.py").write_text(ECHO_SCRIPT)
    (package / "tools" / "ping.toml").write_text(
        f'name = "{TOOL_PING}"\n'
        'description = "Posts the arguments to the local bench server."\n'
        f'service = "{SERVICE_NAME}"\n'
        'path = "/ping"\n'
    )
    return package


def write_deployment(folder: Path, *, agents: int, service_url: str) -> BenchDeployment:
    """`folder/deployment.toml` with `agents` agents sharing one package."""
    folder.mkdir(parents=True, exist_ok=True)
    package = write_package(folder)
    data = folder / "data"
    data.mkdir(exist_ok=True)
    (data / "hello.txt").write_text("hello\n")
    ids = agent_ids(agents)
    blocks = []
    for agent_id in ids:
        blocks.append(
            "[[agents]]\n"
            f'id = "{agent_id}"\n'
            'package = "agents/bench"\n'
            f"max_concurrent_calls = {BENCH_MAX_CONCURRENT_CALLS}\n"
            "[agents.mounts]\n"
            '"/data" = "data"\n'
            f"[agents.services.{SERVICE_NAME}]\n"
            f"url = {json.dumps(service_url)}\n"
        )
    path = folder / "deployment.toml"
    path.write_text("\n".join(blocks))
    return BenchDeployment(path=path, agents=ids, package=package, data=data)


def write_plugin_deployment(folder: Path) -> BenchDeployment:
    """One agent with the trivial plugin; its lock written by `vessel-workers check`."""
    folder.mkdir(parents=True, exist_ok=True)
    package = write_package(folder)
    data = folder / "data"
    data.mkdir(exist_ok=True)
    plugin = folder / "plugins" / "trivial"
    (plugin / "src").mkdir(parents=True, exist_ok=True)
    (plugin / "plugin.toml").write_text('slug = "trivial"\nsources = ["src/trivial.js"]\n')
    (plugin / "src" / "trivial.js").write_text(PLUGIN_SOURCE)
    ids = ("bench-plugin",)
    path = folder / "deployment.toml"
    path.write_text(
        "[[plugins]]\n"
        'package = "plugins/trivial"\n\n'
        "[[agents]]\n"
        f'id = "{ids[0]}"\n'
        'package = "agents/bench"\n'
        f"max_concurrent_calls = {BENCH_MAX_CONCURRENT_CALLS}\n"
        "[agents.mounts]\n"
        '"/data" = "data"\n'
        f"[agents.services.{SERVICE_NAME}]\n"
        'url = "http://127.0.0.1:9"\n'
    )
    done = subprocess.run(
        [str(Path(sys.executable).parent / "vessel-workers"), "check", "-d", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"vessel-workers check failed: {done.stdout}{done.stderr}")
    return BenchDeployment(path=path, agents=ids, package=package, data=data)
