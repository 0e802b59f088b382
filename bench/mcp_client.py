"""A minimal streamable HTTP MCP client for the bench: one session, one kept-alive
connection, one `tools/call` at a time.

It does what any MCP client must per call (a JSON-RPC POST with the session's
headers, the SSE or JSON answer read back) and nothing else, so the time it
measures is the server's: the SDK's own client adds a few milliseconds of its
own per call (pydantic models both ways, its task groups and streams), which
the P2 MCP row reports beside it.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx

__all__ = ["PROTOCOL_VERSION", "McpError", "MinimalMcpClient"]

#: The handshake era's last version, which the server speaks.
PROTOCOL_VERSION = "2025-11-25"


class McpError(RuntimeError):
    """A JSON-RPC error, an HTTP error, or an answer without the request's response."""


class MinimalMcpClient:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        self._url = url
        self._http = httpx.Client(timeout=timeout)
        self._ids = itertools.count(1)
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "vessel-bench", "version": "0"},
        }
        answer = self._http.post(
            url, headers=self._headers, content=self._request(0, "initialize", params)
        )
        self._answer(answer, 0)
        self._headers["Mcp-Session-Id"] = answer.headers["mcp-session-id"]
        self._headers["MCP-Protocol-Version"] = PROTOCOL_VERSION
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self._check(self._http.post(url, headers=self._headers, content=note))

    @staticmethod
    def _request(request_id: int, method: str, params: dict[str, Any]) -> str:
        return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})

    @staticmethod
    def _check(answer: httpx.Response) -> None:
        if answer.status_code >= 400:
            raise McpError(f"HTTP {answer.status_code}: {answer.text[:200]}")

    def _answer(self, answer: httpx.Response, request_id: int) -> dict[str, Any]:
        self._check(answer)
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            messages = [
                json.loads(line[5:])
                for line in answer.text.splitlines()
                if line.startswith("data:")
            ]
        else:
            messages = [json.loads(answer.text)]
        for message in messages:
            if message.get("id") == request_id:
                if "error" in message:
                    raise McpError(f"JSON-RPC error: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result
        raise McpError(f"no response to request {request_id} in {answer.text[:200]!r}")

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The `tools/call` result: {"content": [...], "isError": bool}."""
        request_id = next(self._ids)
        body = self._request(request_id, "tools/call", {"name": name, "arguments": arguments})
        return self._answer(
            self._http.post(self._url, headers=self._headers, content=body), request_id
        )

    def close(self) -> None:
        """Ends the session (HTTP DELETE: the server ends its turn), then the connection."""
        try:
            self._http.delete(self._url, headers=self._headers)
        finally:
            self._http.close()
