"""Hostile plugin code: every escape a handler tries fails, and only that call is hurt."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.plugin.runner import PluginRunner

from .runtime_support import FIXTURES, Bridge, Calls, published

pytestmark = pytest.mark.hostile

HERE = Path(__file__).resolve()


@pytest.fixture(scope="module")
def call(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calls]:
    source = (FIXTURES / "hostile.ts").read_text()
    deployment = published(tmp_path_factory.mktemp("hostile"), "bad", {"src/bad.ts": source})
    runner = PluginRunner(deployment, Bridge())
    try:
        yield Calls(deployment, runner)
    finally:
        runner.close()


@pytest.fixture
def listener() -> Iterator[int]:
    """A real server on 127.0.0.1 that records any connection it gets."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(conn)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()
    assert accepted == [], "the runtime reached the host's loopback"


def _output(call: Calls, name: str, arguments: dict[str, object] | None = None) -> str:
    result = call(f"bad__{name}", arguments or {})
    assert not result.is_error, result.output
    text = json.loads(result.output)
    assert isinstance(text, str)
    return text


def test_require_net_cannot_reach_the_host(call: Calls, listener: int) -> None:
    assert _output(call, "require_net", {"port": listener}).startswith("failed:")


def test_fetch_inside_the_runtime_has_no_network(call: Calls, listener: int) -> None:
    assert _output(call, "fetch_out", {"port": listener}).startswith("failed:")


@pytest.mark.parametrize("name", ["child_process", "builtin_child_process"])
def test_no_child_process(call: Calls, name: str) -> None:
    assert _output(call, name).startswith("failed: ERR_ACCESS_DENIED")


def test_process_binding_is_refused(call: Calls) -> None:
    assert _output(call, "process_binding").startswith("failed:")


@pytest.mark.parametrize(
    "path", ["/etc/shadow", "/etc/passwd", "/proc/1/cmdline", "/proc/self/environ", str(HERE)]
)
def test_host_files_cannot_be_read(call: Calls, path: str) -> None:
    assert _output(call, "read_file", {"path": path}).startswith("failed:")


def test_the_root_folder_cannot_be_listed(call: Calls) -> None:
    assert _output(call, "list_root").startswith("failed: ERR_ACCESS_DENIED")


def test_its_own_sources_cannot_be_written(call: Calls) -> None:
    assert _output(call, "write_file").startswith("failed:")


def test_the_environment_is_empty(call: Calls) -> None:
    assert _output(call, "environment") == "{}"


def test_the_runtime_is_never_host_root(call: Calls) -> None:
    call("bad__environment")  # a process is up
    slots = call.runner._slots["bad"]
    pids = [process.pid for process in slots.idle]
    assert pids
    uids = []
    while pids:
        pid = pids.pop()
        status = Path(f"/proc/{pid}/status").read_text()
        uids.append(int(status.split("Uid:")[1].split()[0]))
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    assert len(uids) >= 2 and 0 not in uids, uids


def test_killing_its_own_runtime_fails_only_that_call(call: Calls) -> None:
    result = call("bad__kill_runtime")
    assert result.is_error and result.output.startswith("bad__kill_runtime: ")
    assert _output(call, "environment") == "{}"


def test_a_1_gb_webassembly_memory_is_refused(call: Calls) -> None:
    result = call("bad__wasm_memory")
    # Either the allocation fails inside (a RangeError the handler reports) or the
    # call ends at its memory limit: never 1 GB granted.
    assert result.output != '"done: 1073741824"'
    assert _output(call, "environment") == "{}"


def test_a_handler_reaches_nothing_of_the_runtime_outside_its_context(call: Calls) -> None:
    # Constructors, import(), stack frames, a stack overflow's error: none leads out.
    assert _output(call, "outer_realm") == "none"


def test_timers_a_call_leaves_never_run_in_the_next(call: Calls) -> None:
    assert _output(call, "leave_timer") == "left"
    assert _output(call, "wait_a_little") == "waited"
    bridge = call.runner.bridge
    assert isinstance(bridge, Bridge)
    assert [c for c in bridge.calls if c[1] == "log.info"] == []


def test_a_rejection_nobody_handles_hurts_no_later_call(call: Calls) -> None:
    assert _output(call, "unhandled") == "rejected"
    assert _output(call, "environment") == "{}"
    assert _output(call, "wait_a_little") == "waited"
