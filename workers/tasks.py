"""The Celery tasks: thin wrappers around `run_call`, one task per worker kind.

`run_call` is the life of one delivery of a call's message:

1. claim the call (admission): if a result exists or a live worker holds it,
   return at once (the message is acked; a duplicate never runs the tool);
   if it was cancelled before it started, its result is `[cancelled]`;
   a call that follows its turn (`claim_at_home`, sandbox workers) runs only at
   the turn's home host: elsewhere it is `moved` to the home lane; a host that
   takes a turn whose home died empties its folder of the turn first, and the
   result says `workspace_lost` with a note before the output;
2. run it with `Executor.run`, with a cancel event the worker's cancel listener
   sets (the runner kills the process tree) and a watchdog that sets it too if
   the call outlives its lease: Celery's own time limits do not work on the
   threads pool and a hard limit would leave the tool's processes running;
3. store the result unless one exists, and release the slot (`finish_call`:
   one script when the result backend is admission's Redis, the default);
4. publish what admission dispatches next;
5. count it (`workers.metrics.observe`).

Tasks use `ignore_result=True` because they store their result themselves,
once: Celery's automatic store would let a later delivery overwrite it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery import Celery

from broker.admission import Admission, Claim
from broker.admission.finish import finish_call, results_in_admission
from broker.admission.publish import publish
from broker.config import Settings
from broker.constants import DEFAULT_TOOL_TIMEOUT_SECONDS
from broker.errors import VesselError
from broker.model import Deployment
from broker.protocol import CallRequest, ToolResult, cancelled_result, worker_failed_text
from broker.queues import TASK_NAMES, WORKSPACE_KINDS, Kind
from workers import metrics
from workers.execute import Executor
from workers.output import with_workspace_lost

if TYPE_CHECKING:
    from workers.sandbox.workspace import WorkspaceStore

__all__ = ["CallRuntime", "register_tasks", "run_call"]

_log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _Running:
    event: threading.Event = field(default_factory=threading.Event)
    #: True when the platform cancelled the call (not the watchdog).
    cancelled: bool = False


class _Watchdog:
    """One thread setting events at their deadlines (instead of a Timer per call).

    `watch` returns an entry that `unwatch` disarms; disarmed entries stay in
    the heap until they come up, or until they are most of it (then it is
    rebuilt). The thread starts on the first `watch` and ends after
    `_IDLE_SECONDS` with nothing to watch.
    """

    _IDLE_SECONDS = 10.0

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[list[Any]] = []
        self._disarmed = 0
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, seconds: float, event: threading.Event) -> list[Any]:
        entry: list[Any] = [time.monotonic() + seconds, next(self._order), event]
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="vessel-watchdog", daemon=True
                )
                self._thread.start()
            elif self._heap[0] is entry:
                self._cond.notify()
        return entry

    def unwatch(self, entry: list[Any]) -> None:
        with self._cond:
            if entry[2] is None:
                return
            entry[2] = None
            self._disarmed += 1
            if self._disarmed > 64 and self._disarmed * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._disarmed = 0

    def _loop(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)
                    self._disarmed -= 1
                if not self._heap:
                    self._cond.wait(self._IDLE_SECONDS)
                    if not self._heap:
                        self._thread = None
                        return
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                entry = heapq.heappop(self._heap)
                event, entry[2] = entry[2], None  # fired: `unwatch` has nothing to do
                event.set()


@dataclass(kw_only=True)
class CallRuntime:
    """What one worker process needs to run calls of one kind."""

    app: Celery
    admission: Admission
    executor: Executor
    deployment: Deployment
    kind: Kind
    hostname: str
    settings: Settings
    #: The host (`VESSEL_HOST_ID`) and its workspaces, for turn affinity
    #: (sandbox workers); None: calls run wherever they arrive.
    host_id: str | None = None
    workspaces: WorkspaceStore | None = None
    #: Call id -> its deliveries running here (nearly always one).
    _running: dict[str, list[_Running]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _leases: dict[tuple[str, str], float] = field(default_factory=dict)
    _watchdog: _Watchdog = field(default_factory=_Watchdog)

    def __post_init__(self) -> None:
        self.result_ttl = int(self.settings.result_expires_seconds)
        self.results_in_admission = results_in_admission(self.app, self.admission)

    def _home_of(self, request: CallRequest) -> tuple[str, str, WorkspaceStore] | None:
        """The turn, this host and its workspaces if the call must run at its turn's
        home (see `claim`); None: it runs wherever it arrives."""
        if request.turn is None or self.host_id is None or self.workspaces is None:
            return None
        if self.kind not in WORKSPACE_KINDS:
            return None
        return request.turn, self.host_id, self.workspaces

    def has_turn(self, agent: str, turn: str) -> bool:
        """True if the turn's folder is on this host."""
        if self.workspaces is None:
            return False
        try:
            return self.workspaces.has_turn(agent, turn)
        except (OSError, ValueError):
            return False

    def forget_turn(self, agent: str, turn: str) -> None:
        """Empty this host's folder of a turn it takes over (an older stay's leftovers)."""
        if self.workspaces is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self.workspaces.end_turn(agent, turn)

    def claim(self, request: CallRequest, lease: float) -> Claim:
        """Admission's claim; with turn affinity, at the turn's home only."""
        lease_ms = int(lease * 1000)
        home = self._home_of(request)
        if home is None:
            return Claim(outcome=self.admission.claim(request.call_id, self.hostname, lease_ms))
        turn, host_id, workspaces = home
        found = self.admission.claim_at_home(
            request.call_id,
            self.hostname,
            lease_ms,
            host_id=host_id,
            home_ttl_seconds=int(workspaces.ttl_seconds),
            here=self.has_turn(request.agent, turn),
        )
        if found.rehomed:
            _log.warning(
                "call %s: turn %.100r of %s lost its home; it lives here now, workspace empty",
                request.call_id,
                turn,
                request.agent,
            )
            self.forget_turn(request.agent, turn)
        return found

    def lease_seconds(self, request: CallRequest) -> float:
        """The tool's time limit plus grace (the default limit for an unknown tool)."""
        key = (request.agent, request.tool)
        lease = self._leases.get(key)
        if lease is None:
            try:
                limit = self.deployment.agent(request.agent).tool(request.tool).timeout_seconds
            except VesselError:
                limit = DEFAULT_TOOL_TIMEOUT_SECONDS
            lease = limit + self.settings.lease_grace_seconds
            if len(self._leases) < 100_000:  # unknown tools come from messages
                self._leases[key] = lease
        return lease

    def on_cancel(self, call_id: str) -> None:
        """Called by the cancel listener: stop the call if it runs here."""
        with self._lock:
            for running in self._running.get(call_id, ()):
                running.cancelled = True
                running.event.set()

    def running_ids(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def _start(self, call_id: str) -> _Running:
        running = _Running()
        with self._lock:
            self._running.setdefault(call_id, []).append(running)
        return running

    def _end(self, call_id: str, running: _Running) -> None:
        with self._lock:
            deliveries = self._running.get(call_id)
            if deliveries is None:
                return
            if running in deliveries:
                deliveries.remove(running)
            if not deliveries:
                del self._running[call_id]


def _execute(
    runtime: CallRuntime, request: CallRequest, running: _Running, lease: float
) -> ToolResult:
    # The runner kills at the tool's limit; this only fires if it did not: before
    # the lease ends (so the call is not handed to another worker meanwhile), but
    # never at the limit itself, where it would race the runner's own timeout and
    # turn a timeout into a cancel (a grace of 1 s left no room at all).
    margin = min(1.0, runtime.settings.lease_grace_seconds / 2)
    watch = runtime._watchdog.watch(max(lease - margin, 1.0), running.event)
    started = time.monotonic()
    try:
        result = runtime.executor.run(request, running.event)
    except Exception:  # Executor.run never raises; if it did, the call must still end
        _log.exception("call %s: the executor failed", request.call_id)
        result = ToolResult.error(
            request,
            worker_failed_text(request.tool),
            duration_ms=(time.monotonic() - started) * 1000,
        )
    finally:
        runtime._watchdog.unwatch(watch)
    if running.cancelled and result.outcome != "ok":
        return cancelled_result(request, duration_ms=(time.monotonic() - started) * 1000)
    return result


def run_call(runtime: CallRuntime, message: dict[str, Any]) -> str:
    """Handle one delivery of a call's message; returns what happened (for logs)."""
    try:
        request = CallRequest.from_message(message)
    except (KeyError, TypeError, ValueError, AttributeError):
        # Not a message our client wrote: nothing to run and no call id to answer.
        _log.error("dropped a malformed call message: %.200r", message)
        return "malformed"
    lease = runtime.lease_seconds(request)
    # Registered before the claim, which checks the cancel flag atomically: a
    # cancel before the claim makes it "cancelled", one after it finds the
    # call registered here when its message reaches the cancel listener.
    running = runtime._start(request.call_id)
    try:
        claim = runtime.claim(request, lease)
        if claim.outcome in ("done", "busy"):
            _log.info("call %s: %s elsewhere, not run again", request.call_id, claim.outcome)
            return claim.outcome
        if claim.outcome == "moved":
            # Its turn lives on another host: admission put it in that host's lane.
            _log.info("call %s: its turn's home is another host, moved there", request.call_id)
            publish(runtime.app, claim.dispatched)
            return "moved"
        if claim.outcome == "cancelled":
            result = cancelled_result(request)
        else:
            # No STARTED write to the backend: Flower sees task-started events,
            # and the write would cost every call a round trip for no reader.
            result = _execute(runtime, request, running, lease)
        if claim.workspace_lost:
            result = dataclasses.replace(
                result, workspace_lost=True, output=with_workspace_lost(result.output)
            )
    finally:
        runtime._end(request.call_id, running)
    stored, dispatched = finish_call(
        runtime.app,
        runtime.admission,
        result,
        hostname=runtime.hostname,
        ttl_seconds=runtime.result_ttl,
        in_one_script=runtime.results_in_admission,
    )
    publish(runtime.app, dispatched)
    if stored:
        metrics.observe(result, runtime.kind)
    return result.outcome if stored else "duplicate"


def register_tasks(app: Celery, runtime: CallRuntime) -> None:
    """Register the task of `runtime.kind` on `app`, bound to `runtime`."""

    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_NAMES[runtime.kind],
        ignore_result=True,
        # This app's alone: Celery's default (shared) would add it, bound to this
        # runtime, to every app finalized later in the process.
        shared=False,
        acks_late=True,
        reject_on_worker_lost=True,
        typing=False,
    )
    def vessel_call(message: dict[str, Any]) -> str:
        return run_call(runtime, message)

    del vessel_call
