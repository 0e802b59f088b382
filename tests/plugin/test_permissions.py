"""Permissions derived from the sources' text (issue 16): every member chain on `host`."""

from __future__ import annotations

import pytest

from workers.plugin.permissions import derive_permissions


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("await host.workspace.write({})", ["host:workspace:write"]),
        ("await host.workspace!.write({})", ["host:workspace:write"]),
        ("host.fetch({ url })", ["host:fetch"]),
        ("host.session.llm({})", ["host:session:llm"]),
        ("host.media.transcode({})", ["host:media:transcode"]),
        ("host?.settings?.get('x')", ["host:settings:get"]),
        ("host\n  .log\n  .info('x')", ["host:log:info"]),
        ('host["crypto"].randomUUID()', ["host:crypto:randomUUID"]),
        ("globalThis.host.license()", ["host:license"]),
        ("host.plugins.build({})", ["agentApi:plugins.write", "host:plugins:build"]),
        (
            "host.plugins.releaseVersion({})",
            ["agentApi:plugins.write", "host:plugins:releaseVersion"],
        ),
        ("host.plugins.list()", ["host:plugins:list"]),
        ("`${host.settings.get('base')}/x`", ["host:settings:get"]),
        # Nothing: not the host global, comments, strings, a bare or dynamic host.
        ("input.host.fetch()", []),
        ("myhost.fetch(); host_.fetch()", []),
        ("// host.fetch()\n/* host.session.post() */", []),
        ("const s = 'host.fetch()'; const t = \"host.llm()\"", []),
        ("`host.fetch()`", []),
        ("host[name]()", []),
        ("const h = host;", []),
    ],
)
def test_each_chain_gives_its_permission(code: str, expected: list[str]) -> None:
    assert list(derive_permissions([code])) == expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("console.log('x')", ["host:log:info"]),
        ("console.info(1); globalThis.console.warn(2)", ["host:log:info", "host:log:warn"]),
        ("console?.error(e); console.debug(d)", ["host:log:debug", "host:log:error"]),
        ("console.table(x); myconsole.log(1); a.console.log(2)", []),
        ("// console.log(1)\nconst s = 'console.warn(2)'", []),
    ],
)
def test_console_methods_give_their_host_log_level(code: str, expected: list[str]) -> None:
    assert list(derive_permissions([code])) == expected


def test_permissions_of_several_sources_are_merged_and_sorted() -> None:
    found = derive_permissions(["host.fetch({}); host.fetch({})", "host.log.warn('x')"])
    assert found == ("host:fetch", "host:log:warn")
