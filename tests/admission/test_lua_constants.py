"""The Lua scripts take every key prefix and number from `broker.admission.keys`.

Checked two ways: no script spells one of them, and a constant changed in
Python changes what the scripts do.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.admission import RedisAdmission, keys
from broker.admission.lua import SCRIPTS, script_text
from broker.constants import REDIS_PREFIX
from broker.queues import LANE_PREFIX, dedicated_lane, home_lane, shared_lane

from .conftest import LANE, ids, submit

_FOLDER = Path(keys.__file__).parent / "scripts"


def _code(path: Path) -> str:
    """The script without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())


def test_every_operation_has_its_script_and_nothing_else_is_there() -> None:
    assert {p.stem for p in _FOLDER.glob("*.lua")} == {*SCRIPTS, "lib"}


@pytest.mark.parametrize("path", sorted(_FOLDER.glob("*.lua")), ids=lambda p: p.name)
def test_no_script_spells_a_prefix_or_a_number_of_keys_py(path: Path) -> None:
    code = _code(path)
    strings = re.findall(r"'([^']*)'", code)
    for prefix in (REDIS_PREFIX, LANE_PREFIX, keys.ADMISSION_TAG_PREFIX, "fast-path"):
        assert not [s for s in strings if prefix in s], (path.name, prefix)
    assert not [s for s in strings if keys.HOME_SEPARATOR in s], path.name
    numbers = {int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.])", code)}
    for name in ("DEFAULT_LEASE_MS", "MAX_DISPATCH"):
        assert getattr(keys, name) not in numbers, (path.name, name)
    # 1000 is also the milliseconds of a second (now_ms): the batch is checked where it goes.
    assert not re.search(r"'LIMIT', 0, \d", code), path.name


def test_the_preamble_is_the_python_definition() -> None:
    text = script_text("submit")
    for name, value in keys.LUA_CONSTANTS.items():
        written = str(value) if isinstance(value, int) else f"'{value}'"
        assert f"local {name} = {written}\n" in text
    assert text.index("local SLACK") < text.index("local function dispatch")


def test_a_constant_the_lua_cannot_hold_as_written_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(keys.LUA_CONSTANTS, "P", "vessel'; redis.call('FLUSHALL') --")
    with pytest.raises(ValueError, match="Lua constant P"):
        keys.lua_preamble()


def test_python_and_lua_build_the_same_lane_and_key_names() -> None:
    assert shared_lane("service") == f"{LANE_PREFIX}service"
    assert dedicated_lane("service", "a") == f"{LANE_PREFIX}service{keys.AGENT_SEPARATOR}a"
    assert home_lane(dedicated_lane("sandbox", "a"), "h") == "vessel.sandbox.a@h"
    assert keys.kind_key("sandbox", keys.PENDING, "a") == "vessel:sandbox:pending:a"
    assert keys.home_key("a", "t") == "vessel:home:a:t"


@pytest.fixture
def slackless(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisAdmission]:
    """A Redis admission whose scripts were loaded with a slack of 0."""
    monkeypatch.setitem(keys.LUA_CONSTANTS, "SLACK", 0)
    found = RedisAdmission.from_url(redis_url)
    yield found
    found.close()


def test_the_scripts_follow_the_slack_of_keys_py(
    redis_admission: RedisAdmission, slackless: RedisAdmission
) -> None:
    # (`redis_admission` first: its scripts are loaded before the slack is changed.)
    for i in range(5):
        submit(slackless, f"a{i}")
    # Window 1 and no slack: one call, where the default slack of 2 lets in three.
    assert ids(slackless.heartbeat("service", "w1", {LANE: 1}, 10_000)) == ["a0"]
    for i in range(5):
        submit(redis_admission, f"b{i}", "b", kind="plugin")
    lane = shared_lane("plugin")
    dispatched = redis_admission.heartbeat("plugin", "w1", {lane: 1}, 10_000)
    assert ids(dispatched) == ["b0", "b1", "b2"][: 1 + keys.SLACK]
