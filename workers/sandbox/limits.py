"""Resource limits of one call, set without `preexec_fn`.

Workers are threaded (Celery's threads pool), and `preexec_fn` is not safe in a
threaded parent, so the limits are set by an exec wrapper: util-linux `prlimit`
sets them on itself and then executes bwrap, which (and everything it starts)
inherits them. It costs one extra exec, about 1 ms.

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
bomb only by the timeout.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from broker.model import AgentSettings

__all__ = [
    "MAX_OPEN_FILES",
    "MIB",
    "USER_PROCESSES",
    "Limits",
    "prlimit_binary",
]

MIB = 1024 * 1024

#: Seed 000: "It may hold at most 4,096 open files."
MAX_OPEN_FILES = 4096
#: RLIMIT_NPROC for a non-root worker: processes and threads of the worker's
#: user at once, worker included. 2,048 holds 16 concurrent calls of a few dozen
#: processes each plus a threaded worker, and stays far below pid_max (32,768).
USER_PROCESSES = 2048


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
    msgqueue_bytes: int = 0
    #: RLIMIT_NPROC, set only when the worker is not root (root ignores it).
    processes: int | None = None

    @classmethod
    def for_agent(cls, settings: AgentSettings) -> Limits:
        return cls(
            file_size_bytes=settings.disk_limit_mb * MIB,
            data_bytes=settings.memory_limit_mb * MIB,
            processes=USER_PROCESSES if os.geteuid() != 0 else None,
        )

    def prlimit_argv(self, binary: str) -> list[str]:
        """`prlimit --x=soft:hard ... --` : soft and hard equal, so a tool cannot raise them."""

        def pair(value: int) -> str:
            return f"{value}:{value}"

        return [
            binary,
            f"--nofile={pair(self.open_files)}",
            f"--fsize={pair(self.file_size_bytes)}",
            f"--data={pair(self.data_bytes)}",
            f"--core={pair(self.core_bytes)}",
            f"--memlock={pair(self.memlock_bytes)}",
            f"--msgqueue={pair(self.msgqueue_bytes)}",
            *([f"--nproc={pair(self.processes)}"] if self.processes is not None else []),
            "--",
        ]


def prlimit_binary() -> str | None:
    """util-linux `prlimit` (Debian: package util-linux, always installed), or None."""
    return shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin")
