"""`[[plugins]]`, `plugin.toml`, `[platform]` and `plugin.lock.json`: every loading rule.

No JavaScript runs here: the locks are written as `check` writes them
(`write_lock`), so these tests prove what every loader does with them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.loading.lock import LOCK_FILE, Lock, LockedTool, sources_sha256, write_lock
from broker.model import PluginTool

from .conftest import DEPLOYMENT, Tree

FILE = "deployment.toml"
PLUGIN = "plugins/weather"
TOML = f"{PLUGIN}/plugin.toml"
LOCK = f"{PLUGIN}/{LOCK_FILE}"
COMMAND = "vessel-workers check -d deployment.toml"
SOURCE = "globalThis.tools.get_forecast = { description: 'x', handler: () => 1 };\n"
ENTRY = f'[[plugins]]\npackage = "{PLUGIN}"\n'


def _tool(key: str = "get_forecast", **changes: object) -> LockedTool:
    fields: dict[str, object] = {
        "key": key,
        "name": f"weather__{key}",
        "description": "Get the forecast.",
        "parameters": {"type": "object", "properties": {}},
        "always_listed": False,
        "deferred": False,
        "source": "src/weather.ts",
    }
    fields.update(changes)
    return LockedTool(**fields)  # type: ignore[arg-type]


def lock(tree: Tree, **changes: object) -> None:
    """Write the lock `check` would write for the plugin as it is now, with `changes`."""
    folder = tree.root / PLUGIN
    fields: dict[str, object] = {
        "slug": "weather",
        "sources": tuple(sources_sha256(folder, ["src/weather.ts"]).items()),
        "egress": ("api.open-meteo.com",),
        "permissions": ("host:fetch",),
        "timeout_seconds": 30.0,
        "memory_limit_mb": 128,
        "tools": (_tool(),),
    }
    fields.update(changes)
    write_lock(folder / LOCK_FILE, Lock(**fields))  # type: ignore[arg-type]


@pytest.fixture
def plugin_tree(tree: Tree) -> Tree:
    tree.write(
        {
            FILE: ENTRY + DEPLOYMENT,
            TOML: 'slug = "weather"\nsources = ["src/weather.ts"]\n',
            f"{PLUGIN}/src/weather.ts": SOURCE,
        }
    )
    lock(tree)
    return tree


def test_a_locked_plugin_gives_every_agent_its_tools_after_the_package_tools(
    plugin_tree: Tree,
) -> None:
    deployment = plugin_tree.load()
    plugin = deployment.plugins["weather"]
    assert plugin.package_dir == (plugin_tree.root / PLUGIN).resolve()
    assert plugin.egress == ("api.open-meteo.com",)
    assert plugin.permissions == ("host:fetch",)
    assert (plugin.timeout_seconds, plugin.memory_limit_mb) == (30.0, 128)
    assert plugin.private_egress == () and plugin.settings == {}
    for agent in deployment.agents.values():
        names = list(agent.tools)
        assert names[-1] == "weather__get_forecast"
        tool = agent.tools["weather__get_forecast"]
        assert isinstance(tool, PluginTool)
        assert (tool.plugin, tool.key, tool.kind) == ("weather", "get_forecast", "plugin")
        assert tool.permissions == ("host:fetch",) and tool.memory_limit_mb == 128
        assert tool.listing()["name"] == "weather__get_forecast"
    assert deployment.platform is None


def test_settings_and_private_egress_are_read_as_written(plugin_tree: Tree) -> None:
    plugin_tree.write(
        {
            FILE: ENTRY
            + 'private_egress = ["127.0.0.1:8123", "[::1]:80"]\n'
            + '[plugins.settings]\nunits = "metric"\napi_key = "env:WEATHER_KEY"\n'
            + "days = 2\nratio = 0.5\nverbose = true\n"
            + DEPLOYMENT
        }
    )
    plugin = plugin_tree.load().plugins["weather"]
    assert plugin.private_egress == ("127.0.0.1:8123", "[::1]:80")
    assert plugin.settings == {
        "units": "metric",
        "api_key": "env:WEATHER_KEY",
        "days": 2,
        "ratio": 0.5,
        "verbose": True,
    }
    assert "WEATHER_KEY" not in repr(plugin)


def test_the_platform_is_read_as_written(plugin_tree: Tree) -> None:
    plugin_tree.write(
        {
            FILE: '[platform]\nurl = "env:PLATFORM_URL"\n'
            'headers = { Authorization = "env:PLATFORM_TOKEN" }\n' + DEPLOYMENT
        }
    )
    platform = plugin_tree.load().platform
    assert platform is not None
    assert platform.url == "env:PLATFORM_URL"
    assert platform.headers == {"Authorization": "env:PLATFORM_TOKEN"}


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ('[[plugin]]\npackage = "x"\n', "plugin", "did you mean 'plugins'"),
        ('plugins = "weather"\n', "plugins", "must be a list of tables"),
        ("[[plugins]]\n", "plugins[0].package", "missing"),
        ('[[plugins]]\npackage = "nowhere"\n', "plugins[0].package", "does not exist"),
        ('[[plugins]]\npackage = "data"\n', "plugins[0].package", "has no plugin.toml"),
        ('[[plugins]]\npackage = "/"\n', "plugins[0].package", "host's root folder"),
        ('[[plugins]]\npackage = "."\n', "plugins[0].package", "holds the deployment file"),
        (ENTRY + 'pakage = "x"\n', "plugins[0].pakage", "did you mean 'package'"),
        (ENTRY + ENTRY, "plugins[1].package", "already installed by plugins[0]"),
        (ENTRY + "[plugins.settings]\nx = [1]\n", "plugins[0].settings.x", "not a list"),
        (ENTRY + "[plugins.settings.x]\ny = 1\n", "plugins[0].settings.x", "not a table"),
        (ENTRY + "[plugins.settings]\nx = 1979-05-27\n", "plugins[0].settings.x", "date"),
        (ENTRY + '[plugins.settings]\nx = "env:1X"\n', "plugins[0].settings.x", "environment"),
        (ENTRY + 'private_egress = "127.0.0.1:1"\n', "plugins[0].private_egress", "a list"),
        (ENTRY + "private_egress = [1]\n", "plugins[0].private_egress[0]", "must be a string"),
        (
            ENTRY + 'private_egress = ["127.0.0.1"]\n',
            "plugins[0].private_egress[0]",
            "must name a port",
        ),
        (
            ENTRY + 'private_egress = ["localhost:80"]\n',
            "plugins[0].private_egress[0]",
            "is a name",
        ),
        (
            ENTRY + 'private_egress = ["8.8.8.8:53"]\n',
            "plugins[0].private_egress[0]",
            "public address",
        ),
        (
            ENTRY + 'private_egress = ["http://127.0.0.1:80"]\n',
            "plugins[0].private_egress[0]",
            "nothing else",
        ),
        (
            ENTRY + 'private_egress = ["127.0.0.1:99999"]\n',
            "plugins[0].private_egress[0]",
            "not a port",
        ),
        ("[platform]\nheaders = {}\n", "platform.url", "missing"),
        ('[platform]\nurl = "ftp://x"\n', "platform.url", "http:// or https://"),
        ('[platform]\nurl = "http://u:p@x"\n', "platform.url", "credentials"),
        ('[platform]\nurl = "env:A B"\n', "platform.url", "environment variable"),
        (
            '[platform]\nurl = "http://x"\nheaders = { "X-Vessel-A" = "1" }\n',
            "platform.headers",
            "X-Vessel-",
        ),
        ('[platform]\nurl = "http://x"\nheaders = { A = 1 }\n', "platform.headers.A", "string"),
        ('[platform]\nurl = "http://x"\nurls = 1\n', "platform.urls", "did you mean 'url'"),
    ],
)
def test_each_deployment_mistake_is_one_problem(
    plugin_tree: Tree, text: str, field: str, fragment: str
) -> None:
    line = plugin_tree.only_problem({FILE: text + DEPLOYMENT})
    assert line.startswith(f"{FILE}: {field}"), line
    assert fragment in line, line


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ('sources = ["src/weather.ts"]\n', "slug", "missing"),
        ('slug = "Weather"\nsources = ["src/weather.ts"]\n', "slug", "lowercase"),
        ('slug = "w_x"\nsources = ["src/weather.ts"]\n', "slug", "hyphens"),
        (f'slug = "{"w" * 33}"\nsources = ["src/weather.ts"]\n', "slug", "up to 32"),
        ('slug = "weather"\n', "sources", "missing"),
        ('slug = "weather"\nsources = []\n', "sources", "at least one"),
        ('slug = "weather"\nsources = "src/weather.ts"\n', "sources", "list of strings"),
        ('slug = "weather"\nsources = ["/etc/passwd.js"]\n', "sources[0]", "relative"),
        ('slug = "weather"\nsources = ["../x.ts"]\n', "sources[0]", "outside the plugin folder"),
        ('slug = "weather"\nsources = ["src/nowhere.ts"]\n', "sources[0]", "does not exist"),
        ('slug = "weather"\nsources = ["src"]\n', "sources[0]", "TypeScript or JavaScript"),
        ('slug = "weather"\nsources = ["src/weather.py"]\n', "sources[0]", ".ts, .js, .mjs"),
        (
            'slug = "weather"\nsources = ["src/weather.ts", "./src/weather.ts"]\n',
            "sources[1]",
            "listed twice",
        ),
        (
            'slug = "weather"\nsources = ["src/weather.ts"]\ntimeout_seconds = 10\n',
            "timeout_seconds",
            "below this plugin's floor of 30 s",
        ),
        (
            'slug = "weather"\nsources = ["src/weather.ts"]\nmemory_limit_mb = 64\n',
            "memory_limit_mb",
            "below this plugin's floor of 128 MB",
        ),
        (
            'slug = "weather"\nsources = ["src/weather.ts"]\ntimeout_seconds = 0\n',
            "timeout_seconds",
            "positive",
        ),
        ('slug = "weather"\nsources = ["src/weather.ts"]\nsource = 1\n', "source", "did you mean"),
    ],
)
def test_each_plugin_toml_mistake_is_one_problem(
    plugin_tree: Tree, text: str, field: str, fragment: str
) -> None:
    plugin_tree.expect({TOML: text}, TOML, field, fragment)


def test_a_source_linked_out_of_the_folder_is_refused(plugin_tree: Tree) -> None:
    (plugin_tree.root / "outside.ts").write_text(SOURCE)
    (plugin_tree.root / PLUGIN / "src" / "link.ts").symlink_to(plugin_tree.root / "outside.ts")
    plugin_tree.expect(
        {TOML: 'slug = "weather"\nsources = ["src/link.ts"]\n'},
        TOML,
        "sources[0]",
        "outside the plugin folder",
    )


def test_a_missing_lock_names_the_command_to_run(plugin_tree: Tree) -> None:
    plugin_tree.expect(
        {LOCK: None}, LOCK, "(file)", f"no lock: the plugin was not checked; run {COMMAND}"
    )


def test_a_source_changed_after_the_lock_makes_it_stale(plugin_tree: Tree) -> None:
    line = plugin_tree.only_problem({f"{PLUGIN}/src/weather.ts": SOURCE + "// changed\n"})
    stale = "stale: src/weather.ts changed since the lock was written"
    assert line == f"{LOCK}: (file): {stale}; run {COMMAND}"


def test_other_sources_or_limits_than_the_lock_make_it_stale(plugin_tree: Tree) -> None:
    plugin_tree.write({f"{PLUGIN}/src/more.ts": SOURCE})
    line = plugin_tree.only_problem(
        {TOML: 'slug = "weather"\nsources = ["src/weather.ts", "src/more.ts"]\n'}
    )
    assert "stale: plugin.toml lists other sources" in line and COMMAND in line
    plugin_tree.write(
        {TOML: 'slug = "weather"\nsources = ["src/weather.ts"]\ntimeout_seconds = 45\n'}
    )
    line = plugin_tree.only_problem({})
    assert "stale: plugin.toml sets other limits than the lock" in line


def test_a_lock_of_another_plugin_is_stale(plugin_tree: Tree) -> None:
    lock(plugin_tree, slug="other")
    assert "it is the lock of plugin 'other'" in plugin_tree.only_problem({})


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"lock_version": 2}', "lock_version: must be 1"),
        ('{"lock_version": 1}', "sources: missing"),
    ],
)
def test_a_broken_lock_is_one_problem(plugin_tree: Tree, content: str, fragment: str) -> None:
    line = plugin_tree.only_problem({LOCK: content})
    assert line.startswith(f"{LOCK}: ") and fragment in line and COMMAND in line, line


def test_a_hand_edited_name_in_the_lock_is_refused(plugin_tree: Tree) -> None:
    lock(plugin_tree, tools=(_tool(name="web_search"),))
    assert plugin_tree.only_problem({}).startswith(f"{LOCK}: tools[0].name: is not a valid name")


def test_raised_floors_apply_and_plugin_toml_may_raise_them(plugin_tree: Tree) -> None:
    lock(
        plugin_tree,
        permissions=("host:media:transcode",),
        timeout_seconds=60.0,
        memory_limit_mb=512,
    )
    plugin = plugin_tree.load().plugins["weather"]
    assert (plugin.timeout_seconds, plugin.memory_limit_mb) == (60.0, 512)
    plugin_tree.write(
        {TOML: 'slug = "weather"\nsources = ["src/weather.ts"]\ntimeout_seconds = 150\n'}
    )
    lock(plugin_tree, permissions=("agentApi:plugins.write",), timeout_seconds=150.0)
    plugin = plugin_tree.load().plugins["weather"]
    assert (plugin.timeout_seconds, plugin.memory_limit_mb) == (150.0, 128)


def test_a_plugin_toml_limit_below_a_raised_floor_is_refused(plugin_tree: Tree) -> None:
    plugin_tree.write(
        {TOML: 'slug = "weather"\nsources = ["src/weather.ts"]\nmemory_limit_mb = 256\n'}
    )
    lock(
        plugin_tree,
        permissions=("host:media:transcode",),
        timeout_seconds=60.0,
        memory_limit_mb=512,
    )
    line = plugin_tree.only_problem({})
    assert line.startswith(f"{TOML}: memory_limit_mb: 256 is below this plugin's floor of 512 MB")
    assert "host:media:transcode" in line


def test_a_plugin_tool_named_like_a_package_tool_is_refused(plugin_tree: Tree) -> None:
    lock(plugin_tree, tools=(_tool(),))
    tree_tool = plugin_tree.root / "guide" / "tools" / "echo.toml"
    tree_tool.write_text(
        tree_tool.read_text().replace('name = "echo"', 'name = "weather__get_forecast"')
    )
    line = plugin_tree.only_problem({})
    assert line.startswith(f"{FILE}: agents[0].package: its tool 'weather__get_forecast'"), line


def test_the_lock_dir_holds_locks_by_slug(plugin_tree: Tree, tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    (plugin_tree.root / LOCK).rename(locks / "weather.lock.json")
    assert plugin_tree.problems() == [
        f"{LOCK}: (file): no lock: the plugin was not checked; run {COMMAND}"
    ]
    from broker.loading import load_deployment

    assert "weather" in load_deployment(FILE, lock_dir=locks).plugins


def test_the_lock_is_json_as_the_interface_says(plugin_tree: Tree) -> None:
    data = json.loads((plugin_tree.root / LOCK).read_text())
    assert data["lock_version"] == 1 and data["slug"] == "weather"
    assert (
        data["sources"][0]["path"] == "src/weather.ts" and len(data["sources"][0]["sha256"]) == 64
    )
    assert data["timeout_seconds"] == 30 and data["memory_limit_mb"] == 128
    assert data["tools"][0]["alwaysListed"] is False and data["tools"][0]["deferred"] is False
