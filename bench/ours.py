"""The one place the bench touches vessel-workers' client API (`broker.client`).

Modes submit and collect through `OursClient`, so a change of the API is one
edit here. `NotAvailable` says a part the modes need is not in the tree (yet):
the modes turn it into a "not measured: …" row instead of a failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.httpd import RESPONSE_BODY
from bench.turns import WrongResult

__all__ = ["OWNER", "NotAvailable", "OursClient", "check_result", "require_parts"]

#: Seed 001's app caller form: <app>/<user>.
OWNER = "bench/load"
_EXPECTED_SERVICE = json.loads(RESPONSE_BODY)


class NotAvailable(Exception):
    """A part of vessel-workers the mode needs is missing from the tree."""


def require_parts() -> None:
    """Raise NotAvailable unless the client, the loader and the worker command import."""
    for module in ("broker.client", "broker.loading", "workers.commands.worker", "workers.tasks"):
        try:
            __import__(module)
        except ImportError as exc:
            raise NotAvailable(f"{module} is not importable ({exc})") from exc


def check_result(result: Any, kind: str) -> None:
    """Raise WrongResult unless `result` is the successful result of the bench tool."""
    if result.is_error:
        raise WrongResult(f"error result ({result.outcome}): {result.output[:300]!r}")
    if kind == "plugin":
        if result.output != "1":
            raise WrongResult(f"the plugin returned {result.output[:300]!r}, not 1")
    elif kind == "sandbox":
        if result.exit_code != 0:
            raise WrongResult(f"exit code {result.exit_code}: {result.output[:300]!r}")
    else:
        try:
            body = json.loads(result.output)
        except ValueError:
            body = None
        if body != _EXPECTED_SERVICE:
            raise WrongResult(f"unexpected service answer {result.output[:300]!r}")


class OursClient:
    """A `broker.client.VesselClient` on one Redis database, with the bench's checks."""

    def __init__(self, deployment: Path, redis_url: str) -> None:
        require_parts()
        from broker.client import VesselClient
        from broker.config import Settings
        from broker.loading import load_deployment

        self.deployment = load_deployment(deployment)
        self.client = VesselClient(
            self.deployment, Settings(broker_url=redis_url, result_backend=redis_url)
        )

    def kind_of(self, agent: str, tool: str) -> str:
        return str(self.deployment.agent(agent).tool(tool).kind)

    def submit(self, agent: str, tool: str, arguments: Any, turn: str | None = None) -> Any:
        return self.client.submit(agent, tool, arguments, owner=OWNER, turn=turn)

    def collect(self, handle: Any, kind: str, timeout: float) -> None:
        check_result(handle.result(timeout=timeout), kind)

    def call(
        self, agent: str, tool: str, arguments: Any, timeout: float = 30, turn: str | None = None
    ) -> None:
        result = self.client.call(agent, tool, arguments, owner=OWNER, timeout=timeout, turn=turn)
        check_result(result, self.kind_of(agent, tool))

    def call_ok(self, agent: str, tool: str, arguments: Any, timeout: float) -> bool:
        self.call(agent, tool, arguments, timeout)
        return True

    def close(self) -> None:
        self.client.close()
