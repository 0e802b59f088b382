"""Seed 001's service tool rules: `service` and `path`."""

from __future__ import annotations

import pytest

from broker.model import ServiceTool

from .conftest import LOOKUP, Tree

TOOL = "records/tools/lookup.toml"


def test_the_valid_service_tool_loads(tree: Tree) -> None:
    lookup = tree.load().agent("records").tool("lookup")
    assert isinstance(lookup, ServiceTool)
    assert (lookup.service, lookup.path, lookup.scope) == (
        "records",
        "/agent-tools/lookup",
        "tools:read",
    )
    assert lookup.timeout_seconds == 30.0


def test_input_is_accepted_and_has_no_effect_on_a_service_tool(tree: Tree) -> None:
    tree.write(
        {
            TOOL: LOOKUP.replace(
                'path = "/agent-tools/lookup"\n', 'path = "/agent-tools/lookup"\ninput = "args"\n'
            )
        }
    )
    assert isinstance(tree.load().agent("records").tool("lookup"), ServiceTool)


def with_path(path: str) -> dict[str, str]:
    return {TOOL: LOOKUP.replace('path = "/agent-tools/lookup"', f"path = {path}")}


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ('"agent-tools/lookup"', 'must start with "/"'),
        ('"/agent-tools/../admin"', '".." segment'),
        ('"/.."', '".." segment'),
        ('"/agent-tools/%2e%2e/admin"', '".." segment'),
        ('"/agent-tools/%2E%2e/admin"', '".." segment'),
        ('"/agent-tools/./lookup"', '"." segment'),
        ('"/lookup?admin=1"', "query or fragment"),
        ('"/lookup#top"', "query or fragment"),
        ('"/look up"', "printable ASCII"),
        ('"/lookup\\r\\nX-Evil: 1"', "printable ASCII"),
        ('"/a\\\\..\\\\b"', "backslash"),
        ("1", "must be a string, not an integer"),
        ('""', "must not be empty"),
    ],
)
def test_an_invalid_path_is_refused(tree: Tree, path: str, fragment: str) -> None:
    tree.expect(with_path(path), TOOL, "path", fragment)


def test_a_path_is_required(tree: Tree) -> None:
    tree.expect(
        {TOOL: LOOKUP.replace('path = "/agent-tools/lookup"\n', "")}, TOOL, "path", "missing"
    )


@pytest.mark.parametrize(
    ("service", "fragment"),
    [
        ("Records", "lowercase letters, digits and hyphens"),
        ("1records", "starting with a letter"),
        ("records_db", "hyphens"),
        ("-records", "starting with a letter"),
        ("", "must not be empty"),
    ],
)
def test_an_invalid_service_name_is_refused(tree: Tree, service: str, fragment: str) -> None:
    body = LOOKUP.replace('service = "records"', f'service = "{service}"')
    tree.expect({TOOL: body}, TOOL, "service", fragment)
