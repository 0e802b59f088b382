"""How sources run: scripts each like a CommonJS file (in a fresh context per call), and
ES modules, whose calls each get a fresh isolate with Node's globals under Node's
permission model, and still a fresh state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .runtime_support import Calls, published, running

MODULE = """\
globalThis.loads = (globalThis.loads ?? 0) + 1;
const t = globalThis.tools;
t.leave = {
  description: "Leaves state behind.",
  handler: () => { globalThis.leak = "left"; Object.prototype.polluted = "yes"; return 1; },
};
t.look = {
  description: "Looks for state left behind.",
  handler: () => ({
    leak: globalThis.leak ?? null, polluted: ({}).polluted ?? null, loads: globalThis.loads,
  }),
};
t.spawn = {
  description: "Tries a child process.",
  handler: () => {
    try { process.getBuiltinModule("child_process").spawnSync("id"); return "ran"; }
    catch (e) { return String(e.code); }
  },
};
export {};
"""


@pytest.fixture(scope="module")
def call(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calls]:
    deployment = published(tmp_path_factory.mktemp("modules"), "mods", {"src/mods.mjs": MODULE})
    with running(deployment) as calls:
        yield calls


def test_a_module_plugin_call_sees_nothing_the_last_one_left(call: Calls) -> None:
    assert call("mods__leave").output == "1"
    seen = json.loads(call("mods__look").output)
    assert seen == {"leak": None, "polluted": None, "loads": 1}


def test_a_module_plugin_runs_under_the_permission_model(call: Calls) -> None:
    assert call("mods__spawn").output == '"ERR_ACCESS_DENIED"'


def test_two_scripts_may_declare_the_same_top_level_names(tmp_path: Path) -> None:
    one = 'const t = globalThis.tools;\nt.one = { description: "One.", handler: () => 1 };\n'
    two = 'const t = globalThis.tools;\nt.two = { description: "Two.", handler: () => 2 };\n'
    deployment = published(tmp_path, "pair", {"src/one.ts": one, "src/two.js": two})
    with running(deployment) as calls:
        assert calls("pair__one").output == "1"
        assert calls("pair__two").output == "2"
