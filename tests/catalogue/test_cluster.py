"""search_tools and call_tool against a real Redis and real worker processes.

`vessel-workers call crew search_tools ARGS` is answered at submit (no worker
takes it); `call_tool` is admitted and run exactly as a direct call of the
tool it names: a deferred plugin tool by the plugin worker, a deferred
declared tool by the sandbox worker, each refused by its own rules. One
cluster for the module: one sandbox worker and one plugin worker.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from cluster.conftest import CLUSTER_ENV, Cluster, Recorder, start_redis
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from .conftest import REPO, Published, cli

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

OWNER = "app/tester"


@pytest.fixture(scope="module")
def cluster(published: Published) -> Iterator[Cluster]:
    folder = published.folder
    redis_proc, url = start_redis(folder)
    workspaces = folder / "workspaces"
    env = {k: v for k, v in os.environ.items() if k != "VESSEL_RESULT_BACKEND"}
    env.update(CLUSTER_ENV)
    env["VESSEL_BROKER_URL"] = url
    env["VESSEL_WORKSPACE_ROOT"] = str(workspaces)
    found = Cluster(
        url=url,
        deployment_path=published.path,
        env=env,
        recorder=Recorder(),
        workspaces=workspaces,
    )
    try:
        plugin = found.start_worker("plugin", "--concurrency", "2", name="plug1", wait=False)
        box = found.start_worker("sandbox", "--concurrency", "2", name="box1", wait=False)
        found.wait_registered("plug1", plugin)
        found.wait_registered("box1", box)
        yield found
    finally:
        found.stop_all()
        redis_proc.terminate()
        redis_proc.wait(10)


def _call(cluster: Cluster, *args: str) -> Any:
    return cli("call", "-d", str(cluster.deployment_path), *args, cwd=REPO, env=cluster.env)


def test_the_command_line_searches_through_the_broker(cluster: Cluster) -> None:
    done = _call(cluster, "crew", "search_tools", '{"query": "tide times for a harbour"}')
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found[0]["name"] == "weather__tide_tables"
    assert len(found) == 5


def test_call_tool_runs_a_deferred_plugin_tool_on_the_plugin_worker(cluster: Cluster) -> None:
    arguments = json.dumps({"name": "weather__tide_tables", "arguments": {"harbour": "Brest"}})
    done = _call(cluster, "--json", "crew", "call_tool", arguments)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["tool"], result["is_error"], result["outcome"]) == (
        "weather__tide_tables",
        False,
        "ok",
    )
    assert json.loads(result["output"]) == {"tool": "tide_tables", "input": {"harbour": "Brest"}}


def test_call_tool_runs_a_deferred_declared_tool_on_the_sandbox_worker(cluster: Cluster) -> None:
    client = cluster.client()
    try:
        result = client.call(
            "crew",
            "call_tool",
            {"name": "notes_search", "arguments": {"phrase": "milk"}},
            owner=OWNER,
            timeout=60,
        )
        assert (result.tool, result.is_error, result.exit_code) == ("notes_search", False, 0)
        assert result.output.strip() == "found: milk"
        # The tool's own rules: its parameters refuse a number where a string is wanted.
        refused = client.call(
            "crew",
            "call_tool",
            {"name": "notes_search", "arguments": {"phrase": 5}},
            owner=OWNER,
            timeout=60,
        )
        assert (refused.tool, refused.outcome) == ("notes_search", "refused")
        assert refused.output.startswith("notes_search:"), refused.output
    finally:
        client.close()


def test_a_direct_call_of_an_unlisted_tool_runs(cluster: Cluster) -> None:
    # shout is over crew's limit: searchable, and callable by its name.
    done = _call(cluster, "crew", "shout", '{"phrase": "hello"}')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"phrase": "hello"}


def test_a_name_the_agent_cannot_call_is_refused_through_the_broker(cluster: Cluster) -> None:
    done = _call(cluster, "crew", "call_tool", '{"name": "todo_add", "arguments": {}}')
    assert done.returncode == 2
    assert "Use search_tools" in done.stdout


def test_mcp_calls_an_unlisted_tool_by_its_final_name(cluster: Cluster) -> None:
    """Over MCP as over the client: a tool the agent may call runs when named,
    listed or not (here a deferred plugin tool that only search_tools shows)."""
    deployment = str(cluster.deployment_path)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "workers.cli", "mcp", "crew", "-d", deployment, "--owner", OWNER],
        env=cluster.env,
        cwd=str(REPO),
    )

    async def main() -> tuple[list[str], Any]:
        async with Client(params) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            done = await client.call_tool("weather__tide_tables", {"harbour": "Brest"})
            return names, done

    names, done = anyio.run(main)
    assert "weather__tide_tables" not in names and names[-2:] == ["search_tools", "call_tool"]
    assert done.is_error is False
    assert "Brest" in "".join(c.text for c in done.content if c.type == "text")
