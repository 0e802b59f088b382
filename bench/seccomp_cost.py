"""What the seeds' seccomp filter costs a call, compiled as a binary tree against
libseccomp's default order, side by side.

    python bench/seccomp_cost.py [--runs N]

Times `/bin/true` inside raw bwrap (the runner's namespaces) three ways, in
turns: no filter, the filter in libseccomp's default order, the filter as a
binary tree (what the runner uses, `workers/sandbox/seccomp.py`); each run gets
its filter in a fresh memfd at `--seccomp 9`, as a call does. This process is a
subreaper, so the CPU column counts everything a run started (bwrap, its pid-1
init, the tool). Then, for each compiled filter, the instructions a decision
walks over every native system call number (`seccomp_check.py`).

The kernel walks the filter once per system call number when it attaches it
(to build its allow cache) and again on every system call the cache cannot
answer (the rules that look at arguments: ioctl, socket, clone, personality),
so a shorter walk is less CPU at the start of every call and inside it.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

import pyseccomp  # noqa: E402

from bench.baselines import raw_bwrap_argv  # noqa: E402
from bench.stats import percentile  # noqa: E402
from workers.sandbox import seccomp  # noqa: E402
from workers.sandbox.seccomp_check import decide, instructions  # noqa: E402

__all__ = ["main"]

_SECCOMP_FD = 9
_PR_SET_CHILD_SUBREAPER = 36
_WARMUP = 20
_MAX_NR = 600


def _spawn_once(argv: list[str], program: bytes | None) -> tuple[float, float]:
    """Wall ms and CPU ms (every process it started, all reaped) of one run."""
    actions = []
    memfd = -1
    if program is not None:
        memfd = os.memfd_create("vessel-seccomp", os.MFD_CLOEXEC)
        os.write(memfd, program)
        os.lseek(memfd, 0, os.SEEK_SET)
        actions.append((os.POSIX_SPAWN_DUP2, memfd, _SECCOMP_FD))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        pid = os.posix_spawn(argv[0], argv, {"PATH": "/usr/bin:/bin"}, file_actions=actions)
    finally:
        if memfd >= 0:
            os.close(memfd)
    _, status = os.waitpid(pid, 0)
    while True:  # bwrap's init, orphaned: ours as a subreaper
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    wall = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"seccomp_cost: {argv} exited with status {status}")
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, used * 1000


def _walks(program: bytes) -> tuple[float, int]:
    """Mean and longest instructions walked for a native system call (zero arguments)."""
    code = instructions(program)
    arch = pyseccomp.system_arch()
    steps = [decide(code, nr, arch=arch).steps for nr in range(_MAX_NR)]
    return statistics.fmean(steps), max(steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args(argv)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    bwrap = raw_bwrap_argv(["/bin/true"])
    bwrap[0] = "/usr/bin/bwrap"
    at = bwrap.index("--")
    filtered = [*bwrap[:at], "--seccomp", str(_SECCOMP_FD), *bwrap[at:]]
    ordered = seccomp.build_filter_bytes(tree=False)
    tree = seccomp.build_filter_bytes()
    contenders: dict[str, tuple[list[str], bytes | None]] = {
        "no filter": (bwrap, None),
        "default order": (filtered, ordered),
        "binary tree (ours)": (filtered, tree),
    }
    walls: dict[str, list[float]] = {name: [] for name in contenders}
    cpus: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for i in range(args.runs + _WARMUP):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = _spawn_once(*contenders[name])
            if i >= _WARMUP:
                walls[name].append(wall)
                cpus[name].append(cpu)
    print(f"/bin/true inside raw bwrap, {args.runs} runs each, in turns")
    print(f"{'':22s} {'p50 ms':>8s} {'p99 ms':>8s} {'CPU ms':>8s} {'CPU vs none':>12s}")
    none_cpu = statistics.fmean(cpus["no filter"])
    for name in names:
        cpu = statistics.fmean(cpus[name])
        print(
            f"{name:22s} {percentile(walls[name], 50):8.3f} {percentile(walls[name], 99):8.3f} "
            f"{cpu:8.3f} {cpu - none_cpu:+11.3f}"
        )
    delta = statistics.fmean(cpus["binary tree (ours)"]) - statistics.fmean(cpus["default order"])
    print(f"binary tree - default order: {delta * 1000:+.0f} us of CPU a call (mean)")
    for name, program in (("default order", ordered), ("binary tree (ours)", tree)):
        mean, worst = _walks(program)
        print(
            f"{name:22s} {len(program) // 8:4d} instructions; a decision walks "
            f"{mean:.1f} on average, {worst} at most"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
