"""One burst: N calls submitted at once, then every result collected.

Throughput is N over the time from the first submit to the last result. Each
call's latency is from its submit to the moment its result was collected;
results are collected in submit order, so a call's latency includes waiting
for the ones before it to be read (the same for ours and the baseline).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.memory import cpu_basis, cpu_seconds, machine_busy_seconds
from bench.turns import MAX_ERRORS_KEPT

__all__ = ["Burst", "BurstResult", "raw_burst", "run_bursts"]

#: Seconds all of a burst's results may take once it is submitted (2,000 calls
#: at ~20/s on a loaded 2-core machine, with room to spare).
COLLECT_TIMEOUT = 120.0
#: The smallest burst a time budget may cut a burst to: enough calls to reach a
#: steady state past the first window of calls.
MIN_BURST = 200


@dataclass(kw_only=True)
class BurstResult:
    throughput: float
    latencies_ms: list[float]
    errors: list[str] = field(default_factory=list)
    failures: int = 0
    #: CPU seconds spent during the burst, per watched process ("client": this one).
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    #: What each watched process's figure counts (`bench.memory.cpu_basis`).
    cpu_basis: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Burst:
    """`submit(i)` sends call i and returns a handle; `collect(handle, timeout)` waits
    at most `timeout` seconds for its result and checks it."""

    submit: Callable[[int], Any]
    collect: Callable[[Any, float], None]
    #: Processes whose CPU time the burst records (label -> pid), e.g. the
    #: worker and redis-server: CPU per call says where a burst's time goes.
    watch: Mapping[str, int] = field(default_factory=dict)

    def _cpu(self) -> dict[str, float]:
        usage = {"machine": machine_busy_seconds()}
        usage |= {label: cpu_seconds(pid) for label, pid in self.watch.items()}
        own = os.times()
        usage["client"] = own.user + own.system
        return usage

    def run(self, calls: int) -> BurstResult:
        cpu_before = self._cpu()
        started = time.perf_counter()
        sent = []
        for i in range(calls):
            sent.append((time.perf_counter(), self.submit(i)))
        # One deadline for the whole burst, not one per call: a burst whose
        # results are lost ends in bounded time instead of N x the timeout.
        deadline = time.monotonic() + COLLECT_TIMEOUT
        latencies = []
        errors: list[str] = []
        failures = 0
        for submitted, handle in sent:
            try:
                self.collect(handle, max(deadline - time.monotonic(), 0.01))
            except Exception as exc:
                failures += 1
                if len(errors) < MAX_ERRORS_KEPT:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append((time.perf_counter() - submitted) * 1000)
        elapsed = time.perf_counter() - started
        cpu_after = self._cpu()
        return BurstResult(
            throughput=calls / elapsed,
            latencies_ms=latencies,
            errors=errors,
            failures=failures,
            cpu_seconds={k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
            cpu_basis={label: cpu_basis(pid) for label, pid in self.watch.items()},
        )


def raw_burst(
    app: Any, task: str, queue: str, expected: object, watch: Mapping[str, int] | None = None
) -> Burst:
    def collect(result: Any, timeout: float) -> None:
        value = result.get(timeout=timeout)
        if value != expected:
            raise ValueError(f"{task} returned {value!r}")

    return Burst(
        submit=lambda i: app.send_task(task, queue=queue), collect=collect, watch=watch or {}
    )


@dataclass(kw_only=True)
class BurstSeries:
    throughputs: list[float] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failures: int = 0
    calls: int = 0
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    cpu_basis: dict[str, str] = field(default_factory=dict)

    def cpu_ms_per_call(self) -> dict[str, float]:
        return {k: v / self.calls * 1000 for k, v in self.cpu_seconds.items()} if self.calls else {}

    def cpu_text(self) -> str:
        per_call = self.cpu_ms_per_call()
        text = ", ".join(f"{k} {v:.2f}" for k, v in per_call.items())
        worker = self.cpu_basis.get("worker")
        return f"{text} (worker: {worker})" if worker else text

    def error_texts(self, name: str) -> list[str]:
        if not self.failures:
            return []
        return [f"{name}: {self.failures} wrong results ({'; '.join(self.errors)})"]


def run_bursts(
    bursts: dict[str, Burst],
    *,
    calls: int,
    rounds: int,
    warmup_calls: int,
    max_burst_seconds: float | None = None,
) -> tuple[dict[str, BurstSeries], int]:
    """Every contender bursts once per round, in a rotating order, after a warm-up burst.

    With `max_burst_seconds`, the burst size is cut (never below `MIN_BURST`)
    so that the slowest contender's burst, at its warm-up throughput, takes
    about that long: a 2,000-call sandbox burst at 10 calls/s would take over
    3 minutes a round. Every contender bursts the same number of calls.
    Returns the series and the burst size used.
    """
    names: Sequence[str] = list(bursts)
    series = {name: BurstSeries() for name in names}
    slowest = None
    if warmup_calls:
        for name in names:
            outcome = bursts[name].run(warmup_calls)
            slowest = outcome.throughput if slowest is None else min(slowest, outcome.throughput)
    if max_burst_seconds is not None and slowest is not None:
        calls = max(min(calls, MIN_BURST), min(calls, int(slowest * max_burst_seconds)))
    for i in range(rounds):
        shift = i % len(names)
        for name in [*names[shift:], *names[:shift]]:
            outcome = bursts[name].run(calls)
            got = series[name]
            got.throughputs.append(outcome.throughput)
            got.latencies_ms += outcome.latencies_ms
            got.failures += outcome.failures
            got.errors += outcome.errors[: MAX_ERRORS_KEPT - len(got.errors)]
            got.calls += calls
            for label, seconds in outcome.cpu_seconds.items():
                got.cpu_seconds[label] = got.cpu_seconds.get(label, 0.0) + seconds
            got.cpu_basis |= outcome.cpu_basis
    return series, calls
