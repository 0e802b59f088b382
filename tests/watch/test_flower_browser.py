"""Flower's Tasks page as an operator sees it, in a real browser (headless Chromium):
with the columns compose.yaml gives Flower, each row shows the call's agent and
tool (args) and how it ended (result), a failing tool call as `'error'`; and
Flower's search box finds calls by tool and by outcome."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import REPO, free_port

from .conftest import AGENT, OWNER, Cluster, wait_for

pytestmark = pytest.mark.cluster


def compose_flower_options() -> list[str]:
    """The options of the Flower that compose.yaml starts which shape the Tasks page."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    command = compose["services"]["flower"]["command"]
    found = [c for c in command if c.startswith("--tasks_columns=")]
    assert found, f"compose.yaml's Flower sets no --tasks_columns: {command}"
    return found


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "chromium is not installed: the Flower page test needs it "
        "(apt-get install -y chromium, or scripts/setup.sh)"
    )


def render(url: str, folder: Path) -> str:
    """The page's DOM after its JavaScript ran (Flower fills the table by XHR)."""
    done = subprocess.run(
        [
            chromium(),
            *("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"),
            f"--user-data-dir={folder / 'chromium-profile'}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def rows(dom: str) -> list[str]:
    """The text of each row of the tasks table's body."""
    body = dom.split("<tbody", 1)[-1].split("</tbody>", 1)[0]
    return [
        html.unescape(re.sub(r"<[^>]+>", " ", row))
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S)
    ]


def test_the_tasks_page_shows_agent_tool_and_outcome(
    cluster: Cluster, deployment: Path, client: Any, tmp_path: Path
) -> None:
    chromium()  # fail first, and clearly, if the browser is missing
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cluster.flower(port, *compose_flower_options())
    cluster.worker("sandbox", deployment)

    def events_enabled() -> bool:
        return all(
            "Events of group {task} enabled by remote" in p.output()
            for p in cluster.processes
            if p.name.startswith("worker-")
        )

    wait_for(events_enabled, timeout=45, what="Flower enabling task events", explain=cluster.logs)
    ok = client.submit(AGENT, "echo", {"say": "hello"}, owner=OWNER)
    failing = client.submit(AGENT, "fail", {}, owner=OWNER)
    assert ok.result(timeout=60).outcome == "ok"
    assert failing.result(timeout=60).outcome == "error"

    def listed() -> bool:
        tasks = httpx.get(f"{base}/api/tasks", timeout=10).json()
        return all(tasks.get(h.call_id, {}).get("state") == "SUCCESS" for h in (ok, failing))

    wait_for(listed, timeout=30, what="both calls in Flower", explain=cluster.logs)

    shown = rows(render(f"{base}/tasks", tmp_path))
    fail_rows = [r for r in shown if failing.call_id in r]
    assert fail_rows, f"the failing call is not on the page: {shown}"
    row = fail_rows[0]
    assert f"'agent': '{AGENT}'" in row, row
    assert "'tool': 'fail'" in row, row
    assert "'error'" in row, row
    ok_row = next(r for r in shown if ok.call_id in r)
    assert "'tool': 'echo'" in ok_row and "'ok'" in ok_row, ok_row

    # The searches docs/operations.md gives, through Flower's own datatable endpoint
    # (what its search box sends).
    def search(query: str) -> set[str]:
        answer = httpx.get(
            f"{base}/tasks/datatable",
            params={
                "draw": "1",
                "start": "0",
                "length": "100",
                "search[value]": query,
                "order[0][column]": "0",
                "columns[0][data]": "name",
                "order[0][dir]": "asc",
            },
            timeout=10,
        )
        answer.raise_for_status()
        return {t["uuid"] for t in answer.json()["data"]}

    assert search("result:error") == {failing.call_id}
    assert search("args:\"'tool': 'fail'\"") == {failing.call_id}
    assert search(f"args:\"'agent': '{AGENT}'\"") == {ok.call_id, failing.call_id}
