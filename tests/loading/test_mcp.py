"""`[mcp] tokens`: env:NAME keys mapped to owners; every other shape refused as
`FILE: FIELD: message`; the tokens resolved only where the MCP server starts."""

from __future__ import annotations

import pytest

from broker.errors import ConfigError, MissingSecret
from broker.model import McpSettings
from workers.mcp.http import resolve_tokens

from .conftest import DEPLOYMENT, Tree

FILE = "deployment.toml"


def test_tokens_are_read_as_names_and_owners(tree: Tree) -> None:
    tree.write(
        {
            FILE: '[mcp]\ntokens = { "env:MCP_TOKEN_WEB" = "web/alice", '
            '"env:MCP_TOKEN_SSO" = "https://id.example|u-1" }\n' + DEPLOYMENT
        }
    )
    assert tree.load().mcp == McpSettings(
        tokens=(("MCP_TOKEN_WEB", "web/alice"), ("MCP_TOKEN_SSO", "https://id.example|u-1"))
    )


def test_no_mcp_table_is_none(tree: Tree) -> None:
    assert tree.load().mcp is None


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ('[mcp]\ntokens = { "s3cret" = "web/alice" }\n', "mcp.tokens.s3cret", "must be env:NAME"),
        (
            '[mcp]\ntokens = { "env:BAD-NAME" = "web/alice" }\n',
            'mcp.tokens."env:BAD-NAME"',
            "not an environment variable name",
        ),
        (
            '[mcp]\ntokens = { "env:T" = 3 }\n',
            'mcp.tokens."env:T"',
            "must be a string (an owner), not an integer",
        ),
        ('[mcp]\ntokens = { "env:T" = "alice" }\n', 'mcp.tokens."env:T"', "owner"),
        ('[mcp]\ntokens = "env:T"\n', "mcp.tokens", "must be a table"),
        ('[mcp]\ntoken = { "env:T" = "web/alice" }\n', "mcp.token", "unknown key"),
        ("mcp = 1\n", "mcp", "must be a table"),
    ],
)
def test_bad_tokens_are_refused(tree: Tree, text: str, field: str, fragment: str) -> None:
    tree.expect({FILE: text + DEPLOYMENT}, FILE, field, fragment)


def test_tokens_resolve_where_the_server_starts() -> None:
    settings = McpSettings(tokens=(("MCP_A", "web/alice"), ("MCP_B", "web/bob")))
    assert resolve_tokens(settings, {"MCP_A": "ta", "MCP_B": "tb"}) == {
        "ta": "web/alice",
        "tb": "web/bob",
    }


def test_a_missing_token_variable_is_named_never_a_value() -> None:
    settings = McpSettings(tokens=(("MCP_A", "web/alice"), ("MCP_B", "web/bob")))
    with pytest.raises(MissingSecret) as caught:
        resolve_tokens(settings, {"MCP_A": "secret-value-a"})
    assert "env:MCP_B is not set" in str(caught.value)
    assert "secret-value-a" not in str(caught.value)


def test_http_without_tokens_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"no \[mcp\] tokens"):
        resolve_tokens(None, {})
    with pytest.raises(ConfigError, match=r"no \[mcp\] tokens"):
        resolve_tokens(McpSettings(), {})
