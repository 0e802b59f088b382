"""`host.fetch` over https: the worker dials the checked address, and TLS (SNI and the
certificate check) still uses the URL's name. A real TLS server on 127.0.0.1 with a
certificate made here by `openssl`, trusted through SSL_CERT_FILE."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from workers.plugin.host import HostFailed

from .host_support import Handler, host_setup, make_plugin

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}"),
            *("-addext", f"subjectAltName=DNS:{name}"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.routes = {"/": lambda h: h.reply(200, b"over tls")}
        self.seen: list[object] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.sni: list[str | None] = []

        def remember(sock: ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
            self.sni.append(server_name)

        context.sni_callback = remember
        self.socket = context.wrap_socket(self.socket, server_side=True)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client refusing the certificate is the point of one test


@pytest.fixture
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Server, Path]]:
    cert, key = _certificate(tmp_path, "localhost")
    server = _Server(cert, key)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # The worker's client trusts the operator's CA bundle (SSL_CERT_FILE), read when built.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    try:
        yield server, cert
    finally:
        server.shutdown()
        server.server_close()


def test_https_verifies_the_name_while_dialling_the_checked_address(
    tls: tuple[_Server, Path],
) -> None:
    server, _ = tls
    port = server.server_address[1]
    plugin = make_plugin(egress=("localhost",), private_egress=(f"127.0.0.1:{port}",))
    with host_setup(plugin) as setup:
        answer = setup.call("fetch", {"url": f"https://localhost:{port}/"})
    assert (answer["status"], answer["body"]) == (200, "over tls")
    assert server.sni == ["localhost"]


@pytest.mark.hostile
def test_a_certificate_for_another_name_is_refused(tls: tuple[_Server, Path]) -> None:
    server, _ = tls
    port = server.server_address[1]
    # The server's certificate names localhost; the URL names the address itself.
    plugin = make_plugin(egress=("127.0.0.1",), private_egress=(f"127.0.0.1:{port}",))
    with host_setup(plugin) as setup, pytest.raises(HostFailed, match="CERTIFICATE_VERIFY_FAILED"):
        setup.call("fetch", {"url": f"https://127.0.0.1:{port}/"})
