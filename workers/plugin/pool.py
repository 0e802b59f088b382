"""The warm runtime processes of each plugin: taken for a call, given back, replaced.

A process serves one call at a time; the pool of each plugin grows to the
number of calls at once and keeps at least one process warm. A process a call
left unhealthy (a limit hit, the protocol broken) is killed and replaced off
the call's path.

Every runtime process is spawned by one long-lived thread (`Spawner`), since
bwrap's --die-with-parent fires when the spawning thread ends.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from broker.model import Plugin
from workers.plugin.confine import Confinement
from workers.plugin.process import RuntimeProcess

__all__ = ["RuntimePool", "Slots", "Spawner"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class Spawner:
    """One long-lived thread that starts every runtime process (see the module docstring)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = (
            queue.Queue()
        )
        self._thread = threading.Thread(
            target=self._loop, name="vessel-plugin-spawner", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)

    def submit(self, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)


@dataclass(slots=True)
class Slots:
    """The runtime processes of one plugin: the idle ones, and how to start one."""

    plugin: Plugin
    confinement: Confinement
    config: dict[str, Any]
    idle: list[RuntimeProcess]
    warming: int = 0


class RuntimePool:
    """The slots of every plugin of one runner. Thread-safe."""

    def __init__(self, spawner: Spawner) -> None:
        self.spawner = spawner
        self.slots: dict[str, Slots] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _spawn(self, slots: Slots) -> concurrent.futures.Future[RuntimeProcess]:
        return self.spawner.submit(lambda: RuntimeProcess.start(slots.confinement, slots.config))

    def warm_up(self, slots: Slots) -> None:
        """Start one process for `slots` off the caller's path, unless one is idle or coming."""
        with self._lock:
            if self._closed or slots.idle or slots.warming:
                return
            slots.warming += 1

        def started(future: concurrent.futures.Future[RuntimeProcess]) -> None:
            with self._lock:
                slots.warming -= 1
                if future.exception() is not None:
                    _log.warning(
                        "plugin %s: a runtime did not start: %s",
                        slots.plugin.slug,
                        future.exception(),
                    )
                    return
                process = future.result()
                if not self._closed:
                    slots.idle.append(process)
                    return
            process.kill()

        self._spawn(slots).add_done_callback(started)

    def take(self, slots: Slots) -> RuntimeProcess:
        """An idle live process of `slots`, or a new one (OSError if it cannot start)."""
        with self._lock:
            while slots.idle:
                process = slots.idle.pop()
                if process.alive():
                    return process
                process.kill()
        return self._spawn(slots).result()

    def give(self, slots: Slots, process: RuntimeProcess, *, healthy: bool) -> None:
        """Back to the idle list, or killed and replaced (off the caller's path)."""
        if healthy and process.alive():
            with self._lock:
                if not self._closed:
                    slots.idle.append(process)
                    return
        process.kill()
        self.warm_up(slots)

    def close(self) -> None:
        """Kill every idle process; no process is kept after this (idempotent)."""
        with self._lock:
            self._closed = True
            idle = [p for s in self.slots.values() for p in s.idle]
            for each in self.slots.values():
                each.idle.clear()
        for process in idle:
            process.kill()
        self.spawner.close()
