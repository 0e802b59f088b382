"""A worker's housekeeping thread: heartbeat, recovery sweep, workspace sweep.

The heartbeat registers this worker's capacity on its lanes (admission sizes
each lane's window from it) and, after a broker outage, reasserts the claims
of the calls running here; the recovery sweep answers the calls of dead
workers; the workspace sweep (sandbox) removes expired workspaces and kills the
standby sandboxes no call took (`workers/sandbox/standby.py`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.admission import RedisAdmission
from broker.admission.publish import publish
from broker.celery_app import longest_timeout
from broker.errors import BrokerUnavailable
from broker.protocol import (
    RESULT_STATE,
    CallRequest,
    ToolResult,
    store_result,
    worker_stopped_text,
)
from workers.outage import OutageExit
from workers.tasks import CallRuntime

if TYPE_CHECKING:
    from workers.sandbox.workspace import WorkspaceStore

__all__ = ["Housekeeper"]

_log = logging.getLogger(__name__)

#: How often the sandbox workspace TTL sweep runs, in seconds.
_WORKSPACE_SWEEP_SECONDS = 60.0
#: After an outage, the recovery sweep waits this long: calls that finished
#: during it store their held results first (they retry at least every
#: second), instead of racing a redelivery of their expired leases.
_SWEEP_PAUSE_AFTER_OUTAGE_SECONDS = 3.0


class Housekeeper:
    """One thread: heartbeat, recovery sweep and workspace sweep, on their periods."""

    def __init__(
        self,
        runtime: CallRuntime,
        lanes: dict[str, int],
        workspaces: WorkspaceStore | None,
        exit_: OutageExit | None = None,
        *,
        report: Callable[[int], None] | None = None,
    ) -> None:
        self._runtime = runtime
        self._lanes = lanes
        self._workspaces = workspaces
        self._exit = exit_ or OutageExit()
        #: Outages seen ended (`beat` reasserts running calls' claims after each).
        self._seen = 0
        # The longest lease: a reasserted claim outlives any call running here.
        longest = longest_timeout(runtime.deployment) + runtime.settings.lease_grace_seconds
        self._claim_ttl_ms = int(longest * 1000)
        #: Called with the heartbeat TTL at each beat (the failed self-test's report).
        self._report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vessel-housekeeper", daemon=True)

    def _ttl_ms(self) -> int:
        return int(self._runtime.settings.heartbeat_seconds * 3000)

    def beat(self, lanes: dict[str, int] | None = None) -> None:
        rt = self._runtime
        if self._report is not None and lanes is None:
            self._report(self._ttl_ms())
        dispatched = rt.admission.heartbeat(
            rt.kind, rt.hostname, lanes or self._lanes, self._ttl_ms()
        )
        publish(rt.app, dispatched)
        admission = rt.admission
        if isinstance(admission, RedisAdmission) and admission.outage.recoveries != self._seen:
            # The first beat after an outage: Redis may have come back empty.
            self._seen = admission.outage.recoveries
            admission.reassert_claims(rt.running_ids(), rt.hostname, self._claim_ttl_ms)

    def sweep(self) -> None:
        rt = self._runtime
        admission = rt.admission
        if isinstance(admission, RedisAdmission):
            recovered = admission.outage.since_recovery()
            if recovered is not None and recovered < _SWEEP_PAUSE_AFTER_OUTAGE_SECONDS:
                return  # held results land first (see the constant)
        dispatched, finished = rt.admission.recover(rt.kind)
        for call_id, message in finished:
            _answer_lost(rt, call_id, message)
        publish(rt.app, dispatched)

    def drop_idle_standbys(self) -> None:
        """Kill the sandboxes started ahead that no call took (`standby.py`): sandbox."""
        sandbox = self._runtime.executor.sandbox
        if sandbox is not None:
            dropped = sandbox.drop_idle_standbys()
            if dropped:
                _log.debug("sandbox: %d standby sandbox(es) killed unused (idle)", dropped)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def _loop(self) -> None:
        settings = self._runtime.settings
        tick = min(settings.heartbeat_seconds, settings.sweep_seconds)
        clock = {"beat": 0.0, "sweep": 0.0, "workspaces": 0.0}
        while not self._stop.wait(tick):
            clock = {k: v + tick for k, v in clock.items()}
            try:
                if clock["beat"] >= settings.heartbeat_seconds:
                    clock["beat"] = 0.0
                    self.beat()
                if clock["sweep"] >= settings.sweep_seconds:
                    clock["sweep"] = 0.0
                    self.sweep()
                if clock["workspaces"] >= _WORKSPACE_SWEEP_SECONDS and self._workspaces:
                    clock["workspaces"] = 0.0
                    self._workspaces.sweep()
                    self.drop_idle_standbys()
            except BrokerUnavailable as exc:
                # Admission rode out the outage for the whole limit: stop.
                self._exit.stop(exc, settings.broker_outage_seconds)
            except Exception as exc:  # the thread must outlive any one failure
                _log.warning("housekeeping failed, will retry: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        admission = self._runtime.admission
        if isinstance(admission, RedisAdmission):
            if admission.outage.down_for() is not None:
                _log.warning(
                    "could not leave the lanes (the broker is unreachable): this worker's "
                    "capacity expires with its last heartbeat"
                )
                return
            admission.patience = 0.0  # shutting down: no waiting for an outage now
        try:
            self.beat({lane: 0 for lane in self._lanes})
        except Exception as exc:  # shutting down: say so and go on
            _log.warning("could not leave the lanes: %s", exc)


def _answer_lost(runtime: CallRuntime, call_id: str, message: str) -> None:
    """A call was marked done but its worker died before releasing it.

    Nearly always its result was stored just before; if not (the worker died
    between the two writes), the call is not run again, since it may have had
    its effect, and the platform gets an error result saying so.
    """
    backend = runtime.app.backend
    if backend.get_task_meta(call_id).get("status") == RESULT_STATE or not message:
        return
    request = CallRequest.from_message(json.loads(message))
    _log.warning("call %s: its worker stopped before storing the result", call_id)
    text = worker_stopped_text(request.tool)
    store_result(backend, ToolResult.error(request, text, outcome="killed"))
