"""A broker Redis that is not there or refuses us: `call` and every client verb say
so in one line naming the URL and what to check, and exit 2, nothing run.

Each case against a real redis-server of the test's own: nothing listening, one
with `--requirepass` (no password, a wrong one), a database number it does not
have, TLS on one side only (a `--tls-port` server with a certificate made here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXAMPLES, REPO, free_port

from bench.redis_server import redis_server_argv, wait_until_answering

DEPLOYMENT = str(EXAMPLES / "deployment.toml")


def run(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VESSEL_")}
    environ["VESSEL_BROKER_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line(done: subprocess.CompletedProcess[str], verb: str, *words: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"vessel-workers {verb}: "), line
    for word in words:
        assert word in line, line
    assert done.stdout == ""
    return line


def _server(folder: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        redis_server_argv(port, folder, extra=args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = _server(tmp_path_factory.mktemp("pw"), port, "--requirepass", "s3cret")
    wait_until_answering(proc, port, password="s3cret")
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed (it makes the TLS test's certificate)")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes"),
            *("-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    # `--port 0` after the plain port: TLS only (the last setting of an option wins).
    proc = _server(
        folder,
        port,
        *("--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert)),
        *("--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"),
    )
    wait_until_answering(proc, port, tls=True)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


CALL = ("call", "-d", DEPLOYMENT, "field-guide", "species", "{}")


def test_call_to_a_port_where_nothing_listens() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    line = assert_one_line(run(*CALL, url=url), "call", url, "cannot reach", "nothing ran")
    assert "VESSEL_BROKER_URL" in line


@pytest.mark.parametrize(
    "verb",
    [
        ("result", "0123456789abcdef0123456789abcdef"),
        ("cancel", "0123456789abcdef0123456789abcdef"),
        ("end-turn", "turn-1"),
        ("status",),
        ("files", "field-guide", "turn-1", "ls"),
    ],
    ids=lambda v: v[0],
)
def test_every_client_verb_to_a_port_where_nothing_listens(verb: tuple[str, ...]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    name, *rest = verb
    done = run(name, "-d", DEPLOYMENT, *rest, url=url)
    assert_one_line(done, name, url, "cannot reach", "VESSEL_BROKER_URL")


def test_call_without_the_password_a_redis_requires(password_redis: str) -> None:
    url = f"redis://{password_redis}/0"
    assert_one_line(run(*CALL, url=url), "call", url, "requires a password", "VESSEL_BROKER_URL")


def test_call_with_a_wrong_password_never_prints_it(password_redis: str) -> None:
    url = f"redis://:not-the-password@{password_redis}/0"
    line = assert_one_line(run(*CALL, url=url), "call", "refused the password")
    assert "not-the-password" not in line
    assert f"redis://:***@{password_redis}/0" in line


def test_call_with_the_password_goes_past_the_check(password_redis: str) -> None:
    # Reachable: `status` reads the (empty) admission keys and exits 0.
    done = run("status", "-d", DEPLOYMENT, "--json", url=f"redis://:s3cret@{password_redis}/0")
    assert done.returncode == 0, done.stderr


def test_call_to_a_database_the_server_does_not_have(redis_server: str) -> None:
    url = f"{redis_server}/999"
    assert_one_line(run(*CALL, url=url), "call", url, "no such database", "VESSEL_BROKER_URL")


def test_call_in_plain_text_to_a_tls_redis(tls_redis: str) -> None:
    url = f"redis://{tls_redis}/0"
    assert_one_line(run(*CALL, url=url), "call", url, "rediss://")


def test_call_in_tls_to_a_plain_redis(redis_server: str) -> None:
    url = redis_server.replace("redis://", "rediss://") + "/0?ssl_cert_reqs=none"
    assert_one_line(run(*CALL, url=url), "call", url, "TLS", "redis://")
