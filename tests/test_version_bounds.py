"""pyproject.toml's dependency bounds are the ones CI runs.

Every dependency's lower bound must be exactly what scripts/test-lowest installs
(.ci/lowest.txt), and celery and kombu must have upper bounds (their internals
are used).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bounds() -> dict[str, tuple[str, str | None]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found: dict[str, tuple[str, str | None]] = {}
    for spec in project["dependencies"]:
        match = re.fullmatch(r"([a-z-]+)(\[[a-z,]+\])?(.*)", spec.replace(" ", ""))
        assert match is not None, spec
        name, rest = match.group(1), match.group(3)
        low = re.search(r">=([0-9.]+)", rest)
        high = re.search(r"<([0-9.]+)", rest)
        assert low is not None, f"{spec}: no lower bound"
        found[name] = (low.group(1), high.group(1) if high else None)
    return found


def _pins(name: str) -> dict[str, str]:
    lines = (ROOT / ".ci" / name).read_text().splitlines()
    pairs = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {k: v for k, v in pairs}


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def test_the_lowest_pins_are_the_lower_bounds() -> None:
    bounds = _bounds()
    assert {"celery", "kombu", "redis"} <= set(bounds)
    pins = _pins("lowest.txt")
    assert sorted(pins) == sorted(bounds)
    for name, (low, _high) in bounds.items():
        # `>=5.4` is satisfied first by 5.4.0: the pin is that release.
        assert _release(pins[name])[: len(_release(low))] == _release(low), name
        assert set(pins[name].split(".")[len(low.split(".")) :]) <= {"0"}, name


def test_celery_and_kombu_have_upper_bounds() -> None:
    bounds = _bounds()
    assert bounds["celery"][1] is not None and bounds["kombu"][1] is not None
