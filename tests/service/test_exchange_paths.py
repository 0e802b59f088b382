"""The two ways an exchange keeps the whole-call limit and the cancel, phase by phase.

* inline (the default transport, `stops_by_itself`): the exchange runs on the
  calling thread and every socket operation obeys the call's deadline and
  cancel flag; connects run on a helper thread;
* threaded (any other transport): the exchange runs on a thread of its own and
  the calling thread gives it up.

Each hostile phase is tried on both, against real sockets on 127.0.0.1: a
connect nobody answers (a listener whose accept queue is full drops the SYN),
a request nobody reads (a body larger than the socket buffers), an answer that
never comes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from workers.service.transport import stops_by_itself

from .conftest import SLACK_SECONDS, CancelAfter, timed

pytestmark = pytest.mark.hostile

TIMEOUT_TEXT = "lookup: the service did not answer within 1 s"
#: Larger than any socket buffer pair here: sending it blocks when nobody reads.
BIG_ARGUMENT = "x" * (16 * 1024 * 1024)


@pytest.fixture(params=["inline", "threaded"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _transport(path: str) -> httpx.BaseTransport | None:
    # None: the caller builds its default (stopping) transport.
    return None if path == "inline" else httpx.HTTPTransport(retries=0)


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A URL whose TCP connect never completes: the listener's accept queue is full."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # it completes in the kernel's queue
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    for filler in fillers:
        filler.close()
    listener.close()


def test_the_default_transport_runs_exchanges_inline(make_caller) -> None:
    setup = make_caller("http://127.0.0.1:9")
    assert setup.caller.runs_inline
    plain = make_caller("http://127.0.0.1:9", transport=httpx.HTTPTransport())
    assert not plain.caller.runs_inline
    assert not stops_by_itself(httpx.HTTPTransport())


def test_a_connect_nobody_answers_times_out(black_hole, make_caller, path) -> None:
    setup = make_caller(black_hole, timeout=1, transport=_transport(path))
    result, elapsed = timed(setup.call)
    assert result.output == TIMEOUT_TEXT and result.outcome == "timeout"
    assert 0.95 <= elapsed < 1 + SLACK_SECONDS


def test_cancel_during_a_connect_nobody_answers(black_hole, make_caller, path) -> None:
    setup = make_caller(black_hole, timeout=10, transport=_transport(path))
    cancel = CancelAfter(0.3)
    result = setup.call(cancel=cancel)
    assert result.output == "[cancelled]" and result.outcome == "cancelled"
    assert cancel.stopped_within(SLACK_SECONDS)  # at the cancel, long before the 10-s limit


def test_a_request_nobody_reads_times_out(raw_server, make_caller, path) -> None:
    server = raw_server(lambda conn, s: s.stopped.wait(30))
    setup = make_caller(server.url, timeout=1, transport=_transport(path))
    result, elapsed = timed(lambda: setup.call({"id": BIG_ARGUMENT}))
    assert result.output == TIMEOUT_TEXT
    assert elapsed < 1 + SLACK_SECONDS


def test_cancel_while_a_request_nobody_reads_is_sent(raw_server, make_caller, path) -> None:
    server = raw_server(lambda conn, s: s.stopped.wait(30))
    setup = make_caller(server.url, timeout=10, transport=_transport(path))
    cancel = CancelAfter(0.3)
    result = setup.call({"id": BIG_ARGUMENT}, cancel=cancel)
    assert result.output == "[cancelled]"
    assert cancel.stopped_within(SLACK_SECONDS)


def test_an_answer_that_never_comes_times_out(raw_server, make_caller, path) -> None:
    def silent(conn, server):
        server.read_request(conn)
        server.stopped.wait(30)

    setup = make_caller(raw_server(silent).url, timeout=1, transport=_transport(path))
    result, elapsed = timed(setup.call)
    assert result.output == TIMEOUT_TEXT and result.status is None
    assert 0.95 <= elapsed < 1 + SLACK_SECONDS


def test_a_good_answer_is_the_same_on_both_paths(http_server, make_caller, path) -> None:
    http_server.answer("/agent-tools/lookup", 200, b'{"ok": true}')
    result = make_caller(http_server.url, transport=_transport(path)).call()
    assert (result.output, result.status, result.is_error) == ('{\n  "ok": true\n}', 200, False)


def test_a_given_up_connect_leaves_no_thread_behind(black_hole, make_caller) -> None:
    setup = make_caller(black_hole, timeout=0.3)
    assert setup.call().outcome == "timeout"
    # The helper's own connect timeout is the call's time left: it ends too.
    deadline = time.monotonic() + 2
    while any(t.name == "vessel-service-connect" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the connect helper is still running"
        time.sleep(0.05)
