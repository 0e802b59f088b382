"""Seed 001's grants: `url`, `headers`, and an exact match with the services the tools use."""

from __future__ import annotations

import pytest

from broker.model import Grant

from .conftest import Tree

FILE = "deployment.toml"
RECORDS_AGENT = '[[agents]]\nid = "records"\npackage = "records"\n'
GRANT = "agents[0].services.records"


def grant(body: str, name: str = "records") -> dict[str, str]:
    return {FILE: RECORDS_AGENT + f"[agents.services.{name}]\n{body}\n"}


def test_a_grant_is_kept_as_written(tree: Tree) -> None:
    records = tree.load().agent("records")
    assert records.grants == {
        "records": Grant(
            name="records",
            url="http://127.0.0.1:8000",
            headers={"X-Internal-Token": "env:RECORDS_TOKEN"},
        )
    }


@pytest.mark.parametrize(
    "url",
    [
        "https://records.internal",
        "http://app:8000/api/",
        "http://[::1]:8000",
        "env:RECORDS_URL",
        "env:_private_1",
    ],
)
def test_valid_urls_are_accepted(tree: Tree, url: str) -> None:
    tree.write(grant(f'url = "{url}"'))
    assert tree.load().agent("records").grants["records"].url == url


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://app:8000", "http:// or https://"),
        ("app:8000", "http:// or https://"),
        ("http://", "has no host"),
        ("http:///path", "has no host"),
        ("http://app:8000/?x=1", "query or fragment"),
        ("http://app:8000/?", "query or fragment"),
        ("http://app:8000/#top", "query or fragment"),
        ("http://user:pass@app:8000", "credentials"),
        ("http://app:99999", "not a valid URL"),
        ("http://app:port", "not a valid URL"),
        ("http://app :8000", "spaces or control characters"),
        ("env:", "not an environment variable name"),
        ("env:1TOKEN", "not an environment variable name"),
        ("env:RECORDS-URL", "not an environment variable name"),
    ],
)
def test_an_invalid_url_is_refused(tree: Tree, url: str, fragment: str) -> None:
    tree.expect(grant(f'url = "{url}"'), FILE, f"{GRANT}.url", fragment)


def test_credentials_in_a_url_are_not_repeated_in_the_problem(tree: Tree) -> None:
    line = tree.only_problem(grant('url = "http://user:hunter2@app"'))
    assert "hunter2" not in line


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ("", f"{GRANT}.url", "missing"),
        ("url = 8000", f"{GRANT}.url", "must be a string, not an integer"),
        ('url = "http://app"\nheader = {}', f"{GRANT}.header", "did you mean 'headers'"),
        ('url = "http://app"\nheaders = "X-A: 1"', f"{GRANT}.headers", "must be a table"),
        (
            'url = "http://app"\nheaders = { "X-Vessel-Owner" = "web/alice" }',
            f"{GRANT}.headers.X-Vessel-Owner",
            "X-Vessel- are refused",
        ),
        (
            'url = "http://app"\nheaders = { "x-vessel-tool" = "lookup" }',
            f"{GRANT}.headers.x-vessel-tool",
            "X-Vessel- are refused",
        ),
        (
            'url = "http://app"\nheaders = { "X Token" = "abc" }',
            f'{GRANT}.headers."X Token"',
            "not a valid HTTP header name",
        ),
        (
            'url = "http://app"\nheaders = { "X-Token:" = "abc" }',
            f'{GRANT}.headers."X-Token:"',
            "not a valid HTTP header name",
        ),
        (
            'url = "http://app"\nheaders = { "" = "abc" }',
            f'{GRANT}.headers.""',
            "not a valid HTTP header name",
        ),
        (
            'url = "http://app"\nheaders = { "X-Token" = "abc\\r\\nX-Evil: 1" }',
            f"{GRANT}.headers.X-Token",
            "line break",
        ),
        (
            'url = "http://app"\nheaders = { "X-Token" = " abc" }',
            f"{GRANT}.headers.X-Token",
            "not a valid HTTP header value",
        ),
        (
            'url = "http://app"\nheaders = { "X-Token" = "" }',
            f"{GRANT}.headers.X-Token",
            "not a valid HTTP header value",
        ),
        (
            'url = "http://app"\nheaders = { "X-Token" = 42 }',
            f"{GRANT}.headers.X-Token",
            "must be a string, not an integer",
        ),
        (
            'url = "http://app"\nheaders = { "X-Token" = "env:TOKEN NAME" }',
            f"{GRANT}.headers.X-Token",
            "not an environment variable name",
        ),
        (
            'url = "http://app"\nheaders = { "X-Token" = "a", "x-token" = "b" }',
            f"{GRANT}.headers.x-token",
            "repeats the header 'X-Token'",
        ),
        ('url = "http://app"\n', "agents[0].services.Records", "lowercase letters"),
    ],
)
def test_an_invalid_grant_is_refused(tree: Tree, body: str, field: str, fragment: str) -> None:
    name = "Records" if field.startswith("agents[0].services.Records") else "records"
    files = grant(body, name)
    if name != "records":  # keep the tool's grant so only the bad name is wrong
        files[FILE] += '[agents.services.records]\nurl = "http://app"\n'
    tree.expect(files, FILE, field, fragment)


def test_a_header_value_is_never_repeated_in_a_problem(tree: Tree) -> None:
    line = tree.only_problem(grant('url = "http://app"\nheaders = { "X-Token" = " s3cr3t-value" }'))
    assert "s3cr3t" not in line


def test_a_literal_header_value_is_accepted(tree: Tree) -> None:
    tree.write(grant('url = "http://app"\nheaders = { "Authorization" = "Bearer abc.def" }'))
    headers = tree.load().agent("records").grants["records"].headers
    assert headers == {"Authorization": "Bearer abc.def"}


def test_a_missing_grant_is_refused_naming_the_service_and_tool(tree: Tree) -> None:
    line = tree.only_problem({FILE: RECORDS_AGENT})
    assert line == (
        "deployment.toml: agents[0].services.records: missing grant: tool 'lookup' "
        "(records/tools/lookup.toml) uses service 'records'"
    )


def test_an_unused_grant_is_refused_naming_the_service(tree: Tree) -> None:
    files = grant('url = "http://app"')
    files[FILE] += '[agents.services.billing]\nurl = "http://billing"\n'
    line = tree.only_problem(files)
    assert line == (
        "deployment.toml: agents[0].services.billing: unused grant: "
        "no tool of the package uses service 'billing'"
    )


def test_a_grant_to_an_agent_without_service_tools_is_unused(tree: Tree) -> None:
    text = '[[agents]]\nid = "guide"\npackage = "guide"\n[agents.services.records]\nurl = "http://app"\n'
    tree.expect({FILE: text}, FILE, "agents[0].services.records", "unused grant")


def test_missing_and_unused_grants_are_both_named(tree: Tree) -> None:
    files = {FILE: RECORDS_AGENT + '[agents.services.billing]\nurl = "http://billing"\n'}
    tree.write(files)
    assert tree.problems() == [
        "deployment.toml: agents[0].services.records: missing grant: tool 'lookup' "
        "(records/tools/lookup.toml) uses service 'records'",
        "deployment.toml: agents[0].services.billing: unused grant: "
        "no tool of the package uses service 'billing'",
    ]


def test_the_grant_repr_hides_secrets(tree: Tree) -> None:
    tree.write(grant('url = "http://app"\nheaders = { "X-Token" = "literal-secret-123" }'))
    assert "literal-secret-123" not in repr(tree.load())
