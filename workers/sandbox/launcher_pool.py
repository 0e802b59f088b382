"""The slot launchers of one worker process: taken by a call, given back after it.

A launcher's rlimits are its own (`slot_launcher.py`), so a call takes one
with exactly its rlimits; the slot's memory and CPU caps are set per call
(`Launcher.prepare`). A launcher whose slot is not empty again in time, or
whose cap the kernel refuses, is retired and replaced.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import threading
import time
import weakref
from collections.abc import Hashable
from pathlib import Path

from workers.sandbox.cgroup import PIDS_MAX, CgroupSupport
from workers.sandbox.identity import SandboxIdentity
from workers.sandbox.launcher_client import Launcher
from workers.sandbox.launcher_protocol import Rlimits

__all__ = ["MAX_STANDBYS", "MIN_DATA_BYTES", "LauncherPool"]

#: Calls with a smaller RLIMIT_DATA (memory_limit_mb) take the direct path: a
#: launcher (about 10 MB of Python) would not fit under it with room to spare.
MIN_DATA_BYTES = 32 * 1024 * 1024
#: Free launchers holding a standby (`standby.py`) kept while a call that fits none of
#: them starts a launcher of its own: calls of a few agents or turns interleaved keep
#: theirs instead of killing each other's; past it, the call takes one and kills its.
MAX_STANDBYS = 4
#: The launchers' hole folders of this process, numbered.
_HOLE_NUMBERS = itertools.count()


class LauncherPool:
    """The launchers of one process: taken by a call, given back after it.

    A call takes a free launcher with its rlimits (a launcher's rlimits are its
    own); if there is none, a new one is started, and an idle one with other
    rlimits is stopped instead, so the pool grows to the number of calls at
    once, not to calls times limit sets. A pool belongs to the process that made
    it: in a forked child (prefork) it is emptied without touching the parent's
    launchers, and it refuses to serve if used from another pid anyway.
    """

    def __init__(
        self,
        cgroups: CgroupSupport,
        identity: SandboxIdentity | None = None,
        *,
        share_network: bool = False,
        holes_root: Path | None = None,
    ) -> None:
        self.cgroups = cgroups
        #: Whom its launchers serve as (None: the worker's own ids).
        self.identity = identity
        #: Each launcher runs its calls in a network namespace of its own (`launcher_network.py`).
        self.share_network = share_network
        #: Where each launcher's hole folder is made (`launcher_holes.py`; None: none).
        self.holes_root = holes_root if share_network else None
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._free: list[Launcher] = []  # most recently given back last
        self._all: set[Launcher] = set()
        self._abandoned: list[Launcher] = []
        self._closed = False
        _forget_after_fork(self)

    def _new(self, memory_bytes: int, rlimits: Rlimits, cpu_limit: float | None) -> Launcher:
        slot = None
        if self.cgroups.controllers:
            # pids.max counts the launcher itself: the call keeps PIDS_MAX.
            slot = self.cgroups.create(
                memory_bytes=memory_bytes, cpu_limit=cpu_limit, pids_max=PIDS_MAX + 1, kind="slot"
            )
        hole_dir = None
        try:
            if self.holes_root is not None:
                hole_dir = self.holes_root / f"{os.getpid()}-{next(_HOLE_NUMBERS)}"
                hole_dir.mkdir(mode=0o700)
            return Launcher.start(
                slot,
                rlimits,
                self.identity,
                memory_bytes=memory_bytes,
                cpu_limit=cpu_limit,
                share_network=self.share_network,
                hole_dir=hole_dir,
            )
        except BaseException:
            if slot is not None:
                slot.remove()
            if hole_dir is not None:
                with contextlib.suppress(OSError):
                    hole_dir.rmdir()
            raise

    def take(
        self,
        memory_bytes: int,
        rlimits: Rlimits,
        cpu_limit: float | None = None,
        *,
        standby_key: Hashable | None = None,
    ) -> Launcher | None:
        """A free launcher with `rlimits` (a new one if none is), its slot empty, its
        memory capped at `memory_bytes` and its CPU at `cpu_limit` cores (None: left as
        it is); None if the pool is closed or not this process's,
        or if RLIMIT_DATA is below MIN_DATA_BYTES.

        One holding a standby with `standby_key` (`standby.py`) is taken first, its
        standby kept; then one holding none; if every fitting one holds another's,
        a new one is started while fewer than MAX_STANDBYS stand by, else the most
        recent is taken and its standby killed.

        Raises LauncherUnavailable or OSError if a new one cannot be made.
        """
        if os.getpid() != self.owner:
            return None
        if any(which == resource.RLIMIT_DATA and v < MIN_DATA_BYTES for which, v in rlimits):
            return None
        while True:
            idle: Launcher | None = None
            with self._lock:
                if self._closed:
                    return None
                fitting = [each for each in reversed(self._free) if each.rlimits == rlimits]
                # Its standby fits the call; else none to kill; else the most recent.
                launcher = min(
                    fitting,
                    key=lambda each: (
                        0
                        if each.standby is not None and each.standby.key == standby_key
                        else 1
                        if each.standby is None
                        else 2
                    ),
                    default=None,
                )
                if (
                    launcher is not None
                    and _stands_by_for_others(launcher, standby_key)
                    and self._standing_by() < MAX_STANDBYS
                ):
                    launcher = None  # every fitting one stands by for other calls: keep them
                elif launcher is not None:
                    self._free.remove(launcher)
                elif self._free:
                    idle = self._free.pop(0)  # the longest idle, of other limits
            if idle is not None:
                self._retire(idle)
            if launcher is None:
                break
            if _stands_by_for_others(launcher, standby_key):
                launcher.drop_standby()
            try:
                if launcher.settled():
                    launcher.prepare(memory_bytes, cpu_limit)
                    return launcher
            except OSError:
                pass  # e.g. EBUSY: its page cache is over the new cap
            self._retire(launcher)
        launcher = self._new(memory_bytes, rlimits, cpu_limit)
        with self._lock:
            self._all.add(launcher)
        return launcher

    def give(self, launcher: Launcher) -> None:
        """Back to the free list after a call, or stopped if it broke."""
        if os.getpid() != self.owner:
            return
        if launcher.alive():
            with self._lock:
                if not self._closed:
                    self._free.append(launcher)
                    return
        self._retire(launcher)

    def standbys_waiting(self) -> int:
        """How many free launchers hold a standby now (0 in another process)."""
        if os.getpid() != self.owner:
            return 0
        with self._lock:
            return self._standing_by()

    def _standing_by(self) -> int:
        """`standbys_waiting`, the lock held."""
        return sum(each.standby is not None for each in self._free)

    def drop_idle_standbys(self, older_than: float) -> int:
        """Kill the standbys of free launchers started more than `older_than` seconds ago
        (`Standby.discard`); return how many. The launchers stay, free again: each is
        out of the free list while its standby is killed, so no call takes it then."""
        if os.getpid() != self.owner:
            return 0
        now = time.monotonic()
        with self._lock:
            idle = [
                each
                for each in self._free
                if each.standby is not None and now - each.standby.born > older_than
            ]
            for each in idle:
                self._free.remove(each)
        for each in idle:
            try:
                each.drop_standby()
            finally:  # back, or retired if it broke: never out of the pool for good
                self.give(each)
        return len(idle)

    def _retire(self, launcher: Launcher) -> None:
        with self._lock:
            self._all.discard(launcher)
        launcher.close()

    def close(self) -> None:
        """Stop every free launcher and remove its slot; busy ones stop when given back."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
            self._all.difference_update(free)
        if os.getpid() != self.owner:
            return
        for launcher in free:
            launcher.close()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        for launcher in self._all | set(self._free):
            launcher.abandon()
        # Kept referenced: a collected Popen of the parent's would warn "still running".
        self._abandoned = [*self._all, *self._free]
        self._all, self._free = set(), []


def _stands_by_for_others(launcher: Launcher, key: Hashable | None) -> bool:
    return launcher.standby is not None and launcher.standby.key != key


_POOLS: weakref.WeakSet[LauncherPool] | None = None


def _forget_after_fork(pool: LauncherPool) -> None:
    """Have `pool` emptied in every forked child of this process (one hook for all pools)."""
    global _POOLS  # noqa: PLW0603 (one at-fork hook per process, registered on first use)
    if _POOLS is None:
        pools: weakref.WeakSet[LauncherPool] = weakref.WeakSet()

        def after_fork_in_child() -> None:
            for each in list(pools):
                each._after_fork_in_child()

        os.register_at_fork(after_in_child=after_fork_in_child)
        _POOLS = pools
    _POOLS.add(pool)
