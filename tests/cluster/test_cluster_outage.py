"""Broker outages with real Redis processes and real workers (docs/broker-outages.md).

Each test starts its own redis-server on a port of its own, with an
append-only file (fsync always) where a restart must keep the data, and
kills it with SIGKILL mid-load; the tests on `outage_cluster` run twice, on a
plain Redis and on a TLS-only one (`rediss://`, a certificate checked against
the test's own CA):

* restarted with its data, ten times in a row: every call ends with one ok
  result, no worker exits, and a call submitted as soon as Redis answers again
  gets its result within 5 s;
* restarted empty: the workers register their lanes again and new calls run;
  the calls Redis forgot end with BrokerLostCall, not a timeout;
* a worker started before its Redis waits for it, one log line per attempt,
  and starts when Redis comes up; with no Redis at all it exits 2 with one line;
* the fast path runs on either: the worker passes its self-test and runs
  `broker.transport.RedisTransport`, the client sends envelopes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import celery
import kombu
import pytest
import redis

from bench.redis_server import free_port
from broker import fast_path
from broker.admission.keys import FAST_PATH_OFF_KEY, claim_key
from broker.client import CallHandle
from broker.errors import BrokerLostCall, TransientError
from broker.queues import shared_lane

from .conftest import CLUSTER_ENV, REPO, Cluster, Recorder, serve, write_deployment

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
    # redis-py drops (without closing) the sockets of a server that was killed
    # under it; the garbage collector reports them at a random later moment.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

#: Whether this venv's kombu and Celery are ones the envelope is known to work on.
KNOWN = (
    fast_path.release(kombu.__version__) in fast_path.KNOWN_KOMBU
    and fast_path.release(celery.__version__) in fast_path.KNOWN_CELERY
)

RESTARTS = 10
CALLS_PER_RESTART = 12


def _tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1, its key), made with openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed: run scripts/setup.sh")
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, request = folder / "server.pem", folder / "server.key", folder / "server.csr"
    ext = folder / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for args in (
        ("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca),
        ("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", request),
        ("x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial"),
    ):
        extra: tuple[str | Path, ...] = ("-days", "2")
        if args[0] == "req":
            extra += ("-subj", "/CN=vessel-test-ca" if "-x509" in args else "/CN=127.0.0.1")
        else:
            extra += ("-out", cert, "-extfile", ext)
        subprocess.run([openssl, *args, *extra], check=True, capture_output=True)
    return ca, cert, key


class OwnRedis:
    """A redis-server on a fixed port that a test kills and starts again; with `tls`,
    it speaks TLS only (a certificate its clients check against the test's CA)."""

    def __init__(self, folder: Path, *, persistent: bool = True, tls: bool = False) -> None:
        self.folder = folder
        self.port = free_port()
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.tls_args: tuple[str, ...] = ()
        if tls:
            ca, cert, key = _tls_files(folder)
            self.url = f"rediss://127.0.0.1:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
            self.tls_args = (
                *("--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"),
                *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
                *("--tls-ca-cert-file", str(ca)),
            )

    def start(self, *, wait: bool = True) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run scripts/setup.sh")
        aof = ("yes", "always") if self.persistent else ("no", "no")
        self.proc = subprocess.Popen(
            [
                *(binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *self.tls_args,
                *("--appendonly", aof[0], "--appendfsync", aof[1]),
                *("--maxmemory-policy", "noeviction", "--dir", str(self.folder)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if wait:
            self.wait_answering()

    def wait_answering(self) -> None:
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.RedisError:
                    assert time.monotonic() < deadline, "redis-server did not start"
                    time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(params=["redis", "rediss"])
def outage_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Cluster, OwnRedis]]:
    """Workers on a Redis of their own: plain (`redis://`) or TLS (`rediss://`)."""
    own = OwnRedis(tmp_path, tls=request.param == "rediss")
    own.start()
    recorder = Recorder()
    server = serve(recorder)
    deployment = write_deployment(
        tmp_path, server.server_address[1], {"svc-out": {"max_concurrent_calls": 16}}, timeout=5
    )
    env = dict(os.environ)
    env.pop("VESSEL_RESULT_BACKEND", None)
    env.update(CLUSTER_ENV)
    env["VESSEL_BROKER_URL"] = own.url
    env["VESSEL_WORKSPACE_ROOT"] = str(tmp_path / "workspaces")
    cluster = Cluster(
        url=own.url,
        deployment_path=deployment,
        env=env,
        recorder=recorder,
        workspaces=tmp_path / "workspaces",
    )
    try:
        yield cluster, own
    finally:
        cluster.stop_all()
        server.shutdown()
        server.server_close()
        own.stop()


def test_the_fast_path_runs_on_a_plain_and_a_tls_broker(
    outage_cluster: tuple[Cluster, OwnRedis],
) -> None:
    cluster, _own = outage_cluster
    proc = cluster.start_worker("service", "-c", "2", name="fp")
    client = cluster.client()
    try:
        # The worker's self-test: an envelope pushed by admission's Lua, consumed
        # back through the worker's own transport (broker.fast_path.self_test).
        # (scripts/test-fast-path-off runs this with the setting off.)
        on = os.environ.get("VESSEL_FAST_PATH", "on") != "off"
        off = cluster.redis.get(FAST_PATH_OFF_KEY)
        assert (off is None) is (on and KNOWN), off
        assert client.fast_path.enabled is (on and KNOWN), client.fast_path.reason
        shortcuts = on and fast_path.release(kombu.__version__) in fast_path.KNOWN_TRANSPORT_KOMBU
        transport = type(client.app.connection_for_write().transport).__name__
        assert transport == ("RedisTransport" if shortcuts else "SafeRedisTransport")
        for n in range(5):
            result = client.call("svc-out", "work", {"n": n}, owner="web/a", timeout=30)
            assert (result.outcome, _n(result.output)) == ("ok", n), result.output
        assert proc.poll() is None
    finally:
        client.close()


def _n(output: str) -> int:
    return int(output.split('"n": ')[1].split(",", maxsplit=1)[0])


def test_workers_ride_out_ten_redis_restarts_with_every_result_once(
    outage_cluster: tuple[Cluster, OwnRedis],
) -> None:
    cluster, own = outage_cluster
    workers = [
        cluster.start_worker("service", "-c", "4", name=f"ride{i}", wait=False) for i in range(2)
    ]
    for i, proc in enumerate(workers):
        cluster.wait_registered(f"ride{i}", proc)
    client = cluster.client()
    handles: list[tuple[int, CallHandle]] = []
    n = 0
    for restart in range(RESTARTS):
        for _ in range(CALLS_PER_RESTART):
            handles.append(
                (n, client.submit("svc-out", "work", {"n": n, "sleep": 0.15}, owner="web/a"))
            )
            n += 1
        time.sleep(0.3)  # calls running and queued when Redis dies
        own.kill()
        time.sleep(0.5 + (restart % 3) * 0.5)  # outages of 0.5 to 1.5 s
        own.start(wait=False)
        own.wait_answering()
        # A new call as soon as Redis answers: within a few of the workers' 1-s
        # reconnects (10 s: the tests run two at a time on two cores, and the
        # other may be spinning CPU), long before kombu's own growing backoff.
        fresh = client.submit("svc-out", "work", {"n": -restart - 1}, owner="web/a")
        assert fresh.result(timeout=10).outcome == "ok", f"after restart {restart + 1}"
        assert [p.poll() for p in workers] == [None, None], f"a worker exited at {restart + 1}"
    for number, handle in handles:
        result = handle.result(timeout=60)
        assert result.outcome == "ok", (number, result.output)
        assert _n(result.output) == number
    # One stored result per call: the done mark of each is set once, and every
    # call of the load reached the server (none was lost and not run).
    done = cluster.redis.keys("vessel:done:*")
    assert len(done) == len(handles) + RESTARTS
    assert {record.n for record in cluster.recorder.records} >= set(range(n))
    assert [p.poll() for p in workers] == [None, None]
    client.close()


def test_redis_back_empty_workers_register_again_and_lost_calls_end_clearly(
    tmp_path: Path,
) -> None:
    own = OwnRedis(tmp_path, persistent=False)
    own.start()
    recorder = Recorder()
    server = serve(recorder)
    deployment = write_deployment(
        tmp_path, server.server_address[1], {"svc-empty": {"max_concurrent_calls": 1}}
    )
    env = dict(os.environ)
    env.pop("VESSEL_RESULT_BACKEND", None)
    env.update(CLUSTER_ENV)
    env["VESSEL_BROKER_URL"] = own.url
    env["VESSEL_WORKSPACE_ROOT"] = str(tmp_path / "workspaces")
    cluster = Cluster(
        url=own.url,
        deployment_path=deployment,
        env=env,
        recorder=recorder,
        workspaces=tmp_path / "workspaces",
    )
    try:
        worker = cluster.start_worker("service", "-c", "2", name="empty")
        client = cluster.client()
        # Queued behind the agent's limit of 1: Redis forgets them.
        handles = [
            client.submit("svc-empty", "work", {"n": i, "sleep": 3}, owner="web/a")
            for i in range(4)
        ]
        time.sleep(0.5)
        own.kill()
        time.sleep(0.5)
        own.start()
        # The worker registers its lane again (heartbeat) and takes new calls.
        deadline = time.monotonic() + 15
        while not cluster.redis.exists("vessel:window:vessel.service"):
            assert time.monotonic() < deadline, "the worker did not register again"
            time.sleep(0.1)
        hosts = cluster.redis.hkeys("vessel:workers:vessel.service")
        assert [h for h in hosts if h.startswith("empty@")], hosts
        # The call that was running ends with its result, stored in the new Redis.
        assert handles[0].result(timeout=15).outcome == "ok"
        fresh = client.submit("svc-empty", "work", {"n": 99}, owner="web/a")
        assert fresh.result(timeout=15).outcome == "ok"
        lost = 0
        for handle in handles[1:]:
            with pytest.raises(BrokerLostCall, match="submit it again"):
                handle.result(timeout=30)
            lost += 1
        assert lost == 3
        assert worker.poll() is None
        client.close()
    finally:
        cluster.stop_all()
        server.shutdown()
        server.server_close()
        own.stop()


def _worker_cmd(deployment: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "workers.cli", "worker", "service"),
        *("-d", str(deployment), "--hostname", "early@%h", "-l", "WARNING"),
    ]


def test_a_worker_started_before_redis_waits_then_starts(tmp_path: Path) -> None:
    own = OwnRedis(tmp_path, persistent=False)
    deployment = write_deployment(tmp_path, 9, {"svc-early": {}})
    env = dict(os.environ, **CLUSTER_ENV, VESSEL_BROKER_URL=own.url)
    env.pop("VESSEL_RESULT_BACKEND", None)
    log = tmp_path / "early.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            _worker_cmd(deployment), env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while log.read_text().count("waiting for the broker Redis") < 2:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        own.start()
        client = redis.Redis(port=own.port, decode_responses=True)
        deadline = time.monotonic() + 30
        while not client.exists("vessel:window:vessel.service"):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the worker did not start after Redis came up"
            time.sleep(0.1)
        client.close()
        waits = [line for line in log.read_text().splitlines() if "waiting for the" in line]
        assert all(re.search(r"attempt \d+, next in", line) for line in waits)
        assert "Traceback" not in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        own.stop()


def test_a_worker_with_no_redis_exits_2_with_one_line(tmp_path: Path) -> None:
    deployment = write_deployment(tmp_path, 9, {"svc-none": {}})
    url = f"redis://:secret-pw@127.0.0.1:{free_port()}/0"
    env = dict(os.environ, VESSEL_BROKER_URL=url, VESSEL_BROKER_OUTAGE_SECONDS="3")
    env.pop("VESSEL_RESULT_BACKEND", None)
    done = subprocess.run(
        _worker_cmd(deployment), env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "waiting for the" not in line]
    assert len(lines) == 1, done.stderr
    (line,) = lines
    assert line.startswith("vessel-workers worker service: cannot reach the broker Redis")
    assert "redis://:***@127.0.0.1" in line and "secret-pw" not in done.stderr
    assert "VESSEL_BROKER_URL" in line and "VESSEL_BROKER_OUTAGE_SECONDS=3" in line


def _sentinel_binary() -> str:
    binary = shutil.which("redis-sentinel")
    if binary is None:
        pytest.fail(
            "redis-sentinel is not installed: run scripts/setup.sh "
            "(or apt-get install -y redis-sentinel)"
        )
    return binary


def test_sentinel_fails_over_and_calls_go_on(tmp_path: Path) -> None:
    sentinel_binary = _sentinel_binary()
    master = OwnRedis(tmp_path / "master")
    replica = OwnRedis(tmp_path / "replica")
    for own in (master, replica):
        own.folder.mkdir()
    master.start()
    replica.start()
    redis.Redis(port=replica.port).replicaof("127.0.0.1", master.port)
    sentinel_port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {sentinel_port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor vessel-test 127.0.0.1 {master.port} 1\n"
        "sentinel down-after-milliseconds vessel-test 1000\n"
        "sentinel failover-timeout vessel-test 5000\n"
    )
    sentinel = subprocess.Popen(
        [sentinel_binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    recorder = Recorder()
    server = serve(recorder)
    deployment = write_deployment(tmp_path, server.server_address[1], {"svc-sent": {}})
    url = f"sentinel://127.0.0.1:{sentinel_port}/0"
    env = dict(os.environ)
    env.pop("VESSEL_RESULT_BACKEND", None)
    env.update(CLUSTER_ENV)
    env.update(
        VESSEL_BROKER_URL=url,
        VESSEL_SENTINEL_MASTER="vessel-test",
        VESSEL_WORKSPACE_ROOT=str(tmp_path / "workspaces"),
    )
    cluster = Cluster(
        url=master.url,
        deployment_path=deployment,
        env=env,
        recorder=recorder,
        workspaces=tmp_path / "workspaces",
    )
    try:
        ask = redis.Redis(port=sentinel_port, decode_responses=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                if ask.sentinel_master("vessel-test").get("num-slaves", 0) >= 1:
                    break
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline, "Sentinel did not see the replica"
            time.sleep(0.2)
        worker = cluster.start_worker("service", "-c", "2", name="sent", wait=False)
        cluster.wait_registered("sent", worker)
        client = cluster.client()
        before = [client.submit("svc-sent", "work", {"n": i}, owner="web/a") for i in range(10)]
        assert all(h.result(timeout=30).outcome == "ok" for h in before)
        master.kill()
        deadline = time.monotonic() + 40
        while True:
            address = ask.sentinel_get_master_addr_by_name("vessel-test")
            if address and int(address[1]) == replica.port:
                break
            assert time.monotonic() < deadline, "Sentinel did not fail over"
            time.sleep(0.2)
        after: list[CallHandle] = []
        deadline = time.monotonic() + 30
        while len(after) < 10:
            try:
                after.append(
                    client.submit("svc-sent", "work", {"n": 100 + len(after)}, owner="web/a")
                )
            except TransientError:
                assert time.monotonic() < deadline, "no submit succeeded after the failover"
                time.sleep(0.2)
        assert all(h.result(timeout=30).outcome == "ok" for h in after)
        assert worker.poll() is None
        client.close()
        ask.close()
    finally:
        cluster.stop_all()
        sentinel.terminate()
        sentinel.wait(10)
        server.shutdown()
        server.server_close()
        master.stop()
        replica.stop()


def test_a_call_that_finishes_during_an_outage_stores_its_result_once(
    outage_cluster: tuple[Cluster, OwnRedis],
) -> None:
    cluster, own = outage_cluster
    worker = cluster.start_worker("service", "-c", "2", name="held")
    client = cluster.client()
    handle = client.submit("svc-out", "work", {"n": 7, "sleep": 1.5}, owner="web/a")
    deadline = time.monotonic() + 30
    while cluster.recorder.count(7) == 0:
        assert time.monotonic() < deadline, "the call did not start"
        time.sleep(0.05)
    own.kill()
    # The call ends while Redis is down: its worker holds the result.
    while not cluster.recorder.finished():
        assert time.monotonic() < deadline, "the call did not finish"
        time.sleep(0.05)
    time.sleep(1.0)
    own.start()
    result = handle.result(timeout=20)
    assert result.outcome == "ok" and _n(result.output) == 7
    # Nothing left that could run it again: no claim on it, nothing in its lane
    # (a re-dispatch before the result was stored would show as one or the other
    # until its run ended; after it, the done mark turns any away).
    redis_client = cluster.redis
    while redis_client.exists(claim_key(handle.call_id)) or redis_client.llen(
        shared_lane("service")
    ):
        assert time.monotonic() < deadline + 30, "the call's claim or lane never emptied"
        time.sleep(0.05)
    assert cluster.recorder.count(7) == 1  # stored from memory, not run again
    assert worker.poll() is None
    client.close()


def test_an_outage_past_the_limit_stops_the_worker_with_one_line(
    outage_cluster: tuple[Cluster, OwnRedis],
) -> None:
    cluster, own = outage_cluster
    cluster.env["VESSEL_BROKER_OUTAGE_SECONDS"] = "3"
    worker = cluster.start_worker("service", "-c", "2", name="limit")
    own.kill()
    code = worker.wait(60)
    assert code == 1
    log = (cluster.workspaces.parent / "limit.log").read_text()
    lines = [line for line in log.splitlines() if "VESSEL_BROKER_OUTAGE_SECONDS=3 reached" in line]
    # One CRITICAL log line, and the one line on stderr the supervisor shows.
    assert any(line.startswith("vessel-workers worker service: ") for line in lines), log
    assert "Unrecoverable error" not in log


def test_call_on_the_command_line_waits_across_an_outage_and_says_so_once(
    outage_cluster: tuple[Cluster, OwnRedis],
) -> None:
    cluster, own = outage_cluster
    cluster.start_worker("service", "-c", "2", name="cli")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "workers.cli", "call", "-d", str(cluster.deployment_path)),
            *("svc-out", "work", '{"n": 5, "sleep": 2}', "--timeout", "60"),
        ],
        env=cluster.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while cluster.recorder.count(5) == 0:
        assert time.monotonic() < deadline, "the call did not start"
        time.sleep(0.05)
    own.kill()
    time.sleep(1.0)
    own.start()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert '"n": 5' in out
    unreachable_lines = [line for line in err.splitlines() if "is unreachable" in line]
    assert len(unreachable_lines) == 1, err
    assert "retrying" in unreachable_lines[0]
    assert "Traceback" not in err
