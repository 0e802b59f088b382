"""The host namespaces the platform answers, forwarded as one HTTP POST each.

`host.session.*`, `host.agents.*`, `host.cronJobs.*`, `host.models.*`,
`host.plugins.*`, `host.oauth.*`, `host.license`, `host.llm`, `host.session.llm`,
`host.decide` and `host.media.*` act on the platform's state (chats, crews,
schedules, models, sign-ins, media), which a worker does not hold. Each call is

    POST <[platform] url>/host/<chain>      e.g. /host/session.post
    {"args": [...the JS call's arguments...]}

with the `[platform]` headers (`env:` values resolved when the worker started)
and who is asking: `X-Vessel-Owner`, `X-Vessel-Agent`, `X-Vessel-Tool` (the
final name), `X-Vessel-Call`, `X-Vessel-Initiator` (the initiator's kind) and
`X-Vessel-Verified` (`true`/`false`). A 2xx answer's JSON body is what the
promise resolves with (an empty body: null); any other status rejects with
it, and the body is not shown (it is the platform's, not the plugin's). The
answer is capped at `MAX_ANSWER_BYTES`. With no `[platform]` in the
deployment, the call rejects naming what is not available.

No egress check applies: the operator wrote the URL. No redirect is followed.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from workers.plugin.host.context import HostContext, HostFailed
from workers.plugin.host.settings import ResolvedPlatform
from workers.service.reading import BodyTooLarge, ReadStopped, declared_length, read_limited
from workers.service.transport import watching

__all__ = ["MAX_ANSWER_BYTES", "MAX_ARGS_BYTES", "PLATFORM_NAMESPACES", "forward"]

#: The first part of every chain the platform answers.
PLATFORM_NAMESPACES = frozenset(
    {
        "session",
        "agents",
        "cronJobs",
        "models",
        "plugins",
        "oauth",
        "license",
        "llm",
        "decide",
        "media",
    }
)
#: A platform answer can carry a model's reply or a chat's history: larger than
#: a fetch, still bounded (it crosses the runtime's pipe and lands in a result).
MAX_ANSWER_BYTES = 10_000_000
#: Arguments of one forwarded call, as JSON bytes.
MAX_ARGS_BYTES = 4_000_000


def forward(
    client: httpx.Client,
    platform: ResolvedPlatform | None,
    context: HostContext,
    chain: str,
    args: list[Any],
) -> Any:
    """POST the call to the platform and return its JSON answer."""
    name = f"host.{chain}"
    if platform is None:
        raise HostFailed(f"{name} is not available: this deployment has no [platform] to answer it")
    try:
        body = json.dumps({"args": args}, ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError):
        raise HostFailed(f"{name} failed: its arguments are not plain JSON") from None
    if len(body) > MAX_ARGS_BYTES:
        raise HostFailed(f"{name} failed: its arguments are larger than {MAX_ARGS_BYTES:,} bytes")
    left = context.seconds_left()
    if left <= 0:
        raise HostFailed(f"{name} failed: the call's time limit was reached")
    headers = {
        **platform.headers,
        "Content-Type": "application/json",
        "X-Vessel-Owner": context.owner,
        "X-Vessel-Agent": context.agent.id,
        "X-Vessel-Tool": context.tool.name,
        "X-Vessel-Call": context.call_id,
        "X-Vessel-Initiator": context.initiator.kind,
        "X-Vessel-Verified": "true" if context.initiator.is_verified_person else "false",
    }
    request = client.build_request(
        "POST", f"{platform.url}/host/{chain}", headers=headers, content=body
    )
    request.extensions["timeout"] = httpx.Timeout(left).as_dict()
    try:
        with watching(context.cancel.is_set, context.deadline):
            response = client.send(request, stream=True)
            try:
                if not 200 <= response.status_code < 300:
                    raise HostFailed(
                        f"{name} failed: the platform answered HTTP {response.status_code}"
                    )
                declared = declared_length(response.headers)
                if declared is not None and declared > MAX_ANSWER_BYTES:
                    raise BodyTooLarge
                data = read_limited(
                    response.iter_bytes(), limit=MAX_ANSWER_BYTES, stop=context.cancel.is_set
                )
            finally:
                response.close()
    except BodyTooLarge:
        raise HostFailed(
            f"{name} failed: the platform's answer is larger than {MAX_ANSWER_BYTES:,} bytes"
        ) from None
    except ReadStopped:
        raise HostFailed(f"{name} failed: the call was cancelled") from None
    except httpx.TimeoutException:
        raise HostFailed(f"{name} failed: the platform did not answer in time") from None
    except httpx.HTTPError as exc:
        if context.cancel.is_set():
            raise HostFailed(f"{name} failed: the call was cancelled") from None
        raise HostFailed(
            f"{name} failed: the platform could not be reached ({type(exc).__name__})"
        ) from None
    if not data.strip():
        return None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise HostFailed(f"{name} failed: the platform's answer is not JSON") from None
