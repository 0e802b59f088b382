"""The thread receiving the cancel channel (`RedisAdmission.listen_cancels`).

Every worker subscribes to `vessel:cancel` (`broker.admission.keys.CANCEL_CHANNEL`):
a call id there is a call to stop where it runs, `end-turn:<turn>` a turn whose
workspaces go. The handler runs on this thread; a failing one is logged, and
the listener goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.admission.keys import CANCEL_CHANNEL

if TYPE_CHECKING:
    import redis

__all__ = ["CancelListener"]

_log = logging.getLogger(__name__)


class CancelListener:
    """A thread receiving call ids on the cancel channel."""

    def __init__(self, client: redis.Redis[str], on_cancel: Callable[[str], None]) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(CANCEL_CHANNEL)
        self._on_cancel = on_cancel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vessel-cancel", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import redis  # noqa: PLC0415 (only with a Redis broker)

        while not self._stop.is_set():
            try:
                message = self._pubsub.get_message(timeout=0.5)
            except (redis.ConnectionError, redis.TimeoutError, ValueError):
                if self._stop.wait(0.5):
                    return
                continue
            if message and message.get("type") == "message":
                try:
                    self._on_cancel(str(message["data"]))
                except Exception:  # the listener must outlive a failing handler
                    _log.exception("cancel channel: handling %r failed", message["data"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._pubsub.close()
