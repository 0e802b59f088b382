"""`workers.tasks.run_call` without a Celery worker: the life of one delivery.

The tool runner is replaced by a small stand-in that counts runs (the real
runners are exercised by tests/cluster and the sandbox and service suites); the
broker, result store and admission are the embedded default's real ones.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import EXAMPLES

from broker.celery_app import make_app
from broker.config import Settings
from broker.embedded import LocalAdmission
from broker.loading import load_deployment
from broker.request import CallRequest
from broker.result import ToolResult
from workers.tasks import CallRuntime, run_call


@dataclass
class Runner:
    """Stands in for Executor: counts runs; can block until cancelled, or fail."""

    runs: list[str] = field(default_factory=list)
    block: bool = False
    fail: bool = False
    started: threading.Event = field(default_factory=threading.Event)

    def run(self, request: CallRequest, cancel: threading.Event | None = None) -> ToolResult:
        self.runs.append(request.call_id)
        self.started.set()
        if self.fail:
            raise RuntimeError("boom")
        if self.block and cancel is not None:
            cancel.wait(10)
            return ToolResult(
                call_id=request.call_id,
                agent=request.agent,
                tool=request.tool,
                is_error=True,
                output="killed",
                outcome="killed",
            )
        return ToolResult(
            call_id=request.call_id,
            agent=request.agent,
            tool=request.tool,
            is_error=False,
            output="done",
        )


@pytest.fixture
def setup() -> Iterator[tuple[CallRuntime, Runner, LocalAdmission]]:
    deployment = load_deployment(EXAMPLES / "deployment.toml")
    app = make_app(Settings())
    admission = LocalAdmission()
    runner = Runner()
    runtime = CallRuntime(
        app=app,
        admission=admission,
        executor=runner,  # type: ignore[arg-type]
        deployment=deployment,
        kind="sandbox",
        hostname="test@host",
        settings=Settings(),
    )
    admission.heartbeat("sandbox", "test@host", {"vessel.sandbox": 4}, 0)
    yield runtime, runner, admission
    app.close()


def message(admission: LocalAdmission, call_id: str) -> dict[str, Any]:
    request = CallRequest(
        call_id=call_id, agent="field-guide", tool="species", arguments={}, owner="web/a"
    )
    [dispatched] = admission.submit(
        call_id=call_id,
        kind="sandbox",
        agent="field-guide",
        message=json.dumps(request.to_message()),
        limit=4,
        lease_ms=60_000,
        turn=None,
        ttl_seconds=600,
    )
    return dict(json.loads(dispatched.message))


def stored(runtime: CallRuntime, call_id: str) -> ToolResult:
    meta = runtime.app.backend.get_task_meta(call_id)
    assert meta["status"] == "SUCCESS"
    return ToolResult.from_dict(meta["result"])


def test_a_message_delivered_twice_runs_once(setup: Any) -> None:
    runtime, runner, admission = setup
    body = message(admission, "c1")
    assert run_call(runtime, body) == "ok"
    assert run_call(runtime, body) == "done"
    assert runner.runs == ["c1"]
    assert stored(runtime, "c1").output == "done"


def test_a_call_cancelled_before_it_starts_never_runs(setup: Any) -> None:
    runtime, runner, admission = setup
    body = message(admission, "c2")
    assert admission.cancel("c2", 600)[0] == "signalled"  # dispatched, not started
    assert run_call(runtime, body) == "cancelled"
    assert runner.runs == []
    assert stored(runtime, "c2").output == "[cancelled]"


def test_a_running_call_is_stopped_by_the_cancel_listener(setup: Any) -> None:
    runtime, runner, admission = setup
    runner.block = True
    subscription = admission.listen_cancels(runtime.on_cancel)
    body = message(admission, "c3")
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(run_call(runtime, body)))
    worker.start()
    assert runner.started.wait(5)
    admission.cancel("c3", 600)
    worker.join(5)  # the runner blocks until its cancel event is set: only the cancel ends it
    assert not worker.is_alive()
    assert outcome == ["cancelled"]
    result = stored(runtime, "c3")
    assert (result.output, result.outcome, result.is_error) == ("[cancelled]", "cancelled", True)
    subscription.close()


def test_an_executor_that_raises_still_ends_the_call(setup: Any) -> None:
    runtime, runner, admission = setup
    runner.fail = True
    assert run_call(runtime, message(admission, "c4")) == "error"
    result = stored(runtime, "c4")
    assert result.is_error and "failed to run this call" in result.output


def test_a_malformed_message_is_dropped(setup: Any) -> None:
    runtime, runner, _admission = setup
    assert run_call(runtime, {"nonsense": True}) == "malformed"
    assert runner.runs == []
