"""When a waiting client asks admission whether the broker still knows its call.

A result that comes within a second costs no check; a longer wait asks after its
first quiet second, then every `_LOST_CHECK_EVERY` quiet seconds; after an
outage, at every turn. Against a real Redis: the call is known (a claim), so
every check is one EXISTS and returns False.
"""

from __future__ import annotations

import redis
from celery import Celery

from broker.admission import RedisAdmission
from broker.admission.keys import claim_key
from broker.waiting import _LOST_CHECK_EVERY, ResultWaiter, _LostCheck


def _turns_asked(redis_url: str, turns: int, *, after_outage: bool) -> list[int]:
    admission = RedisAdmission.from_url(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.set(claim_key("call-1"), "worker@host")
    app = Celery("lost-check", broker=redis_url, backend=redis_url, set_as_current=False)
    waiter = ResultWaiter(app, admission, heartbeat_seconds=1.0)
    asked: list[int] = []
    real = admission.call_known
    now = [0]  # the turn being checked

    def call_known(call_id: str) -> bool:
        asked.append(now[0])
        return real(call_id)

    admission.call_known = call_known  # type: ignore[method-assign]  (a spy: it asks Redis)
    check = _LostCheck(waiter, "call-1")
    check.after_outage = after_outage
    try:
        for turn in range(turns):  # turn 0: right after subscribing; turn n: n quiet seconds
            now[0] = turn
            assert check.check() is False
    finally:
        waiter.close()
        client.close()
    return asked


def test_a_quick_result_costs_no_check_and_a_long_wait_is_checked_now_and_then(
    redis_url: str,
) -> None:
    asked = _turns_asked(redis_url, 3 * _LOST_CHECK_EVERY + 1, after_outage=False)
    assert asked == [1, *range(_LOST_CHECK_EVERY, 3 * _LOST_CHECK_EVERY + 1, _LOST_CHECK_EVERY)]


def test_after_an_outage_every_turn_is_checked(redis_url: str) -> None:
    assert _turns_asked(redis_url, 4, after_outage=True) == [0, 1, 2, 3]
