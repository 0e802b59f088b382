"""`[platform]`: where the worker forwards the host namespaces that belong to the platform.

    [platform]
    url = "env:PLATFORM_URL"                      # or a literal http(s) URL
    headers = { Authorization = "env:PLATFORM_TOKEN" }

`host.session.*`, `host.agents.*`, `host.llm`, ... are posted to
`<url>/host/<chain>`. `url` and `headers` follow the rules of service grants
(`grants.py`): an http(s) URL without credentials, query or fragment, or
`env:NAME`; valid header names and values, none starting with X-Vessel-.
Values stay as written: only plugin workers resolve `env:` values.
"""

from __future__ import annotations

from broker.loading.fields import Table
from broker.loading.grants import ENV_PREFIX, env_problem, read_headers, url_problem
from broker.model import Platform

__all__ = ["PLATFORM_KEYS", "read_platform"]

PLATFORM_KEYS = frozenset({"url", "headers"})


def read_platform(top: Table) -> Platform | None:
    """`[platform]` of the deployment's top table; None when absent or with problems."""
    table = top.table("platform", keys=PLATFORM_KEYS)
    if table is None:
        return None
    found = len(table.problems)
    url = table.string("url", required=True)
    if url is not None:
        problem = env_problem(url) if url.startswith(ENV_PREFIX) else url_problem(url)
        if problem is not None:
            table.problem("url", problem)
    headers = read_headers(table)
    if len(table.problems) > found or url is None or headers is None:
        return None
    return Platform(url=url, headers=headers)
