"""Hostile and broken services, one test per misbehaviour, on raw sockets.

Each asserts the model's text word for word (seed 001) and, where the point is
time or memory, that the call ended on time with memory bounded.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import tracemalloc

import pytest

from .conftest import SLACK_SECONDS, CancelAfter, timed

pytestmark = pytest.mark.hostile

TIMEOUT_TEXT = "lookup: the service did not answer within 1 s"
UNREACHABLE = "lookup: the service is unreachable"
TOO_LARGE = "lookup: the service's answer was too large"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- unreachable -------------------------------------------------------------


def test_connection_refused_is_unreachable(make_caller):
    result, elapsed = timed(make_caller(f"http://127.0.0.1:{_free_port()}").call)
    assert result.output == UNREACHABLE
    assert result.is_error
    assert result.status is None
    assert result.outcome == "error"
    assert elapsed < SLACK_SECONDS  # at once, not at the 5-s limit


def test_dns_failure_is_unreachable(make_caller):
    result = make_caller("http://no-such-host.invalid", timeout=3).call()
    assert result.output == UNREACHABLE
    assert result.status is None


def test_reset_before_a_response_is_unreachable(raw_server, make_caller):
    def reset(conn, server):
        server.read_request(conn)
        # SO_LINGER 0: close() sends RST instead of FIN.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    result = make_caller(raw_server(reset).url).call()
    assert result.output == UNREACHABLE
    assert result.status is None


def test_close_without_a_response_is_unreachable(raw_server, make_caller):
    result = make_caller(raw_server(lambda conn, s: s.read_request(conn)).url).call()
    assert result.output == UNREACHABLE


def test_an_answer_that_is_not_http_is_unreachable(raw_server, make_caller):
    def babble(conn, server):
        server.read_request(conn)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\nhello there\r\n\r\n")

    assert make_caller(raw_server(babble).url).call().output == UNREACHABLE


# --- time ---------------------------------------------------------------------


def test_server_that_accepts_and_never_answers_times_out(raw_server, make_caller):
    def silent(conn, server):
        server.read_request(conn)
        server.stopped.wait(30)

    setup = make_caller(raw_server(silent).url, timeout=1)
    result, elapsed = timed(setup.call)
    assert result.output == TIMEOUT_TEXT
    assert result.is_error
    assert result.outcome == "timeout"
    assert result.status is None
    assert 0.95 <= elapsed < 1 + SLACK_SECONDS


def test_slow_drip_body_is_cut_at_the_whole_call_limit(raw_server, make_caller):
    def drip(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):
            if server.stopped.is_set():
                return
            conn.sendall(b"x")
            time.sleep(0.2)

    setup = make_caller(raw_server(drip).url, timeout=1)
    result, elapsed = timed(setup.call)
    assert result.output == TIMEOUT_TEXT
    assert result.outcome == "timeout"
    assert result.status == 200  # the status line did arrive
    assert 0.95 <= elapsed < 1 + SLACK_SECONDS


def test_slow_drip_headers_are_cut_at_the_whole_call_limit(raw_server, make_caller):
    def drip(conn, server):
        server.read_request(conn)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 100:
            if server.stopped.is_set():
                return
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    result, elapsed = timed(make_caller(raw_server(drip).url, timeout=1).call)
    assert result.output == TIMEOUT_TEXT
    assert 0.95 <= elapsed < 1 + SLACK_SECONDS


def test_fractional_timeout_is_written_as_is(raw_server, make_caller):
    def silent(conn, server):
        server.read_request(conn)
        server.stopped.wait(30)

    result = make_caller(raw_server(silent).url, timeout=0.5).call()
    assert result.output == "lookup: the service did not answer within 0.5 s"


def test_server_that_never_reads_the_request_times_out(raw_server, make_caller):
    # The request body is small, so it fits the socket buffers; the server
    # simply never looks at it.
    result, elapsed = timed(
        make_caller(raw_server(lambda c, s: s.stopped.wait(30)).url, timeout=1).call
    )
    assert result.output == TIMEOUT_TEXT
    assert elapsed < 1 + SLACK_SECONDS


# --- size -----------------------------------------------------------------------


def _flood(declare_length: bool):
    def handler(conn, server):
        server.read_request(conn)
        head = b"HTTP/1.1 200 OK\r\n"
        if declare_length:
            head += b"Content-Length: 10000000\r\n"
        else:
            head += b"Connection: close\r\n"
        conn.sendall(head + b"\r\n")
        chunk = b"z" * 65536
        for _ in range(10_000_000 // len(chunk) + 1):
            conn.sendall(chunk)
            server.count_sent(len(chunk))

    return handler


@pytest.mark.parametrize("declare_length", [True, False], ids=["content-length", "read-to-close"])
def test_10_mb_body_is_refused_fast_with_memory_bounded(raw_server, make_caller, declare_length):
    server = raw_server(_flood(declare_length))
    setup = make_caller(server.url, timeout=10)
    tracemalloc.start()
    try:
        result, elapsed = timed(setup.call)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.output == TOO_LARGE
    assert result.is_error
    assert result.status == 200
    assert elapsed < SLACK_SECONDS  # at the cap, not at the 10-s limit
    # The cap is 1 MB; a little over twice that for the chunks and their join.
    assert peak < 4_000_000
    # Reading stopped: the server's sending failed (or ended) before the whole 10 MB.
    assert server.handler_ended.wait(10)
    assert server.sent < 9_000_000


def test_declared_length_over_the_cap_is_refused_before_reading(raw_server, make_caller):
    def liar(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\nsmall")
        server.stopped.wait(30)

    result, elapsed = timed(make_caller(raw_server(liar).url, timeout=5).call)
    assert result.output == TOO_LARGE
    assert elapsed < SLACK_SECONDS  # before reading, not at the 5-s limit


def test_content_length_smaller_than_the_body_shows_the_declared_bytes(raw_server, make_caller):
    def liar(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
        for _ in range(150):  # 10 MB more than it declared
            conn.sendall(b"!" * 65536)

    result, elapsed = timed(make_caller(raw_server(liar).url, timeout=5).call)
    assert result.output == "0123456789"
    assert not result.is_error
    assert elapsed < SLACK_SECONDS  # at the declared length, not at the 5-s limit


def test_content_length_larger_than_the_body_then_close_is_unreachable(raw_server, make_caller):
    def liar(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly this")

    result = make_caller(raw_server(liar).url).call()
    assert result.output == UNREACHABLE
    assert result.status == 200


def test_content_length_larger_than_the_body_then_silence_times_out(raw_server, make_caller):
    def liar(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly this")
        server.stopped.wait(30)

    result = make_caller(raw_server(liar).url, timeout=1).call()
    assert result.output == TIMEOUT_TEXT


def test_garbage_content_length_is_unreachable(raw_server, make_caller):
    def liar(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nbody")

    assert make_caller(raw_server(liar).url).call().output == UNREACHABLE


def test_close_mid_body_is_unreachable(raw_server, make_caller):
    def half(conn, server):
        server.read_request(conn)
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"record": {"id": "A-')

    result = make_caller(raw_server(half).url).call()
    assert result.output == UNREACHABLE
    assert result.is_error
    assert result.status == 200
    assert result.outcome == "error"


def test_broken_chunked_encoding_is_unreachable(raw_server, make_caller):
    def broken(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n")

    assert make_caller(raw_server(broken).url).call().output == UNREACHABLE


def test_chunked_body_is_read(raw_server, make_caller):
    def chunked(conn, server):
        server.read_request(conn)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )

    assert make_caller(raw_server(chunked).url).call().output == "hello world"


# --- redirects ------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirect_to_another_host_is_not_followed(http_server, raw_server, make_caller, status):
    other = raw_server(lambda conn, s: s.read_request(conn))
    http_server.answer("/agent-tools/lookup", status, b"moved", {"Location": f"{other.url}/steal"})
    result = make_caller(http_server.url).call()
    assert result.output == f"lookup failed (HTTP {status})"
    assert result.is_error
    assert result.status == status
    assert other.connections_before_probe() == 0


# --- cancellation ---------------------------------------------------------------


def test_cancel_while_waiting_for_an_answer(raw_server, make_caller):
    def silent(conn, server):
        server.read_request(conn)
        server.stopped.wait(30)

    setup = make_caller(raw_server(silent).url, timeout=10)
    cancel = CancelAfter(0.3)
    result = setup.call(cancel=cancel)
    assert result.output == "[cancelled]"
    assert result.is_error
    assert result.outcome == "cancelled"
    assert cancel.stopped_within(SLACK_SECONDS)  # at the cancel, not at the 10-s limit


def test_cancel_during_a_dripping_body(raw_server, make_caller):
    def drip(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):
            if server.stopped.is_set():
                return
            conn.sendall(b"x")
            time.sleep(0.2)

    setup = make_caller(raw_server(drip).url, timeout=10)
    cancel = CancelAfter(0.5)
    result = setup.call(cancel=cancel)
    assert result.output == "[cancelled]"
    assert cancel.stopped_within(SLACK_SECONDS)


def test_cancel_set_before_the_call_sends_nothing(raw_server, make_caller):
    server = raw_server(lambda conn, s: s.read_request(conn))
    cancel = threading.Event()
    cancel.set()
    result = make_caller(server.url).call(cancel=cancel)
    assert result.output == "[cancelled]"
    assert server.connections_before_probe() == 0


def test_cancelled_exchange_frees_its_connection(raw_server, make_caller):
    # The abandoned exchange's socket is shut down: the server sees the close
    # at once rather than when the tool's 10 s are up.
    closed = threading.Event()

    def silent(conn, server):
        server.read_request(conn)
        conn.settimeout(5)
        try:
            if conn.recv(1) == b"":
                closed.set()
        except OSError:
            closed.set()

    setup = make_caller(raw_server(silent).url, timeout=10)
    setup.call(cancel=CancelAfter(0.2))
    assert closed.wait(SLACK_SECONDS)  # before the server's own 5-s read timeout


# --- given-up exchanges end, and keep-alive works ---------------------------------


def _service_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("vessel-service-")]


def _threads_ended(seconds: float) -> bool:
    """True once every exchange thread has ended (joined, not slept on)."""
    deadline = time.monotonic() + seconds
    for thread in _service_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    return _service_threads() == []


def _keep_alive_then(second):
    """Answer the first request normally on a kept-alive connection, then `second`."""

    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
        server.read_request(conn)
        second(conn, server)

    return handler


def test_keep_alive_connection_is_reused(raw_server, make_caller):
    def twice(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
        server.stopped.wait(5)

    server = raw_server(twice)
    setup = make_caller(server.url)
    assert setup.call().output == "first"
    assert setup.call().output == "second"
    assert server.connections == 1


def test_endless_100_continue_on_a_reused_connection_ends(raw_server, make_caller):
    ended = threading.Event()

    def endless(conn, server):
        try:
            while not server.stopped.is_set():
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                time.sleep(0.02)
        except OSError:
            ended.set()

    server = raw_server(_keep_alive_then(endless))
    setup = make_caller(server.url, timeout=1)
    assert setup.call().output == "first"
    result, elapsed = timed(setup.call)
    assert result.output == TIMEOUT_TEXT
    assert elapsed < 1 + SLACK_SECONDS
    # The exchange thread stopped reading and its connection was closed.
    assert ended.wait(SLACK_SECONDS)
    assert _threads_ended(SLACK_SECONDS)


def test_cancel_while_a_reused_connection_waits_for_headers(raw_server, make_caller):
    closed = threading.Event()

    def silent(conn, server):
        conn.settimeout(5)
        try:
            if conn.recv(1) == b"":
                closed.set()
        except OSError:
            closed.set()

    setup = make_caller(raw_server(_keep_alive_then(silent)).url, timeout=10)
    assert setup.call().output == "first"
    cancel = CancelAfter(0.2)
    result = setup.call(cancel=cancel)
    assert result.output == "[cancelled]"
    assert cancel.stopped_within(SLACK_SECONDS)
    assert closed.wait(SLACK_SECONDS)  # before the server's own 5-s read timeout


def test_huge_response_headers_are_unreachable(raw_server, make_caller):
    def huge(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(200):
            conn.sendall(b"X-Junk: " + b"j" * 65536 + b"\r\n")

    result, elapsed = timed(make_caller(raw_server(huge).url, timeout=5).call)
    assert result.output == UNREACHABLE
    assert elapsed < SLACK_SECONDS  # at the header limit, not at the 5-s limit
