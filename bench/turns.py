"""Run contenders in turns: every iteration runs each once, in a rotating order.

Interleaving puts the baseline and ours under the same machine conditions
(other tenants, CPU frequency, page cache) instead of measuring one after the
other; rotating the order removes any advantage of going first. Warm-up
iterations run the same way and are discarded.

`pause_seconds` (one-at-a-time modes: `PAUSE_SECONDS`): an untimed pause after
every call, so that work a call leaves running once its result is back (a
sandbox worker starting the next call's sandbox ahead, docs/declared-tools.md)
never runs during another contender's call, and each call starts on an idle
machine, as "one at a time" says.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["MAX_ERRORS_KEPT", "PAUSE_SECONDS", "Turns", "WrongResult", "in_turns"]

#: A broken mode fails every call: keep a few messages, count the rest.
MAX_ERRORS_KEPT = 5
#: The one-at-a-time modes' pause after each call: bwrap's start is ~3-8 ms here.
PAUSE_SECONDS = 0.01


class WrongResult(Exception):
    """A contender's call finished but not with the result it must have."""


@dataclass(kw_only=True)
class Turns:
    #: Wall time of each measured call, in ms, per contender.
    samples: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)

    def _fail(self, name: str, text: str) -> None:
        self.failures[name] = self.failures.get(name, 0) + 1
        kept = self.errors.setdefault(name, [])
        if len(kept) < MAX_ERRORS_KEPT:
            kept.append(text)

    def errors_of(self, *names: str) -> list[str]:
        out = []
        for name in names:
            count = self.failures.get(name, 0)
            if count:
                shown = "; ".join(self.errors.get(name, []))
                out.append(f"{name}: {count} wrong results ({shown})")
        return out


def in_turns(
    contenders: Mapping[str, Callable[[], object]],
    *,
    iterations: int,
    warmup: int,
    pause_seconds: float = 0.0,
) -> Turns:
    """Each contender raises `WrongResult` (or anything) on a wrong result."""
    names = list(contenders)
    turns = Turns(samples={name: [] for name in names})
    for i in range(warmup + iterations):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            try:
                contenders[name]()
            except Exception as exc:
                turns._fail(name, f"{type(exc).__name__}: {exc}")
                continue
            elapsed_ms = (time.perf_counter() - started) * 1000
            if i >= warmup:
                turns.samples[name].append(elapsed_ms)
            if pause_seconds:
                time.sleep(pause_seconds)
    return turns
