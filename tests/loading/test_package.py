"""`vessel.toml`: the agent settings (DESIGN.md) and `[tools] declared`."""

from __future__ import annotations

import os

import pytest

from broker.model import AgentSettings

from .conftest import ECHO, GUIDE, Tree

VESSEL = "guide/vessel.toml"


def test_settings_default_as_designed(tree: Tree) -> None:
    assert tree.load().agent("guide").settings == AgentSettings(
        workdir="/data",
        tool_timeout_seconds=30.0,
        tool_output_chars=20000,
        disk_limit_mb=256,
        memory_limit_mb=512,
        workspace_limit_mb=1024,
        workspace_files=100_000,
        cpu_limit=1.0,
        max_argument_bytes=1_000_000,
    )


def test_max_argument_bytes_is_read(tree: Tree) -> None:
    tree.write({VESSEL: "max_argument_bytes = 4096\n" + GUIDE})
    assert tree.load().agent("guide").settings.max_argument_bytes == 4096


def test_settings_are_read(tree: Tree) -> None:
    tree.write(
        {
            VESSEL: 'workdir = "/srv/guide"\ntool_timeout_seconds = 2\ntool_output_chars = 100\n'
            "disk_limit_mb = 8\nmemory_limit_mb = 64\n" + GUIDE
        }
    )
    settings = tree.load().agent("guide").settings
    assert settings.workdir == "/srv/guide"
    assert settings.tool_timeout_seconds == 2.0
    assert isinstance(settings.tool_timeout_seconds, float)
    assert (settings.tool_output_chars, settings.disk_limit_mb, settings.memory_limit_mb) == (
        100,
        8,
        64,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("workspace_limit_mb = 8\nworkspace_files = 500\ncpu_limit = 0.5\n", (8, 500, 0.5)),
        ("cpu_limit = 2\n", (1024, 100_000, 2.0)),
        ("cpu_limit = 0.01\nworkspace_files = 1\nworkspace_limit_mb = 1\n", (1, 1, 0.01)),
    ],
)
def test_workspace_and_cpu_limits_are_read(
    tree: Tree, text: str, expected: tuple[int, int, float]
) -> None:
    tree.write({VESSEL: text + GUIDE})
    settings = tree.load().agent("guide").settings
    assert (settings.workspace_limit_mb, settings.workspace_files, settings.cpu_limit) == expected
    assert isinstance(settings.cpu_limit, float)


@pytest.mark.parametrize(
    ("setting", "field", "fragment"),
    [
        ('workdir = "data"', "workdir", "not an absolute path"),
        ('workdir = "/data/../etc"', "workdir", '".." segment'),
        ('workdir = "/data/"', "workdir", "not normalised (write '/data')"),
        ('workdir = "/data//x"', "workdir", "not normalised"),
        ('workdir = "/proc/self"', "workdir", "inside the system folder /proc"),
        ('workdir = "/usr"', "workdir", "inside the system folder /usr"),
        ("workdir = 1", "workdir", "must be a string, not an integer"),
        ("tool_timeout_seconds = 0", "tool_timeout_seconds", "positive number"),
        ("tool_timeout_seconds = true", "tool_timeout_seconds", "must be a number, not a boolean"),
        ('tool_timeout_seconds = "30"', "tool_timeout_seconds", "not a string"),
        ("tool_output_chars = 0", "tool_output_chars", "positive integer"),
        ("tool_output_chars = 2.5", "tool_output_chars", "must be an integer, not a number"),
        ("tool_output_chars = true", "tool_output_chars", "must be an integer, not a boolean"),
        ("disk_limit_mb = -1", "disk_limit_mb", "positive integer"),
        ("disk_limit_mb = 9223372036854775807", "disk_limit_mb", "at most"),
        ("memory_limit_mb = 0", "memory_limit_mb", "positive integer"),
        ('memory_limit_mb = "512"', "memory_limit_mb", "not a string"),
        ("workspace_limit_mb = 0", "workspace_limit_mb", "positive integer"),
        ("workspace_limit_mb = 1.5", "workspace_limit_mb", "must be an integer, not a number"),
        ("workspace_limit_mb = true", "workspace_limit_mb", "must be an integer, not a boolean"),
        ("workspace_limit_mb = 9223372036854775807", "workspace_limit_mb", "at most 1048576"),
        ('workspace_limit_mb = "1024"', "workspace_limit_mb", "not a string"),
        ("workspace_files = -1", "workspace_files", "positive integer"),
        ("workspace_files = false", "workspace_files", "must be an integer, not a boolean"),
        ("workspace_files = 100000000", "workspace_files", "at most 10000000"),
        ("workspace_files = 1e5", "workspace_files", "must be an integer, not a number"),
        ("cpu_limit = 0", "cpu_limit", "positive number"),
        ("cpu_limit = -0.5", "cpu_limit", "positive number"),
        ("cpu_limit = nan", "cpu_limit", "positive number"),
        ("cpu_limit = inf", "cpu_limit", "positive number"),
        ("cpu_limit = true", "cpu_limit", "must be a number, not a boolean"),
        ('cpu_limit = "1"', "cpu_limit", "not a string"),
        ("cpu_limit = 0.001", "cpu_limit", "at least 0.01 (of a core), not 0.001"),
        ("cpu_limit = 2048", "cpu_limit", "at most 1024"),
        ("cpu_limits = 1", "cpu_limits", "did you mean 'cpu_limit'"),
        ("workspace_limit = 1024", "workspace_limit", "did you mean 'workspace_limit_mb'"),
        ("tool_timeout = 30", "tool_timeout", "did you mean 'tool_timeout_seconds'"),
        ("memory_limit = 512", "memory_limit", "unknown key"),
        ("max_argument_bytes = 0", "max_argument_bytes", "positive integer"),
        ('max_argument_bytes = "1MB"', "max_argument_bytes", "not a string"),
        ("max_argument_bytes = 100000001", "max_argument_bytes", "at most"),
    ],
)
def test_an_invalid_setting_is_refused(tree: Tree, setting: str, field: str, fragment: str) -> None:
    tree.expect({VESSEL: f"{setting}\n{GUIDE}"}, VESSEL, field, fragment)


@pytest.mark.parametrize(
    ("tools", "field", "fragment"),
    [
        ('[tools]\ndeclared = ["tools/none.toml"]\n', "tools.declared[0]", "does not exist"),
        ('[tools]\ndeclared = ["tools"]\n', "tools.declared[0]", "is not a file"),
        ('[tools]\ndeclared = ["../records/tools/lookup.toml"]\n', "tools.declared[0]", "outside"),
        ('[tools]\ndeclared = ["/etc/passwd"]\n', "tools.declared[0]", "relative to the package"),
        (
            '[tools]\ndeclared = ["tools/echo.toml", "./tools/echo.toml"]\n',
            "tools.declared[1]",
            "listed twice (also tools.declared[0])",
        ),
        ('[tools]\ndeclared = "tools/echo.toml"\n', "tools.declared", "not a string"),
        ('[tools]\ndeclared = ["tools/echo.toml", 1]\n', "tools.declared[1]", "an integer"),
        ('[tools]\ndeclard = ["tools/echo.toml"]\n', "tools.declard", "did you mean 'declared'"),
        ('tools = ["tools/echo.toml"]\n', "tools", "must be a table, not a list"),
    ],
)
def test_an_invalid_tool_list_is_refused(tree: Tree, tools: str, field: str, fragment: str) -> None:
    tree.expect({VESSEL: tools}, VESSEL, field, fragment)


def test_a_symlink_out_of_the_package_is_refused(tree: Tree) -> None:
    tree.write({"elsewhere/echo.toml": ECHO})
    os.symlink(tree.root / "elsewhere" / "echo.toml", tree.root / "guide" / "tools" / "link.toml")
    tree.expect(
        {VESSEL: '[tools]\ndeclared = ["tools/link.toml"]\n'},
        VESSEL,
        "tools.declared[0]",
        "outside the package",
    )


def test_a_package_without_tools_is_valid(tree: Tree) -> None:
    tree.write({VESSEL: "", "guide/tools/echo.toml": None})
    assert tree.load().agent("guide").tools == {}


def test_tools_keep_the_order_they_are_declared_in(tree: Tree) -> None:
    tree.write(
        {
            "guide/tools/alpha.toml": ECHO.replace('"echo"', '"alpha"'),
            VESSEL: '[tools]\ndeclared = ["tools/echo.toml", "tools/alpha.toml"]\n',
        }
    )
    guide = tree.load().agent("guide")
    assert [t["name"] for t in guide.catalogue()] == ["echo", "alpha"]


def test_a_bad_agent_timeout_is_reported_once_not_for_every_tool(tree: Tree) -> None:
    tree.expect(
        {VESSEL: "tool_timeout_seconds = -5\n" + GUIDE},
        VESSEL,
        "tool_timeout_seconds",
        "positive number",
    )
