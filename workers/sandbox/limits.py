"""Resource limits of one call, set without `preexec_fn`.

Workers are threaded (Celery's threads pool), and `preexec_fn` is not safe in a
threaded parent, so the limits are set by a process that runs before bwrap and
that bwrap inherits them from (soft = hard, so a tool cannot raise them):

- on the launcher path (`slot_launcher.py`), the slot launcher, single-threaded,
  sets `Limits.rlimits` on itself once at its start; every call it spawns
  (posix_spawn) inherits them. A launcher serves only calls with its limits;
- on the direct path, the `/bin/sh` wrapper that joins the call's cgroups
  (`cgroup.py`): dash's `ulimit` builtin sets each limit, soft and hard, on the
  shell itself, which then executes bwrap (`Limits.ulimit_script`).

dash's `ulimit` has no flag for RLIMIT_MSGQUEUE, so that one (0: POSIX message
queues, which seccomp refuses as well) is set once on the worker process itself
(`restrict_worker_msgqueue`), where every call and every launcher inherits it
(a launcher sets it again): the worker never uses message queues.

RLIMIT_CPU is the exception to "set on the launcher itself": the kernel counts
it per process, and a launcher lives for thousands of calls, so its own CPU
time would reach the limit and the kernel would kill it mid-call (and a
launcher per timeout would make the pool churn). So it is never among the
launcher's own limits (`Limits.rlimits`); the launcher sets it on each child
with prlimit(2) right after posix_spawn, before the child (bwrap) can start
anything: bwrap blocks reading its --args from a pipe the launcher fills only
after the prlimit (`launcher_children.spawn_child`). On the direct path dash's `ulimit -t`
sets it like the others. Each process of the call inherits it and counts its
own CPU time from zero.

The cgroups each call gets are a setting, `$VESSEL_SANDBOX_CGROUPS` (read once
when the runner is built, `cgroup.CgroupSettings`): `per-call` (the default:
a pids, a memory and a cpu cgroup per call where a v1 hierarchy is writable; on a root
host a fork bomb must not take every pid) or `off` (no cgroup: what follows holds).

What holds without cgroups (cgroups v1, not delegated): every limit here is
per process, so a tool that forks N processes may use N times the memory; the
pid namespace makes every one of them die with the call, and the timeout bounds
how long they live. The number of processes is bounded by the pids cgroup
(`cgroup.py`) where one can be created. Otherwise, for a worker that is not
root (the image runs as uid 10001), RLIMIT_NPROC caps the processes of the
worker's user: the kernel counts them per user across every user namespace, so
the cap is shared by all the calls of that user at once (a fork bomb makes other
calls' forks fail until its timeout, instead of exhausting the host's pids).
RLIMIT_NPROC is ignored for root: a root worker without cgroups bounds a fork
bomb only by the timeout. CPU: RLIMIT_CPU bounds each process to timeout x
cpu_limit CPU seconds; N processes may still use N cores until the timeout
(the cgroup CPU quota, `cgroup.py`, bounds the whole call where it exists).
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass

from broker.model import AgentSettings

__all__ = [
    "MAX_OPEN_FILES",
    "MIB",
    "MSGQUEUE_BYTES",
    "USER_PROCESSES",
    "Limits",
    "cpu_seconds",
    "restrict_worker_msgqueue",
]

MIB = 1024 * 1024

#: Seed 000: "It may hold at most 4,096 open files."
MAX_OPEN_FILES = 4096
#: RLIMIT_NPROC for a non-root worker: processes and threads of the worker's
#: user at once, worker included. 2,048 holds 16 concurrent calls of a few dozen
#: processes each plus a threaded worker, and stays far below pid_max (32,768).
USER_PROCESSES = 2048
#: RLIMIT_MSGQUEUE of every call (and of the worker process, see above).
MSGQUEUE_BYTES = 0


def cpu_seconds(timeout: float, cpu_limit: float) -> int:
    """RLIMIT_CPU's soft limit of one call: ceil(timeout x cpu_limit), at least 1 s."""
    return max(1, math.ceil(timeout * cpu_limit))


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """The rlimits of one call, from the agent's settings."""

    #: RLIMIT_NOFILE: seed 000's 4,096 open files (soft = hard, so it cannot be raised).
    open_files: int = MAX_OPEN_FILES
    #: RLIMIT_FSIZE: no single file larger than the turn's disk limit (seed 000,
    #: disk_limit_mb). A write past it fails with EFBIG (or SIGXFSZ if not ignored).
    file_size_bytes: int
    #: RLIMIT_DATA: the call's memory (memory_limit_mb), per process. DATA counts
    #: heap and private writable mappings but not reserved-and-unused address
    #: space, so Go, Node and the JVM (which reserve large ranges PROT_NONE) still
    #: start, unlike with RLIMIT_AS.
    data_bytes: int
    #: RLIMIT_CORE: no core files (they would land in the workspace, full of memory).
    core_bytes: int = 0
    #: RLIMIT_MEMLOCK: nothing needs to pin memory; 64 KiB is the kernel default.
    memlock_bytes: int = 64 * 1024
    #: RLIMIT_MSGQUEUE: POSIX message queues are refused by seccomp as well.
    msgqueue_bytes: int = MSGQUEUE_BYTES
    #: RLIMIT_NPROC, set only when the worker is not root (root ignores it).
    processes: int | None = None
    #: RLIMIT_CPU soft limit, per process: timeout x cpu_limit CPU seconds, so a
    #: process spinning N threads is stopped after timeout / N of wall clock
    #: (one spinning thread gets to the timeout). At the soft limit the kernel
    #: sends SIGXCPU, which names the cause (exit 128+24); the hard limit, one
    #: second later, is SIGKILL for a process that ignores it. soft < hard lets a
    #: tool raise its soft limit to the hard one: one CPU second more at most.
    #: Not among the launcher's own limits (`rlimits`): see the module docstring.
    cpu_seconds: int

    @property
    def cpu_hard_seconds(self) -> int:
        """RLIMIT_CPU hard limit: SIGKILL one CPU second after the soft limit's SIGXCPU."""
        return self.cpu_seconds + 1

    @classmethod
    def for_agent(cls, settings: AgentSettings, *, timeout: float | None = None) -> Limits:
        """The limits of a call of `settings`' agent, of a tool with `timeout` (default:
        the agent's tool_timeout_seconds)."""
        timeout = settings.tool_timeout_seconds if timeout is None else timeout
        return cls(
            file_size_bytes=settings.disk_limit_mb * MIB,
            data_bytes=settings.memory_limit_mb * MIB,
            processes=USER_PROCESSES if os.geteuid() != 0 else None,
            cpu_seconds=cpu_seconds(timeout, settings.cpu_limit),
        )

    def rlimits(self) -> tuple[tuple[int, int], ...]:
        """(resource.RLIMIT_*, value) pairs, each to be set soft = hard (slot launchers).

        Exact bytes, no dash units to round to; RLIMIT_MSGQUEUE included;
        RLIMIT_CPU not (set per child: `cpu_seconds`, module docstring).
        """
        pairs = [
            (resource.RLIMIT_NOFILE, self.open_files),
            (resource.RLIMIT_FSIZE, self.file_size_bytes),
            (resource.RLIMIT_DATA, self.data_bytes),
            (resource.RLIMIT_CORE, self.core_bytes),
            (resource.RLIMIT_MEMLOCK, self.memlock_bytes),
            (resource.RLIMIT_MSGQUEUE, self.msgqueue_bytes),
        ]
        if self.processes is not None:
            pairs.append((resource.RLIMIT_NPROC, self.processes))
        return tuple(pairs)

    def ulimit_script(self) -> str:
        """dash `ulimit` commands setting these limits, soft and hard (no -H/-S: both;
        RLIMIT_CPU's two differ).

        dash's units: -f and -c in 512-byte blocks, -d and -l in KiB (rounded
        down, so never looser). RLIMIT_MSGQUEUE has no dash flag: see
        `restrict_worker_msgqueue`. A refused limit exits 125 before bwrap runs.
        """
        steps = [
            f"ulimit -n {self.open_files}",
            f"ulimit -f {self.file_size_bytes // 512}",
            f"ulimit -d {self.data_bytes // 1024}",
            f"ulimit -c {self.core_bytes // 512}",
            f"ulimit -l {self.memlock_bytes // 1024}",
            *([f"ulimit -p {self.processes}"] if self.processes is not None else []),
            # Soft first: the kernel refuses a hard limit below the soft one (unlimited).
            f"ulimit -S -t {self.cpu_seconds}",
            f"ulimit -H -t {self.cpu_hard_seconds}",
        ]
        return " && ".join(steps) + " || exit 125"


def restrict_worker_msgqueue(limit: int = MSGQUEUE_BYTES) -> bool:
    """Lower this process's RLIMIT_MSGQUEUE (soft and hard) to `limit`; True if it holds.

    Inherited by every call (dash's `ulimit` cannot set it). Never raises it.
    """
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_MSGQUEUE)
        if not (0 <= hard <= limit and 0 <= soft <= limit):
            resource.setrlimit(resource.RLIMIT_MSGQUEUE, (limit, limit))
        soft, hard = resource.getrlimit(resource.RLIMIT_MSGQUEUE)
    except (OSError, ValueError):
        return False
    return 0 <= soft <= limit and 0 <= hard <= limit
