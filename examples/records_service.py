"""A small records service for trying service tools (seed 001). Standard library only.

    RECORDS_TOKEN=change-me-please python examples/records_service.py --port 8000

It answers `POST /agent-tools/lookup` with `{"id": "A-1042"}` as the body, the
way seed 001 describes the request your application receives:

- `X-Internal-Token` must equal `$RECORDS_TOKEN` (401 otherwise);
- `X-Vessel-Owner` says who the turn is for: restricted records are shown only
  to owners of the `staff` app (`staff/<user>`), others get a 403 saying so;
- an unknown id gets a 404 whose body tells the model what ids look like;
- a body that is not a JSON object with a string `id` gets a 400.

It prints `records service listening on http://HOST:PORT` once it accepts
connections (`--port 0` picks a free port).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["RECORDS", "main"]

LOOKUP_PATH = "/agent-tools/lookup"
#: Requests are tiny; a bigger body is refused rather than read.
MAX_REQUEST_BYTES = 64 * 1024

RECORDS: dict[str, dict[str, Any]] = {
    "A-1042": {
        "id": "A-1042",
        "title": "Common swift (Apus apus)",
        "status": "confirmed",
        "seen": "2024-05-14",
        "place": "Rotterdam harbour",
        "restricted": False,
    },
    "A-1043": {
        "id": "A-1043",
        "title": "Peregrine falcon (Falco peregrinus)",
        "status": "pending review",
        "seen": "2024-05-15",
        "place": "Utrecht, Dom tower",
        "restricted": False,
    },
    "B-0007": {
        "id": "B-0007",
        "title": "Nest site of a white-tailed eagle",
        "status": "confirmed",
        "seen": "2024-04-02",
        "place": "withheld to protect the nest",
        "restricted": True,
    },
}


class Handler(BaseHTTPRequestHandler):
    server_version = "records-service/1"
    # Headers and body are separate writes: without this, each answer waits
    # for the client's delayed ACK.
    disable_nagle_algorithm = True

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        if self.path != LOOKUP_PATH:
            self._send(404, {"error": f"no tool at {self.path}; try {LOOKUP_PATH}"})
            return
        token = self.headers.get("X-Internal-Token", "")
        if not hmac.compare_digest(token.encode(), self.server.token.encode()):  # type: ignore[attr-defined]
            self._send(401, {"error": "missing or wrong X-Internal-Token"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BYTES:
            self._send(413, {"error": "the request body is too large"})
            return
        try:
            arguments = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict) or not isinstance(arguments.get("id"), str):
            self._send(
                400, {"error": 'send a JSON object with a string "id", like {"id": "A-1042"}'}
            )
            return
        owner = self.headers.get("X-Vessel-Owner", "")
        record = RECORDS.get(arguments["id"].strip().upper())
        if record is None:
            self._send(
                404,
                {
                    "error": f"no record with id {arguments['id']!r}",
                    "hint": "ids are a letter, a hyphen and four digits, like A-1042",
                },
            )
            return
        if record["restricted"] and not owner.startswith("staff/"):
            self._send(
                403,
                {"error": f"record {record['id']} is restricted to staff; {owner} may not see it"},
            )
            return
        self._send(200, {"record": record, "shown_to": owner})

    def do_GET(self) -> None:
        self._send(405, {"error": f"use POST {LOOKUP_PATH}"})

    def log_message(self, format: str, *args: Any) -> None:
        # One line per request on stderr, without headers (the token stays out).
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    token = os.environ.get("RECORDS_TOKEN", "")
    if not token:
        print("records service: set RECORDS_TOKEN to the token callers must send", file=sys.stderr)
        return 2
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.token = token  # type: ignore[attr-defined]
    host, port = server.server_address[:2]
    print(f"records service listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
