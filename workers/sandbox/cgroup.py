"""Per-call cgroups where the host lets us make them: a process, a memory and a CPU cap.

Seed 000 asks that a fork bomb be contained. A pid namespace makes every
process die with the call, but it does not bound how many there are before the
timeout: on a host with pid_max = 32768 a fork bomb exhausts the host's pids in
well under a second, and RLIMIT_NPROC is ignored for root. So each call gets
its own cgroup when a writable cgroup v1 `pids` (and `memory`) hierarchy is
mounted, as on these machines:

- pids.max = `PIDS_MAX` (processes and threads of the whole call);
- memory.limit_in_bytes = the agent's memory_limit_mb (the whole call, on top
  of the per-process RLIMIT_DATA);
- cpu.cfs_quota_us = cpu_limit x cpu.cfs_period_us (`cpu_quota_us`): the whole
  call gets at most cpu_limit cores, however many processes and threads it
  runs (RLIMIT_CPU, per process, is the bound where no `cpu` hierarchy is
  writable: `limits.py`).

How a call is placed inside, without `preexec_fn` (the worker is threaded):

- on the launcher path (`slot_launcher.py`, the default), each launcher owns a
  "slot" cgroup per controller (`create(kind="slot")`, pids.max = PIDS_MAX + 1:
  the launcher counts as one) and joins it once at its start; everything it
  starts is born inside. Per call the runner sets the slot's
  memory.limit_in_bytes and cpu.cfs_quota_us (each only when it changes: the
  idle launcher's own CPU is nil, so the quota is the call's) and reads memory.failcnt after it
  (the reading after the previous call is this call's zero); before reuse the
  slot must hold no process but the launcher (pids.current = 1);
- on the direct path (no launcher could start, or memory_limit_mb below
  `launcher.MIN_DATA_BYTES`), each call gets a fresh cgroup
  per controller, and a `/bin/sh` wrapper sets the call's rlimits (`ulimit`,
  `limits.py`), writes its own pid into each `cgroup.procs` and then executes
  bwrap (`wrapper_argv`).

Writing cgroup.procs waits for an RCU grace period on a cgroup v1 host (about
10 ms when no other cgroup write happened just before): once per launcher
instead of once per call.

`$VESSEL_SANDBOX_CGROUPS` (`CgroupSettings`, read once when the runner is built)
chooses: `per-call` (default) gives each call the caps above where a hierarchy is
writable; `off` makes none, and the limits are those of "without cgroups" below.
Where no hierarchy is writable (cgroups v2 not delegated, read-only /sys/fs/cgroup),
`CgroupSupport.detect` returns controllers=() and the runner relies on the
rlimits, the pid namespace and the timeout (see `limits.py`). cgroup v2
delegation is not implemented yet. Call and slot cgroups are named
`vessel-call-<worker pid>-...`; `sweep` removes those of dead workers.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workers.sandbox.env_choice import choice_of, env_choice

__all__ = [
    "CGROUP_MODES",
    "CGROUP_V1_ROOT",
    "ENV_SANDBOX_CGROUPS",
    "MIN_CPU_QUOTA_US",
    "PIDS_MAX",
    "CallCgroup",
    "CgroupMode",
    "CgroupSettings",
    "CgroupSupport",
    "cpu_quota_us",
    "parse_mode",
    "wrapper_argv",
]

#: The setting: `per-call` (default) or `off`.
ENV_SANDBOX_CGROUPS = "VESSEL_SANDBOX_CGROUPS"
CgroupMode = Literal["per-call", "off"]
CGROUP_MODES: tuple[CgroupMode, ...] = ("per-call", "off")

#: Processes + threads one call may have at once. A JVM starts ~40 threads, a
#: parallel build a few hundred; 512 leaves room for that and keeps 16 calls at
#: once (the default max_concurrent_calls) far below a pid_max of 32768.
PIDS_MAX = 512

#: The kernel refuses a CFS quota below 1 ms per period (EINVAL).
MIN_CPU_QUOTA_US = 1000
#: The v1 hierarchies a call is placed in, where writable.
_CONTROLLERS = ("pids", "memory", "cpu")

CGROUP_V1_ROOT = Path("/sys/fs/cgroup")
_PREFIX = "vessel-call-"
#: Numbers the cgroups of this process (every runner of it: names never collide).
_COUNTER = itertools.count()
_COUNTER_LOCK = threading.Lock()
#: `sweep` leaves call cgroups younger than this (a call lasts minutes at most).
_SWEEP_MIN_AGE_SECONDS = 3600.0
#: The wrapper: join every cgroup named before `--`, then exec the rest. sh
#: exports PWD, which bwrap (pid 1 inside) would keep in /proc/1/environ: unset.
_JOIN_SCRIPT = "; ".join(
    (
        'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done',
        "shift",
        "unset PWD OLDPWD",
        'exec "$@"',
    )
)


def wrapper_argv(procs_files: list[Path], limits_script: str = "") -> list[str]:
    """`/bin/sh -c SCRIPT sh FILE... --`: prefix for the command that joins the cgroups.

    `limits_script` (`Limits.ulimit_script`) runs first, in the same shell.
    """
    script = f"{limits_script}; {_JOIN_SCRIPT}" if limits_script else _JOIN_SCRIPT
    return ["/bin/sh", "-c", script, "sh", *map(str, procs_files), "--"]


def cpu_quota_us(cpu_limit: float, period_us: int) -> int:
    """cpu.cfs_quota_us giving `cpu_limit` cores in each period (at least the kernel's 1 ms)."""
    return max(MIN_CPU_QUOTA_US, round(cpu_limit * period_us))


@dataclass(frozen=True, kw_only=True, slots=True)
class CgroupSettings:
    """Which cgroups a call gets: `$VESSEL_SANDBOX_CGROUPS`, read once."""

    mode: CgroupMode = "per-call"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CgroupSettings:
        """`$VESSEL_SANDBOX_CGROUPS` (unset or empty: per-call); ValueError if unknown."""
        environ = os.environ if environ is None else environ
        return cls(mode=env_choice(environ, ENV_SANDBOX_CGROUPS, CGROUP_MODES))


def parse_mode(value: str) -> CgroupMode:
    """`per-call` or `off`; anything else raises ValueError."""
    return choice_of(ENV_SANDBOX_CGROUPS, value, CGROUP_MODES)


def _own_path(controller: str) -> str:
    """This process's cgroup path in a v1 hierarchy ("/" if not listed)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    return "/"


@dataclass(frozen=True, slots=True)
class CallCgroup:
    """The cgroup directories of one call or slot (one per controller)."""

    #: controller name -> its directory.
    paths: Mapping[str, Path]

    @property
    def dirs(self) -> tuple[Path, ...]:
        return tuple(self.paths[c] for c in sorted(self.paths))

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def read(self, controller: str, name: str) -> str:
        """A control file's content (OSError if absent); read per call, so no io layers."""
        fd = os.open(self.paths[controller] / name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, 4096).decode()
        finally:
            os.close(fd)

    def write(self, controller: str, name: str, value: str) -> None:
        (self.paths[controller] / name).write_text(value)

    def set_cpu_limit(self, cpu_limit: float) -> None:
        """cpu.cfs_quota_us = cpu_limit x the period, if there is a `cpu` cgroup (OSError
        if the host refuses)."""
        if "cpu" in self.paths:
            period = int(self.read("cpu", "cpu.cfs_period_us"))
            self.write("cpu", "cpu.cfs_quota_us", str(cpu_quota_us(cpu_limit, period)))

    def memory_failures(self) -> int:
        """How often the call hit its memory cap (memory.failcnt), 0 if not capped."""
        if "memory" in self.paths:
            with contextlib.suppress(OSError, ValueError):
                return int(self.read("memory", "memory.failcnt"))
        return 0

    def remove(self) -> None:
        """Remove the directories; by now every process of the call is dead.

        A pid namespace's processes are reaped before its init's parent sees it
        exit, but be patient for a few milliseconds anyway (EBUSY), then give up:
        `CgroupSupport.sweep` removes leftovers later.
        """
        for d in self.dirs:
            delay = 0.0005
            for _ in range(40):  # about half a second in all
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.02)


@dataclass(kw_only=True)
class CgroupSupport:
    """The writable v1 hierarchies found on this host, and a factory of call cgroups."""

    #: controller name -> parent directory under which call cgroups are made.
    parents: dict[str, Path]

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(sorted(self.parents))

    @classmethod
    def detect(cls, root: Path = CGROUP_V1_ROOT) -> CgroupSupport:
        """Find the v1 `pids`, `memory` and `cpu` hierarchies we can make children in."""
        parents: dict[str, Path] = {}
        for controller in _CONTROLLERS:
            mount = root / controller
            if not (mount / "cgroup.procs").exists():
                continue
            own = mount / _own_path(controller).lstrip("/")
            parent = own if own.is_dir() else mount
            probe = parent / f"{_PREFIX}probe-{os.getpid()}-{threading.get_ident()}"
            try:
                probe.mkdir()
                probe.rmdir()
            except OSError:
                continue
            parents[controller] = parent
        support = cls(parents=parents)
        support.sweep()
        return support

    def create(
        self,
        *,
        memory_bytes: int,
        cpu_limit: float | None = None,
        pids_max: int = PIDS_MAX,
        kind: str = "",
    ) -> CallCgroup:
        """Make the cgroups of one call (or of a launcher's slot, kind "slot"), its CPU
        quota `cpu_limit` cores (None: none); raises OSError if the host refuses.

        Named `vessel-call-<pid>-<kind><n>`: `sweep` reads the owner's pid from it.
        """
        with _COUNTER_LOCK:
            n = next(_COUNTER)
        name = f"{_PREFIX}{os.getpid()}-{kind}{n}"
        made: dict[str, Path] = {}
        try:
            for controller, parent in sorted(self.parents.items()):
                d = parent / name
                d.mkdir(mode=0o755)
                made[controller] = d
                if controller == "pids":
                    (d / "pids.max").write_text(str(pids_max))
                elif controller == "memory":
                    (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                elif controller == "cpu" and cpu_limit is not None:
                    CallCgroup({"cpu": d}).set_cpu_limit(cpu_limit)
        except (OSError, ValueError):
            CallCgroup(made).remove()
            raise
        return CallCgroup(made)

    def sweep(self) -> int:
        """Remove call cgroups left by dead workers (empty ones only: rmdir refuses others)."""
        removed = 0
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                for d in parent.iterdir():
                    if not d.name.startswith(_PREFIX) or not d.is_dir():
                        continue
                    owner = d.name[len(_PREFIX) :].split("-", 1)[0]
                    if owner.isdigit() and Path(f"/proc/{owner}").exists():
                        continue
                    # A pid may belong to another pid namespace sharing this
                    # hierarchy: leave anything young enough to be in use.
                    with contextlib.suppress(OSError):
                        if time.time() - d.stat().st_mtime < _SWEEP_MIN_AGE_SECONDS:
                            continue
                    with contextlib.suppress(OSError):
                        d.rmdir()
                        removed += 1
        return removed
