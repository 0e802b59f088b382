"""What a worker's start-up banner says: what applies to `vessel-workers worker`.

Celery's banner is written for the `celery worker` command: a root worker is
told to use `--uid`, and task events OFF come with "enable -E", neither of which
`vessel-workers worker` takes. Its `[config]` section stays (app, transport,
results, concurrency, queues); what changes:

- `task events`: what VESSEL_TASK_EVENTS says (on request: Flower turns them on
  when it connects; `always`: from the start);
- a `[vessel]` section: the worker kind, the confinement probe's result and the
  cgroup mode in force (sandbox), the host id, and for a root worker what holds
  instead of `--uid`;
- Celery's "running with superuser privileges ... use --uid" warning is not
  shown (the `[vessel]` section says what applies).

The same lines are logged at INFO once the worker is ready: the cgroup line
logged while the executor is built comes before Celery sets up logging and is
lost at INFO.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

from celery import Celery
from celery.exceptions import SecurityWarning

__all__ = ["startup_lines", "worker_class"]

_log = logging.getLogger(__name__)

_CELERY_EVENTS_OFF = "OFF (enable -E to monitor tasks in this worker)"


def startup_lines(
    *,
    kind: str,
    task_events: str,
    cgroup_mode: str | None,
    host_id: str | None,
    network_mode: str | None = None,
    standby_mode: str | None = None,
) -> list[str]:
    """The `[vessel]` lines of the banner, e.g. `cgroups: per-call (pids) via slot launchers`."""
    lines = [f"kind:        {kind}"]
    if kind == "sandbox":
        lines.append("confinement: checked at start: bubblewrap + seccomp + rlimits work here")
        lines.append(f"cgroups:     {cgroup_mode or 'unknown'} (VESSEL_SANDBOX_CGROUPS)")
        lines.append(f"network:     {network_mode or 'unknown'} (VESSEL_SANDBOX_NETWORK)")
        lines.append(f"standby:     {standby_mode or 'unknown'} (VESSEL_SANDBOX_STANDBY)")
    if host_id is not None:
        lines.append(f"host id:     {host_id} (VESSEL_HOST_ID; its home lanes end @{host_id})")
    events = (
        "ON from the start (VESSEL_TASK_EVENTS=always)"
        if task_events == "always"
        else "on request: sent once a monitor (Flower) asks; VESSEL_TASK_EVENTS=always sends "
        "them from the start"
    )
    lines.append(f"task events: {events}")
    if os.geteuid() == 0:
        lines.append(
            "privileges:  running as root, which the sandbox allows: confined tools run in a "
            "user namespace with every capability dropped (docs/limits.md says what else holds)"
            if kind == "sandbox"
            else "privileges:  running as root, not needed by a service worker: run it as an "
            "ordinary user"
        )
    return lines


def worker_class(app: Celery, lines: Sequence[str]) -> Any:
    """`app.Worker` with the banner above."""
    base: Any = app.Worker

    class VesselWorker(base):  # type: ignore[misc]
        def on_before_init(self, *args: Any, **kwargs: Any) -> None:
            with warnings.catch_warnings():
                # Celery's advice is --uid, which this command has not: the
                # [vessel] section says what applies instead.
                warnings.filterwarnings("ignore", category=SecurityWarning)
                super().on_before_init(*args, **kwargs)

        def startup_info(self, artlines: bool = True) -> str:
            text = str(super().startup_info(artlines=artlines))
            events = "on request" if not self.task_events else "ON"
            text = text.replace(_CELERY_EVENTS_OFF, f"{events} (see [vessel] below)")
            # Here, not in extra_info: Celery shows that only at INFO and below.
            return text + "\n[vessel]\n" + "\n".join(f".> {line}" for line in lines) + "\n"

        def on_consumer_ready(self, consumer: Any) -> None:
            super().on_consumer_ready(consumer)
            for line in lines:
                _log.info("vessel: %s", " ".join(line.split()))

    return VesselWorker
