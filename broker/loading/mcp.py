"""`[mcp]`: who may call `vessel-workers mcp --http`, and as which owner.

    [mcp]
    tokens = { "env:MCP_TOKEN_WEB" = "web/alice", "env:MCP_TOKEN_OPS" = "ops|sre-1" }

Each key names, as `env:NAME`, the environment variable that holds one bearer
token; its value is the owner (`app/user` or `issuer|subject`) the calls made
with that token run as. Tokens are never written in the file: the variable is
read only where the MCP server starts (`workers.mcp.tokens`), which refuses to
start naming a variable that is not set.
"""

from __future__ import annotations

from broker.loading.fields import Table, field_path, type_name
from broker.loading.grants import ENV_PREFIX, env_problem
from broker.model import McpSettings
from broker.owner import check_owner

__all__ = ["MCP_KEYS", "read_mcp"]

MCP_KEYS = frozenset({"tokens"})


def read_mcp(top: Table) -> McpSettings | None:
    """`[mcp]` of the deployment's top table; None when absent or with problems."""
    table = top.table("mcp", keys=MCP_KEYS)
    if table is None:
        return None
    found = len(table.problems)
    raw = table.mapping("tokens") if table.has("tokens") else {}
    if raw is None:
        return None
    where = table.field("tokens")
    tokens: list[tuple[str, str]] = []
    for key, owner in raw.items():
        at = field_path(where, key)
        if not key.startswith(ENV_PREFIX):
            table.problems.add(
                table.file,
                at,
                "must be env:NAME: a token is read from the environment, "
                "never written in the deployment file",
            )
            continue
        problem = env_problem(key)
        if problem is not None:
            table.problems.add(table.file, at, problem)
            continue
        if not isinstance(owner, str):
            table.problems.add(
                table.file, at, f"must be a string (an owner), not {type_name(owner)}"
            )
            continue
        try:
            check_owner(owner)
        except ValueError as exc:
            table.problems.add(table.file, at, str(exc))
            continue
        tokens.append((key[len(ENV_PREFIX) :], owner))
    if len(table.problems) > found:
        return None
    return McpSettings(tokens=tuple(tokens))
