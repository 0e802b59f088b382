"""What the command a sandbox call starts with costs: the Perl Landlock prefix
against the static one (`workers/sandbox/landlock_exec.c`), side by side.

    python bench/prefix_cost.py [--runs N]

Builds the static prefix (`workers/sandbox/landlock_exec.c`) with `cc` into a
temp folder, checks it first (inside a real bwrap with the runner's namespaces:
its Landlock report line equals the Perl prefix's, PWD is gone from the tool's
environment, a missing command says what Perl says and exits 127), then times
`/bin/true` started four ways, in turns:
alone, after `env -u PWD` (the seeded baseline's environment rule), after the
Perl prefix, after the static one; once spawned directly (the prefix's own cost,
with the children's CPU), once inside raw bwrap (what a call sees; wall only).
Medians and p99 in ms, ratios against `/bin/true` and against `env -u PWD`.

The runner uses the static prefix where it is built (`command_prefix.py`); this
measures what that saves, and checks both still agree.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from bench.baselines import raw_bwrap_argv  # noqa: E402
from bench.stats import percentile  # noqa: E402
from workers.sandbox import command_prefix  # noqa: E402
from workers.sandbox.command_prefix import STATIC_MOUNT  # noqa: E402
from workers.sandbox.landlock import COMMAND_PREFIX, PREFIX_ENV, REPORT_FLAG  # noqa: E402


class CheckFailed(RuntimeError):
    """The static prefix does not do what the Perl prefix does."""


def build(folder: Path) -> Path:
    try:
        return command_prefix.build(folder / "landlock-exec")
    except command_prefix.BuildFailed as exc:
        raise SystemExit(f"prefix_cost: {exc}") from exc


def _in_bwrap(binary: Path, command: list[str]) -> list[str]:
    argv = raw_bwrap_argv(command)
    at = argv.index("--")
    env = [
        a for name, value in {"PWD": "/", **PREFIX_ENV}.items() for a in ("--setenv", name, value)
    ]
    return [*argv[:at], "--ro-bind", str(binary), STATIC_MOUNT, *env, *argv[at:]]


def check(binary: Path) -> None:
    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            _in_bwrap(binary, command), check=False, capture_output=True, text=True, timeout=30
        )

    perl = run([*COMMAND_PREFIX, REPORT_FLAG, "/bin/true"]).stdout.strip()
    ours = run([STATIC_MOUNT, REPORT_FLAG, "/bin/true"]).stdout.strip()
    if not perl.startswith("vessel-landlock:") or ours != perl:
        raise CheckFailed(f"report lines differ: perl {perl!r}, static {ours!r}")
    env = run([STATIC_MOUNT, "/usr/bin/env"]).stdout.splitlines()
    if any(line.startswith(("PWD=", "PERL_SKIP_LOCALE_INIT=")) for line in env):
        raise CheckFailed(f"the tool's environment kept the prefix's variables: {env}")
    expected = run([*COMMAND_PREFIX, "no-such-tool"])
    missing = run([STATIC_MOUNT, "no-such-tool"])
    if (missing.stderr, missing.returncode) != (expected.stderr, expected.returncode):
        raise CheckFailed(
            f"missing command: perl {expected.stderr!r} {expected.returncode}, "
            f"static {missing.stderr!r} {missing.returncode}"
        )
    print(f"checks passed; report: {ours}")


def _timed(argvs: dict[str, list[str]], env: dict[str, str], runs: int, *, cpu_shown: bool) -> None:
    samples: dict[str, list[float]] = {name: [] for name in argvs}
    cpu = dict.fromkeys(argvs, 0.0)
    names = list(argvs)
    for i in range(runs + 20):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            argv = argvs[name]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            pid = os.posix_spawnp(argv[0], argv, env)
            _, status = os.waitpid(pid, 0)
            elapsed = (time.perf_counter() - started) * 1000
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if os.waitstatus_to_exitcode(status) != 0:
                raise CheckFailed(f"{name}: exit status {status}")
            if i >= 20:
                samples[name].append(elapsed)
                cpu[name] += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    base = samples[names[0]]
    env_rule = samples[names[1]]
    med: Callable[[list[float]], float] = lambda v: percentile(v, 50)  # noqa: E731
    head = f"{'':32s} {'p50 ms':>8s} {'p99 ms':>8s} {'CPU ms' if cpu_shown else '':>8s}"
    print(f"{head} {'vs true':>8s} {'vs env':>8s}")
    for name in names:
        s = samples[name]
        used = f"{cpu[name] / runs * 1000:8.3f}" if cpu_shown else f"{'':8s}"
        print(
            f"{name:32s} {med(s):8.3f} {percentile(s, 99):8.3f} {used} "
            f"{med(s) / med(base):7.2f}x {med(s) / med(env_rule):7.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vessel-prefix-") as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)
        binary = build(folder)
        check(binary)
        env = {"PATH": "/usr/bin:/bin", "PWD": "/", **PREFIX_ENV}
        true = ["/bin/true"]
        prefixes = {
            "/bin/true": [],
            "env -u PWD": ["/usr/bin/env", "-u", "PWD", "--"],
            "perl prefix": list(COMMAND_PREFIX),
            "static prefix": [str(binary)],
        }
        print(f"\nspawned directly, {args.runs} runs each, in turns")
        _timed({name: [*p, *true] for name, p in prefixes.items()}, env, args.runs, cpu_shown=True)
        inside = {**prefixes, "static prefix": [STATIC_MOUNT]}
        print(f"\ninside raw bwrap (the runner's namespaces), {args.runs} runs each, in turns")
        _timed(
            {name: _in_bwrap(binary, [*p, *true]) for name, p in inside.items()},
            {"PATH": "/usr/bin:/bin"},
            args.runs,
            # The sandbox's processes are reaped by bwrap's own pid 1, in the call's
            # pid namespace: this process's children's CPU would count bwrap alone.
            cpu_shown=False,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
