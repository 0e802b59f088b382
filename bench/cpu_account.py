"""CPU time of everything a started process ever runs: a cgroup per watched process.

A process tree's own accounting (`bench.memory.cpu_seconds`: each live process
with the children it reaped) misses what the tree's processes leave to others
to reap: bubblewrap's pid-namespace init is orphaned when bwrap's parent
process exits and the host's init reaps it, so a raw Celery task running bwrap
shows about 2 of the ~6 ms a call burns, while a sandbox worker's slot
launchers (subreapers) reap every call's processes and are charged for all of
them. Compared that way, the worker's CPU per call is not measured alike.

A cgroup counts every process that was ever in it, whoever reaps it: a
process started in one (`wrap`: a shell joins it, then execs the process) and all it
starts are charged to it, orphans included. Used where the bench can make
one: cgroup v1's `cpuacct` mounted on its own (the controllers the sandbox
runner uses, `pids`, `memory` and `cpu`, never move a process out of it), or
cgroup v2 (`cpu.stat`'s `usage_usec` counts the cgroups below too, the
runner's own included). Elsewhere `make` returns None and the bench falls back
to the tree's accounting, saying so in its notes.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CpuAccount"]

_MOUNTINFO = Path("/proc/self/mountinfo")
#: Controllers the sandbox runner moves processes in: a cpuacct hierarchy
#: mounted with one of them would lose the runner's calls to its cgroups.
_RUNNER_CONTROLLERS = frozenset({"cpu", "memory", "pids"})


def _cgroup_mounts() -> list[tuple[str, Path, set[str]]]:
    """(fstype, mount point, super options) of every cgroup mount."""
    found = []
    with contextlib.suppress(OSError):
        for line in _MOUNTINFO.read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
                continue
            found.append((tail[0], Path(fields[4]), set(tail[2].split(","))))
    return found


def _own_path(controller: str) -> str:
    """This process's cgroup in the hierarchy of `controller` ("" for v2's)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _id, names, path = line.split(":", 2)
            if controller in names.split(","):
                return path
    return "/"


class CpuAccount:
    """One cgroup counting a process's CPU time and its descendants'."""

    def __init__(self, folder: Path, usage: Path, *, v2: bool) -> None:
        self.folder = folder
        self._usage = usage
        self._v2 = v2
        self._procs = str(folder / "cgroup.procs")

    @classmethod
    def make(cls, name: str) -> CpuAccount | None:
        """A new cgroup for `name`, or None where none can be made."""
        tag = f"vessel-bench-{name}-{secrets.token_hex(4)}"
        for fstype, mount, options in _cgroup_mounts():
            if fstype == "cgroup" and "cpuacct" in options and not options & _RUNNER_CONTROLLERS:
                folder = mount / _own_path("cpuacct").lstrip("/") / tag
                usage, v2 = folder / "cpuacct.usage", False
            elif fstype == "cgroup2":
                folder = mount / _own_path("").lstrip("/") / tag
                usage, v2 = folder / "cpu.stat", True
            else:
                continue
            try:
                folder.mkdir()
            except OSError:
                continue
            account = cls(folder, usage, v2=v2)
            try:
                account.seconds()
                # v2's rule of no processes in an inner cgroup with controllers:
                # join it once, from a child, before trusting it.
                probe = account.wrap(["/bin/true"])
                if subprocess.run(probe, stderr=subprocess.DEVNULL, check=False).returncode == 0:
                    return account
            except OSError:
                pass
            account.remove()
        return None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """`argv`, started by a shell that joins the cgroup first and then execs it:
        the process is in the cgroup before it runs, so nothing it starts escapes
        (a `preexec_fn` would do the same, but is unsafe in a process with threads)."""
        return ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', self._procs, *argv]

    def seconds(self) -> float:
        """CPU seconds used in the cgroup since it was made."""
        text = self._usage.read_text()
        if not self._v2:
            return int(text) / 1e9
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise OSError(f"{self._usage} has no usage_usec")

    def remove(self) -> None:
        """Remove the cgroup (only once its processes are gone; best effort)."""
        with contextlib.suppress(OSError):
            self.folder.rmdir()
