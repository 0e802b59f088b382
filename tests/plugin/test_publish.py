"""The publish check, with the real confined runtime: seed 002's table, issue 16's rules.

Each case registers one source and expects exactly one `FILE: FIELD: problem`
line (or a warning), as `vessel-workers check` prints it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.loading.fields import Problems
from broker.loading.plugin import read_plugin_file
from workers.commands.check import publish_plugins
from workers.plugin.publish import Published, publish
from workers.plugin.registration import register_sources

from .runtime_support import FIXTURES, write_deployment, write_plugin

SRC = "src/p.ts"
OK = 'globalThis.tools.ok = { description: "Fine.", handler: () => 1 };\n'


def check(tmp_path: Path, source: str, toml_extra: str = "", slug: str = "demo") -> Published:
    folder = write_plugin(tmp_path, slug, {SRC: source}, toml_extra)
    problems = Problems()
    plugin = read_plugin_file(folder, shown=slug, problems=problems)
    assert plugin is not None, problems.as_list()
    return publish(plugin, register_sources(folder, plugin.sources))


def one_problem(tmp_path: Path, source: str, toml_extra: str = "") -> str:
    published = check(tmp_path, source, toml_extra)
    lines = [str(p) for p in published.problems]
    assert len(lines) == 1, lines
    assert published.lock is None
    return lines[0]


def tool(body: str, key: str = "t") -> str:
    return f"globalThis.tools.{key} = {body};\n"


def test_the_seed_get_forecast_registers_as_the_seed_says(tmp_path: Path) -> None:
    folder = FIXTURES / "weather"
    problems = Problems()
    plugin = read_plugin_file(folder, shown="weather", problems=problems)
    assert plugin is not None
    published = publish(plugin, register_sources(folder, plugin.sources))
    assert published.problems == () and published.lock is not None
    lock = published.lock
    assert lock.egress == ("api.open-meteo.com",)
    assert lock.permissions == ("host:fetch",)
    (forecast,) = lock.tools
    assert forecast.name == "weather__get_forecast" and forecast.source == "src/weather.ts"
    assert forecast.parameters["required"] == ["latitude", "longitude"]
    assert forecast.description.startswith("Get tomorrow's temperature range")
    assert (forecast.always_listed, forecast.deferred) == (False, False)
    assert (lock.timeout_seconds, lock.memory_limit_mb) == (30.0, 128)


def test_the_seed_save_note_derives_workspace_write(tmp_path: Path) -> None:
    folder = FIXTURES / "notes"
    problems = Problems()
    plugin = read_plugin_file(folder, shown="notes", problems=problems)
    assert plugin is not None
    published = publish(plugin, register_sources(folder, plugin.sources))
    assert published.lock is not None
    assert published.lock.permissions == ("host:workspace:write",)
    assert [t.name for t in published.lock.tools] == ["notes__save_note"]
    assert published.lock.egress == ()


def test_parameters_default_to_no_arguments_and_flags_are_kept(tmp_path: Path) -> None:
    source = OK + tool('{ description: "D.", handler: () => 1, deferred: true }', "later")
    source += tool('{ description: "A.", handler: async () => 1, alwaysListed: true }', "pinned")
    published = check(tmp_path, source)
    assert published.lock is not None
    ok, later, pinned = published.lock.tools
    assert ok.parameters == {"type": "object", "properties": {}}
    assert (later.deferred, later.always_listed) == (True, False)
    assert (pinned.deferred, pinned.always_listed) == (False, True)


# Registry-level cases: all registered by ONE source (one confined run), each
# under its own key, and each must give exactly its own problem line.
TOOL_CASES: list[tuple[str, str, str]] = [
    ("Bad", '{ description: "x", handler: () => 1 }', "lowercase"),
    ("_x", '{ description: "x", handler: () => 1 }', "starting with a"),
    ("a" * 65, '{ description: "x", handler: () => 1 }', "up to 64"),
    ("bare", "async () => 1", "a bare function"),
    ("text", '"text"', "must be an object"),
    ("no_description", "{ handler: () => 1 }", "description: missing"),
    ("blank", '{ description: "  ", handler: () => 1 }', "description: must not be empty"),
    ("number", "{ description: 3, handler: () => 1 }", "description: must be a string"),
    ("no_handler", '{ description: "x" }', "handler: missing"),
    ("string_handler", '{ description: "x", handler: "run" }', "handler: must be a function"),
    (
        "date",
        '{ description: "x", handler: () => 1, parameters: { type: "object", '
        "properties: { d: { default: new Date(0) } } } }",
        "parameters.properties.d.default: is a Date object, not plain JSON",
    ),
    (
        "fn_param",
        '{ description: "x", handler: () => 1, parameters: { type: "object", '
        "properties: { f: () => 1 } } }",
        "parameters.properties.f: is a function, not JSON",
    ),
    (
        "nan",
        '{ description: "x", handler: () => 1, '
        'parameters: { type: "object", minProperties: NaN } }',
        "parameters.minProperties: NaN is not a JSON number",
    ),
    (
        "bad_schema",
        '{ description: "x", handler: () => 1, parameters: { type: "object", '
        'properties: { n: { type: "nombre" } } } }',
        "parameters.properties.n.type: not a valid JSON Schema",
    ),
    (
        "array",
        '{ description: "x", handler: () => 1, parameters: { type: "array" } }',
        'parameters.type: must be "object"',
    ),
    (
        "string_params",
        '{ description: "x", handler: () => 1, parameters: "none" }',
        "parameters: must be a JSON Schema object",
    ),
    (
        "both",
        '{ description: "x", handler: () => 1, deferred: true, alwaysListed: true }',
        "both deferred and alwaysListed",
    ),
    (
        "yes",
        '{ description: "x", handler: () => 1, deferred: "yes" }',
        "deferred: must be true or false",
    ),
    (
        "getter",
        '{ get description() { throw new Error("boom") }, handler: () => 1 }',
        "description: reading it threw: boom",
    ),
    *(
        (f"pin{i}", '{ description: "x", handler: () => 1, alwaysListed: true }', "")
        for i in range(3)
    ),
    (
        "pin3",
        '{ description: "x", handler: () => 1, alwaysListed: true }',
        "alwaysListed: a plugin may have at most 3 alwaysListed tools",
    ),
]


@pytest.fixture(scope="module")
def tool_problems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    source = "".join(f"globalThis.tools[{key!r}] = {body};\n" for key, body, _ in TOOL_CASES)
    published = check(tmp_path_factory.mktemp("rules"), source)
    assert published.lock is None
    found: dict[str, list[str]] = {}
    for problem in published.problems:
        assert problem.file == f"demo/{SRC}"
        key = problem.field.removeprefix("tools.").split(".")[0]
        found.setdefault(key, []).append(f"{problem.field}: {problem.message}")
    return found


@pytest.mark.parametrize(
    ("key", "body", "fragment"), TOOL_CASES, ids=[c[0][:12] for c in TOOL_CASES]
)
def test_each_broken_tool_rule_is_one_problem(
    tool_problems: dict[str, list[str]], key: str, body: str, fragment: str
) -> None:
    if not fragment:  # the first three alwaysListed tools are fine
        assert key not in tool_problems
        return
    (line,) = tool_problems[key]
    assert line.startswith(f"tools.{key}"), line
    assert fragment in line, line


@pytest.mark.parametrize(
    ("source", "field", "fragment"),
    [
        ('globalThis.manifest = { egress: "x.com" };\n' + OK, "manifest.egress", "a list"),
        (
            'globalThis.manifest = { egress: ["https://x.com", "x.com/path", 42, "x.com:70000", '
            '"api.x.com:443", "127.0.0.1", "[::1]:8"] };\n' + OK,
            "manifest.egress[0]",
            "nothing else",
        ),
        ("globalThis.manifest = { egres: [] };\n" + OK, "manifest.egres", "did you mean 'egress'"),
        ("globalThis.manifest = 3;\n" + OK, "manifest", "must be an object"),
        ("globalThis.tools = 3;\n", "tools", "must stay an object"),
        ('throw new Error("no registry today");\n', "line 1", "no registry today"),
        ("const x: number = ;\n", "line 1", ""),
        ("enum Color { Red }\n" + OK, "line 1", "TypeScript enum is not supported"),
        (
            'await host.fetch({ url: "https://x.com" });\n',
            "line 1",
            "the host API is not available while registering",
        ),
        ('host.settings.get("x");\n', "line 1", "not available while registering"),
    ],
)
def test_each_broken_source_rule_is_a_problem(
    tmp_path: Path, source: str, field: str, fragment: str
) -> None:
    published = check(tmp_path, source)
    lines = [str(p) for p in published.problems]
    assert published.lock is None and lines
    line = lines[0]
    assert line.startswith(f"demo/{SRC}: {field}: "), line
    assert fragment in line, line
    assert "/plugin/" not in line and str(tmp_path) not in line
    if "egress" in line and "[0]" in field:
        # One problem per bad entry; the good ones ("api.x.com:443", IPs) pass.
        assert [p.field for p in published.problems] == [
            "manifest.egress[0]",
            "manifest.egress[1]",
            "manifest.egress[2]",
            "manifest.egress[3]",
        ]
    else:
        assert len(lines) == 1, lines


def test_the_error_of_a_later_source_names_its_file_and_line(tmp_path: Path) -> None:
    folder = write_plugin(tmp_path, "demo", {"a.ts": OK, "b/c.ts": "\n\nenum E { A }\n"})
    problems = Problems()
    plugin = read_plugin_file(folder, shown="demo", problems=problems)
    assert plugin is not None
    (problem,) = publish(plugin, register_sources(folder, plugin.sources)).problems
    assert str(problem).startswith("demo/b/c.ts: line 3: TypeScript enum is not supported")


def test_sources_run_in_order_and_each_key_names_its_source(tmp_path: Path) -> None:
    first = "globalThis.shared = 41;\n" + OK
    second = tool('{ description: "y", handler: () => (globalThis as any).shared + 1 }', "two")
    folder = write_plugin(tmp_path, "demo", {"a.ts": first, "b.js": second.replace(" as any", "")})
    problems = Problems()
    plugin = read_plugin_file(folder, shown="demo", problems=problems)
    assert plugin is not None
    lock = publish(plugin, register_sources(folder, plugin.sources)).lock
    assert lock is not None
    assert [(t.key, t.source) for t in lock.tools] == [("ok", "a.ts"), ("two", "b.js")]


def test_a_builtin_final_name_is_dropped_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No built-in name holds "__" today, so no final name can equal one; the
    # rule is proved with a built-in list that holds the final name.
    import workers.plugin.publish as module

    monkeypatch.setattr(module, "BUILTIN_TOOLS", module.BUILTIN_TOOLS | {"demo__ok"})
    published = check(tmp_path, OK)
    assert published.problems == ()
    assert published.lock is not None and published.lock.tools == ()
    assert published.lock.dropped[0][0] == "demo__ok"
    (warning,) = published.warnings
    assert warning.startswith(f"demo/{SRC}: tools.ok: warning: dropped: its final name")


def test_a_top_level_endless_loop_fails_within_the_time_limit(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "while (true) {}\n")
    assert line == "demo/plugin.toml: sources: the sources did not finish registering within 10 s"


def test_top_level_memory_is_limited(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "const a = []; while (true) a.push(new Array(1e5).fill(1));\n")
    assert line.startswith("demo/plugin.toml: sources: registering ran out of memory")


def test_registration_has_no_network(tmp_path: Path) -> None:
    source = (
        "let why = 'none';\n"
        "try { await fetch('http://127.0.0.1:9/'); why = 'reached'; }"
        " catch (e) { why = String(e.cause?.code ?? e.message); }\n"
        "globalThis.tools.t = { description: 'network: ' + why, handler: () => 1 };\n"
    )
    published = check(tmp_path, source)
    assert published.lock is not None
    description = published.lock.tools[0].description
    assert description not in {"network: reached", "network: none"}, description


def test_media_transcode_raises_the_floors_and_a_lower_plugin_toml_fails(tmp_path: Path) -> None:
    source = tool('{ description: "x", handler: async () => host.media.transcode({ id: "a" }) }')
    lock = check(tmp_path, source).lock
    assert lock is not None
    assert lock.permissions == ("host:media:transcode",)
    assert (lock.timeout_seconds, lock.memory_limit_mb) == (60.0, 512)
    line = one_problem(tmp_path / "again", source, "timeout_seconds = 45\n")
    assert line.startswith("demo/plugin.toml: timeout_seconds: 45 is below this plugin's floor")


def test_plugins_write_raises_the_time_floor(tmp_path: Path) -> None:
    source = tool('{ description: "x", handler: async () => host.plugins.release({}) }')
    lock = check(tmp_path, source, "timeout_seconds = 150\n").lock
    assert lock is not None
    assert lock.permissions == ("agentApi:plugins.write", "host:plugins:release")
    assert (lock.timeout_seconds, lock.memory_limit_mb) == (150.0, 128)


def test_check_writes_the_lock_into_the_folder_or_the_lock_dir(tmp_path: Path) -> None:
    folder = write_plugin(tmp_path, "demo", {SRC: OK})
    path = write_deployment(tmp_path, ["demo"])
    assert publish_plugins(path, None)[0] == []
    data = json.loads((folder / "plugin.lock.json").read_text())
    assert data["tools"][0]["name"] == "demo__ok"
    locks = tmp_path / "locks"
    assert publish_plugins(path, locks)[0] == []
    assert json.loads((locks / "demo.lock.json").read_text()) == data
