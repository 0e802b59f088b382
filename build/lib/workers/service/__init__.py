"""Service tools (seed 001): an outbound HTTP POST per call, with the grant's secrets.

    secrets.py   resolves `env:NAME` in the grants when the service worker starts
    redact.py    replaces granted header values in whatever the model is shown
    reading.py   reads a response body without ever holding more than the cap
    exchange.py  one HTTP exchange under a whole-call deadline and a cancel flag
    transport.py the default transport, whose socket reads stop when a call is given up
    texts.py     the texts the model sees, word for word from the seed
    caller.py    `ServiceCaller`: one httpx.Client per worker process, thread-safe

Only service workers import this package: sandbox workers never hold a secret.
"""

from __future__ import annotations

from workers.service.caller import ServiceCaller

__all__ = ["ServiceCaller"]
