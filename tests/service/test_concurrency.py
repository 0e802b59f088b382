"""One ServiceCaller, many threads: a service worker runs many calls at once."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

PATH = "/agent-tools/lookup"


def test_20_threads_at_once_each_get_their_own_answer(http_server, make_caller):
    # Each answer waits until all 20 requests are in the server at once: calls run
    # one after another would break the barrier (the calls then fail) instead of
    # just taking longer, so no clock is read.
    together = threading.Barrier(20, timeout=4)  # under the calls' 5-s limit

    def slow_echo(h):
        together.wait()
        h.reply(
            200,
            json.dumps(
                {"owner": h.headers["X-Vessel-Owner"], "args": json.loads(h.request_body)}
            ).encode(),
        )

    http_server.route(PATH, slow_echo)
    setup = make_caller(http_server.url, timeout=5)
    owners = [f"web/user{i}" for i in range(20)]
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(
            pool.map(
                lambda i: setup.call({"id": f"A-{i}"}, owner=owners[i], call_id=f"c-{i}"),
                range(20),
            )
        )
    for i, result in enumerate(results):
        assert not result.is_error, result.output
        assert result.call_id == f"c-{i}"
        assert json.loads(result.output) == {"owner": owners[i], "args": {"id": f"A-{i}"}}
    assert not together.broken


def test_concurrent_calls_mixing_hostile_and_good_servers(http_server, raw_server, make_caller):
    def silent(conn, server):
        server.read_request(conn)
        server.stopped.wait(30)

    http_server.answer(PATH, 200, b"fine")
    good = make_caller(http_server.url, timeout=1)
    bad = make_caller(raw_server(silent).url, timeout=1)
    with ThreadPoolExecutor(max_workers=20) as pool:
        futures = [pool.submit((good if i % 2 else bad).call) for i in range(20)]
        outputs = [f.result().output for f in futures]
    assert outputs.count("fine") == 10
    assert outputs.count("lookup: the service did not answer within 1 s") == 10


def test_no_threads_are_left_behind(http_server, make_caller):
    http_server.answer(PATH, 200, b"{}")
    setup = make_caller(http_server.url)
    before = threading.active_count()
    for _ in range(20):
        setup.call()
    # Threads that end take a moment to leave; ones left behind never do.
    deadline = time.monotonic() + 10
    while threading.active_count() > before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before + 1
