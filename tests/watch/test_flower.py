"""Flower, started as an operator starts it (`celery -A broker.celery_app flower`),
sees both worker kinds and every call with its agent and tool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families

from broker.queues import TASK_NAMES, shared_lane

from .conftest import AGENT, OWNER, Cluster, wait_for

pytestmark = pytest.mark.cluster


def _get(base: str, path: str) -> Any:
    answer = httpx.get(f"{base}{path}", timeout=10)
    answer.raise_for_status()
    return answer.json()


def test_flower_lists_both_kinds_and_every_call(
    cluster: Cluster, deployment: Path, client: Any
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flower = cluster.flower(port)
    cluster.worker("sandbox", deployment)
    cluster.worker("service", deployment)

    # Flower answers, then sees both workers (their heartbeats and inspect replies).
    wait_for(
        lambda: _get(base, "/api/workers") is not None,
        timeout=30,
        what="Flower's API",
        explain=cluster.logs,
    )

    def both() -> dict[str, Any] | None:
        """Each kind's worker, once Flower has its inspect answers (registered tasks)."""
        found = _get(base, "/api/workers?refresh=1")
        names = {
            kind: [n for n in found if n.startswith(f"{kind}-watch@")]
            for kind in ("sandbox", "service")
        }
        if not all(names.values()):
            return None
        # Each inspect answer (registered, stats, active_queues) lands on its own.
        keys = ("registered", "stats", "active_queues")
        if not all(found[n[0]].get(key) for n in names.values() for key in keys):
            return None
        return {kind: found[n[0]] | {"name": n[0]} for kind, n in names.items()}

    workers = wait_for(both, timeout=60, what="both workers in Flower", explain=cluster.logs)
    for kind, entry in workers.items():
        assert TASK_NAMES[kind] in entry["registered"], entry["registered"]
        queues = {q["name"] for q in entry.get("active_queues") or []}
        assert shared_lane(kind) in queues, queues
        assert entry["stats"]["pool"]["max-concurrency"] == 2

    # Task events are on request (VESSEL_TASK_EVENTS=on-request, Celery's default):
    # Flower broadcasts enable_events at start and every 5 s; calls are seen from
    # the moment each worker has received it.
    def events_enabled() -> bool:
        return all(
            "Events of group {task} enabled by remote" in process.output()
            for process in cluster.processes
            if process.name.startswith("worker-")
        )

    wait_for(events_enabled, timeout=30, what="Flower enabling task events", explain=cluster.logs)

    calls = [
        ("echo", {"say": "hello flower"}, "sandbox", "ok"),
        ("fail", {}, "sandbox", "error"),
        ("lookup", {"id": "A-1042"}, "service", "ok"),
        ("lookup", {"id": "Z-0000"}, "service", "error"),
    ]
    handles = [client.submit(AGENT, tool, args, owner=OWNER) for tool, args, _, _ in calls]
    for handle in handles:
        handle.result(timeout=60)
    expected = {h.call_id: call for h, call in zip(handles, calls, strict=True)}

    def listed() -> dict[str, Any] | None:
        tasks = _get(base, "/api/tasks")
        done = {i: t for i, t in tasks.items() if i in expected and t.get("state") == "SUCCESS"}
        return tasks if len(done) == len(expected) else None

    tasks = wait_for(
        listed,
        timeout=30,
        what="every call in Flower's task list",
        explain=lambda: f"{_get(base, '/api/tasks')}\n{cluster.logs()}",
    )
    for call_id, (tool, _, kind, outcome) in expected.items():
        task = tasks[call_id]
        assert task["name"] == TASK_NAMES[kind]
        assert task["worker"] == workers[kind]["name"]
        # The task returns the call's outcome: Flower's result column shows it.
        assert task["result"] == repr(outcome)
        # The agent and the tool are readable in the call's arguments.
        shown = f"{task.get('args')} {task.get('kwargs')}"
        assert f"'agent': '{AGENT}'" in shown, shown
        assert f"'tool': '{tool}'" in shown, shown
        assert call_id in shown

    # One call, in full, through the task endpoint.
    one = _get(base, f"/api/task/info/{handles[0].call_id}")
    assert one["state"] == "SUCCESS"
    assert "'tool': 'echo'" in one["args"]

    # Flower's own Prometheus endpoint (open without auth) counts the same.
    text = httpx.get(f"{base}/metrics", timeout=10).text
    online: dict[str, float] = {}
    succeeded: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "flower_worker_online":
                online[sample.labels["worker"]] = sample.value
            if sample.name == "flower_events_total" and sample.labels["type"] == "task-succeeded":
                succeeded[sample.labels["task"]] = (
                    succeeded.get(sample.labels["task"], 0) + sample.value
                )
    for kind, entry in workers.items():
        assert online.get(entry["name"]) == 1
        assert succeeded.get(TASK_NAMES[kind]) == 2
    assert flower.running()
