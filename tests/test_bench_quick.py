"""The bench's quick mode runs end to end and produces a correct result for every mode.

Nothing timed is asserted (timings belong to `bench/run.py`'s full run): this
checks the exit code and that the JSON names every mode, each with a row that
was measured or says why it was not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODES = ("P1", "P2", "P3", "P4", "CAT", "MEM")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_mode_produces_every_mode(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "run.py"),
            "--quick",
            "--json",
            str(results),
            "--plot",
            str(tmp_path / "latency.png"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    document = json.loads(results.read_text())
    assert document["quick"] is True
    assert set(MODES) <= {row["mode"] for row in document["rows"]}
    for row in document["rows"]:
        assert not row["errors"], row
        assert row["skipped"] is not None or ("ratio_median" in row), row
    assert document["machine"]["nproc"] >= 1


def test_percentile_interpolates_like_numpy_linear() -> None:
    from bench.stats import median, percentile, ratio

    values = [4.0, 1.0, 3.0, 2.0]
    assert median(values) == 2.5
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 99) == pytest.approx(3.97)
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 0.0) == float("inf")


def test_goal_bounds_latency_from_above_and_throughput_from_below() -> None:
    from bench.report import Goal

    latency = Goal(median_max=1.3, p99_max=1.5)
    assert latency.met(1.2, 1.4)
    assert not latency.met(1.2, 1.6)
    throughput = Goal(median_min=0.7)
    assert throughput.met(0.75, 99.0)
    assert not throughput.met(0.65, 0.0)


def test_the_catalogue_mode_agrees_with_its_naive_baseline(tmp_path: Path) -> None:
    from bench import catalogue
    from bench.context import Context

    rows = catalogue.run(Context(quick=True, folder=tmp_path))
    assert [row.name for row in rows] == ["list of 10,000 tools", "search_tools over 10,000"]
    for row in rows:
        assert not row.errors, row.errors
        assert row.measured and row.details["tools"] == 10_000


def _wait_until(check: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_workers_cgroup_counts_what_an_orphan_burns() -> None:
    # The reason the bench starts each worker in a cgroup: a raw Celery task's
    # bwrap init is orphaned and reaped by the host's init, so the worker's
    # process tree never counts it; its cgroup does.
    from bench.cpu_account import CpuAccount
    from bench.memory import count_cpu_in, cpu_basis, cpu_seconds

    account = CpuAccount.make("test")
    if account is None:
        pytest.skip("no cgroup can be made here (not root, or no cpuacct/v2 hierarchy)")
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    # The parent starts a grandchild that burns 0.3 s of CPU, and exits first: an orphan.
    parent = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {burn!r}])\n"
    procs = account.folder / "cgroup.procs"
    started = subprocess.Popen(account.wrap([sys.executable, "-c", parent]))
    try:
        count_cpu_in(started.pid, account)
        assert cpu_basis(started.pid) == "its cgroup: all it started"
        started.wait(timeout=30)
        _wait_until(lambda: not procs.read_text().strip())  # the orphan is done
        assert account.seconds() >= 0.3
        assert cpu_seconds(started.pid) == account.seconds()
    finally:
        count_cpu_in(started.pid, None)
        _wait_until(lambda: not procs.read_text().strip())
        account.remove()
    assert cpu_basis(started.pid) == "its live tree"
    assert not account.folder.exists()


@pytest.mark.timeout(120)
def test_the_seccomp_cost_script_runs_every_contender() -> None:
    # bench/seccomp_cost.py: three contenders in real bwrap, then each filter's walk.
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "seccomp_cost.py"), "--runs", "2"],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for contender in ("no filter", "default order", "binary tree (ours)"):
        assert any(line.startswith(contender) for line in done.stdout.splitlines()), done.stdout
    assert "a decision walks" in done.stdout
