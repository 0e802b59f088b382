"""A minimal keep-alive HTTP/1.1 server for service calls: `python -m bench.httpd PORT`.

Every POST is answered 200 with a small JSON body. It is asyncio on raw
sockets rather than `http.server` because it shares two cores with the workers
under test: the less CPU it takes per request, the more of the service burst
figure is the workers'. It counts requests and answers `GET /count` with the
total, so a mode can check every call reached it.
"""

from __future__ import annotations

import asyncio
import json
import sys

__all__ = ["RESPONSE_BODY", "main"]

RESPONSE_BODY = json.dumps({"ok": True}).encode()
_OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(RESPONSE_BODY)).encode()
    + b"\r\n\r\n"
    + RESPONSE_BODY
)
_BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_MAX_HEAD = 64 * 1024


class _Counter:
    requests = 0


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except asyncio.LimitOverrunError:
                writer.write(_BAD)
                return
            if len(head) > _MAX_HEAD:
                writer.write(_BAD)
                return
            lines = head.decode("latin-1").split("\r\n")
            method = lines[0].split(" ", 1)[0]
            length = 0
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip() or 0)
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
            if length:
                await reader.readexactly(length)
            if method == "GET" and lines[0].split(" ")[1] == "/count":
                body = str(_Counter.requests).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
            else:
                _Counter.requests += 1
                writer.write(_OK)
            await writer.drain()
            if close:
                return
    finally:
        writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=1024)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    asyncio.run(_main(int(sys.argv[1])))


if __name__ == "__main__":
    main()
