"""Plugin calls through `PluginRunner` with the real confined runtime: results, context,
host calls, logs, redaction, a fresh state per call, and each limit."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.request import Initiator
from workers.plugin.runner import PluginRunner

from .runtime_support import FIXTURES, Bridge, Calls, published

SECRET = "s3cr3t-token-value"

SOURCE = (FIXTURES / "demo.ts").read_text()


@pytest.fixture(scope="module")
def call(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calls]:
    deployment = published(tmp_path_factory.mktemp("runtime"), "demo", {"src/demo.ts": SOURCE})
    bridge = Bridge({"units": "metric"}, secret=SECRET)
    runner = PluginRunner(deployment, bridge)
    try:
        yield Calls(deployment, runner)
    finally:
        runner.close()


def test_the_return_value_is_its_json(call: Calls) -> None:
    result = call("demo__value", {"value": {"a": [1, 2.5, "é"], "b": None}})
    assert (result.is_error, result.outcome) == (False, "ok")
    assert result.output == '{"a":[1,2.5,"é"],"b":null}'
    assert call("demo__nothing").output == "null"
    assert call("demo__text").output == '"hello"'


def test_input_is_not_validated_against_the_schema_and_context_is_frozen(call: Calls) -> None:
    initiator = Initiator(kind="schedule", is_verified_person=True)
    result = call(
        "demo__echo", {"n": "not a number", "extra": 1}, initiator=initiator, call_id="c-1"
    )
    assert not result.is_error, result.output
    assert result.output == (
        '{"input":{"n":"not a number","extra":1},'
        '"context":{"callId":"c-1","initiator":{"kind":"schedule","isVerifiedPerson":true}},'
        '"frozen":true}'
    )


@pytest.mark.parametrize(
    ("tool", "text"),
    [
        ("throws", "demo__throws: nope: bad input"),
        ("rejects", "demo__rejects: rejected here"),
        ("throws_string", "demo__throws_string: plain string"),
        ("big_int", "demo__big_int: the result is not JSON: Do not know how to serialize a BigInt"),
        ("a_function", "demo__a_function: the result is not JSON: returned a function"),
    ],
)
def test_a_failure_is_a_result_the_model_can_read(call: Calls, tool: str, text: str) -> None:
    result = call(f"demo__{tool}")
    assert result.is_error and result.outcome == "error"
    assert result.output.startswith(text), result.output
    assert " at " not in result.output and "/plugin" not in result.output


def test_a_cycle_is_a_clear_failure(call: Calls) -> None:
    result = call("demo__cycle")
    assert result.is_error
    assert result.output.startswith("demo__cycle: the result is not JSON: Converting circular")


def test_the_result_is_cut_to_tool_output_chars(call: Calls) -> None:
    result = call("demo__long")
    limit = call.agent.settings.tool_output_chars
    assert result.output == '"' + "x" * (limit - 1) + f"\n[{50002 - limit} characters dropped]"
    assert result.dropped_chars == 50002 - limit


def test_characters_outside_the_bmp_are_not_counted_as_dropped(call: Calls) -> None:
    value = "weather: \u2600\ufe0f \U0001f327\ufe0f \U0001f30a, h\u00e9las"
    result = call("demo__value", {"value": value})
    assert not result.is_error, result.output
    assert json.loads(result.output) == value
    assert result.dropped_chars == 0 and "dropped" not in result.output


def test_settings_come_from_the_bridge_and_secrets_are_redacted(call: Calls) -> None:
    result = call("demo__settings")
    assert result.output == '{"units":"metric","secret":"[redacted]"}'
    assert SECRET not in result.output


def test_host_calls_resolve_and_reject_through_the_bridge(call: Calls) -> None:
    assert call("demo__host_echo").output == '[1,"a",{"b":[true,null]}]'
    assert call("demo__host_fails").output == '"rejected: host.fail.now: it failed, as asked"'
    assert call("demo__bad_args").output.startswith('"host.echo.back: the arguments are not JSON')


def test_a_name_built_at_run_time_gets_no_rights(call: Calls) -> None:
    assert "host:fetch" not in call.tool("demo__dynamic").permissions
    output = call("demo__dynamic").output
    assert output == '"refused: host.fetch: the plugin has no permission host:fetch"'


def test_host_log_entries_are_on_the_result(call: Calls) -> None:
    result = call("demo__logs")
    assert result.logs == (
        {"level": "info", "message": "hello"},
        {"level": "warn", "message": "careful"},
    )


def test_nothing_a_call_leaves_is_seen_by_the_next(call: Calls) -> None:
    left = call("demo__pollute")
    # Sloppy-mode code cannot replace `host` either (the write is ignored, not thrown).
    assert left.output in (
        '{"replaced":"threw","hostIsProxy":"function"}',
        '{"replaced":"no","hostIsProxy":"function"}',
    )
    for _ in range(3):
        seen = call("demo__observe")
        assert seen.output == (
            '{"leak":null,"polluted":null,"push":2,"patched":"own","added":false,"loads":1}'
        ), seen.output


def test_a_cancel_ends_the_call(call: Calls) -> None:
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    result = call("demo__sleep", cancel=cancel)
    assert (result.output, result.outcome) == ("[cancelled]", "cancelled")
    assert time.monotonic() - started < 10
    assert call("demo__text").output == '"hello"'


def _with_timeout(call: Calls, name: str, seconds: float) -> object:
    tool = dataclasses.replace(call.tool(name), timeout_seconds=seconds)
    return call.runner.run(
        call_id="t",
        agent=call.agent,
        tool=tool,
        arguments={},
        owner="web/alice",
        turn=None,
        initiator=Initiator(),
    )


@pytest.mark.hostile
@pytest.mark.parametrize("name", ["spin", "sleep"])
def test_the_time_limit_ends_the_call_and_the_next_call_runs(call: Calls, name: str) -> None:
    started = time.monotonic()
    result = _with_timeout(call, f"demo__{name}", 1.5)
    assert result.output == "[timed out after 1.5 s]"  # type: ignore[attr-defined]
    assert result.outcome == "timeout"  # type: ignore[attr-defined]
    assert time.monotonic() - started < 1.5 + 4
    assert call("demo__text").output == '"hello"'


@pytest.mark.hostile
@pytest.mark.parametrize("name", ["array_buffer", "buffers", "heap"])
def test_the_memory_limit_ends_the_call_and_the_next_call_runs(call: Calls, name: str) -> None:
    result = call(f"demo__{name}")
    assert result.is_error and result.outcome == "killed"
    assert result.output == f"demo__{name}: [memory limit of 128 MB reached]"
    assert call("demo__text").output == '"hello"'


@pytest.mark.hostile
def test_a_call_at_its_memory_limit_does_not_touch_a_call_running_beside_it(call: Calls) -> None:
    results: dict[str, str] = {}

    def run(name: str, arguments: dict[str, object]) -> None:
        results[name] = call(name, arguments).output

    slow = threading.Thread(target=run, args=("demo__value", {"value": "beside"}))
    heavy = threading.Thread(target=run, args=("demo__heap", {}))
    heavy.start()
    slow.start()
    heavy.join()
    slow.join()
    assert results["demo__value"] == '"beside"'
    assert results["demo__heap"] == "demo__heap: [memory limit of 128 MB reached]"


def test_process_exit_in_a_handler_fails_only_that_call(call: Calls) -> None:
    result = call("demo__exits")
    assert result.is_error and result.output.startswith("demo__exits: ")
    assert call("demo__text").output == '"hello"'


@pytest.mark.slow
@pytest.mark.hostile
def test_the_default_time_limit_is_30_s(call: Calls) -> None:
    started = time.monotonic()
    result = call("demo__spin")
    assert result.output == "[timed out after 30 s]"
    # Node's timers have millisecond granularity and may fire up to 1 ms early:
    # 29.9 s still tells 30 s from any other limit.
    assert 29.9 <= time.monotonic() - started < 36


def test_a_source_changed_after_the_lock_is_refused_not_run(tmp_path: Path) -> None:
    deployment = published(tmp_path, "demo", {"src/demo.ts": SOURCE})
    (tmp_path / "demo" / "src" / "demo.ts").write_text(SOURCE + "\n// changed\n")
    runner = PluginRunner(deployment, Bridge())
    try:
        result = Calls(deployment, runner)("demo__text")
    finally:
        runner.close()
    assert result.is_error
    assert "src/demo.ts changed since the lock was written; run vessel-workers check" in (
        result.output
    )


def test_calls_at_once_each_get_their_own_answer(call: Calls) -> None:
    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = call("demo__value", {"value": i}).output

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: str(i) for i in range(6)}


@pytest.mark.hostile
def test_a_flood_of_host_calls_is_bounded(call: Calls) -> None:
    import json

    from workers.plugin.runner import MAX_HOST_CALLS, MAX_PENDING_HOST_CALLS

    result = call("demo__flood")
    assert not result.is_error, result.output
    found = json.loads(result.output)
    assert MAX_PENDING_HOST_CALLS <= found["ok"] <= MAX_HOST_CALLS
    assert f"host: at most {MAX_PENDING_HOST_CALLS} host calls may wait at once" in found["refused"]
    assert call("demo__text").output == '"hello"'
