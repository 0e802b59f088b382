"""Peak resident memory of a worker's process tree, from /proc.

`VmHWM` is the kernel's high-water mark of one process's resident set since it
started, so reading it after a burst gives that process's peak during the
burst (and start-up). A worker is a tree (the Celery main process and its pool
children; sandbox calls' bwrap processes are short-lived and gone by then), so
the tree's figure is the sum over its live processes: an upper bound of the
tree's simultaneous peak, since the processes need not peak at the same time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.cpu_account import CpuAccount

__all__ = [
    "TreeMemory",
    "children",
    "count_cpu_in",
    "cpu_basis",
    "cpu_seconds",
    "machine_busy_seconds",
    "tree_memory",
    "tree_pids",
    "vm_hwm_kib",
]

_TICKS = os.sysconf("SC_CLK_TCK")


def vm_hwm_kib(pid: int) -> int | None:
    """VmHWM of one process in KiB; None once it has exited."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None  # a kernel thread or a zombie: no memory of its own


def children(pid: int) -> list[int]:
    """Direct children of `pid`, over all its threads."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def tree_pids(root: int) -> list[int]:
    pids: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in pids:
            continue
        pids.append(pid)
        todo += children(pid)
    return pids


@dataclass(frozen=True, kw_only=True, slots=True)
class TreeMemory:
    #: Sum of VmHWM over the tree's processes, MiB.
    total_mib: float
    #: The largest single process's VmHWM, MiB.
    largest_mib: float
    processes: int


def tree_memory(root: int) -> TreeMemory:
    peaks = [k for k in (vm_hwm_kib(p) for p in tree_pids(root)) if k is not None]
    return TreeMemory(
        total_mib=sum(peaks) / 1024,
        largest_mib=(max(peaks) if peaks else 0) / 1024,
        processes=len(peaks),
    )


def _own_cpu_seconds(pid: int) -> float:
    """utime, stime, cutime and cstime of one process (0 once it has exited)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # The command name (field 2) may hold spaces: split after its closing ")".
    fields = text[text.rindex(")") + 2 :].split()
    return sum(int(v) for v in fields[11:15]) / _TICKS


#: pid -> the cgroup its CPU time is read from (`bench.cluster` starts workers in one).
_ACCOUNTS: dict[int, CpuAccount] = {}


def count_cpu_in(pid: int, account: CpuAccount | None) -> None:
    """Read `pid`'s CPU time from `account` from now on (None: from its tree again)."""
    if account is None:
        _ACCOUNTS.pop(pid, None)
    else:
        _ACCOUNTS[pid] = account


def cpu_basis(pid: int) -> str:
    """What `cpu_seconds(pid)` counts, for a row's notes."""
    return "its cgroup: all it started" if pid in _ACCOUNTS else "its live tree"


def cpu_seconds(pid: int) -> float:
    """CPU time of a process: of its cgroup where it was started in one
    (`bench.cpu_account`: every process it ever started, orphans included),
    else of its tree: every live process of it, each with the children it has
    reaped. A sandbox worker's slot launchers live as long as the worker and
    reap the bwrap of each call, so counting only the worker's own reaped
    children would leave every sandbox call's processes out; a raw Celery
    task's bwrap init, orphaned, is reaped by the host's init and is left out
    of its tree either way: only the cgroup counts both alike."""
    account = _ACCOUNTS.get(pid)
    if account is not None:
        return account.seconds()
    return sum(_own_cpu_seconds(p) for p in tree_pids(pid))


def machine_busy_seconds() -> float:
    """CPU time the whole machine has spent busy since boot (all cores, /proc/stat).

    Bursts run one contender at a time, so its growth over a burst, per call,
    is what one call costs everything together: worker, Redis, client, the
    local server and the kernel. Per-process figures miss work no watched
    process is charged for: bubblewrap's pid-namespace init is orphaned and
    reaped by the host's init unless a subreaper (the slot launcher) takes it,
    so raw bwrap's own tree shows about 2 ms of the ~6 ms a call burns here.
    Counted: user, nice, system, irq and softirq; not idle, iowait, nor steal
    (time the hypervisor gave another guest: not this machine's work).
    """
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / _TICKS
