"""Is the broker's Redis there? One sentence saying what to check when it is not.

The client verbs (`call`, `result`, `cancel`, `status`, ...) ask this first:
without it an unreachable broker shows after kombu's 20 s of retries as a
130-line traceback. One PING with a short timeout tells apart what an operator
fixes differently: nothing listening, a password missing or wrong, a database
number the server does not have, TLS on one side only.
"""

from __future__ import annotations

from broker.config import Settings, hide_password
from broker.errors import BrokerUnavailable

__all__ = ["CONNECT_TIMEOUT_SECONDS", "check_reachable", "check_redis"]

#: How long one connection attempt may take: a Redis on a reachable host answers
#: in milliseconds; a firewalled one would otherwise hang the command.
CONNECT_TIMEOUT_SECONDS = 3.0


def check_reachable(settings: Settings) -> None:
    """Raise BrokerUnavailable unless the broker's Redis (and a separate result
    backend's) answers a PING. Nothing to check for the embedded default."""
    if settings.broker_url is None:
        return
    check_redis(settings.broker_url, "broker Redis", "VESSEL_BROKER_URL")
    backend = settings.backend_url
    if backend is not None and backend != settings.broker_url and backend.startswith("redis"):
        check_redis(backend, "result backend", "VESSEL_RESULT_BACKEND")


def check_redis(url: str, what: str, variable: str) -> None:
    """PING the Redis at `url`; BrokerUnavailable with one sentence if it fails."""
    import redis  # noqa: PLC0415 (the embedded default never loads redis-py)

    shown = hide_password(url)
    try:
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
            socket_timeout=CONNECT_TIMEOUT_SECONDS,
            retry_on_timeout=False,
        )
    except ValueError as exc:  # a URL redis-py cannot read
        raise BrokerUnavailable(f"{variable} {shown} is not a Redis URL: {exc}") from None
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise BrokerUnavailable(_auth(what, shown, variable, str(exc))) from None
    except redis.ResponseError as exc:
        raise BrokerUnavailable(_response(what, shown, variable, str(exc))) from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise BrokerUnavailable(_connection(what, shown, variable, url, str(exc))) from None
    finally:
        client.close()


def _auth(what: str, shown: str, variable: str, said: str) -> str:
    lowered = said.lower()
    # Redis 6+ answers redis-py's HELLO without credentials with "HELLO must be
    # called with the client already authenticated"; older ones with NOAUTH.
    if "required" in lowered or "hello must be called" in lowered or "noauth" in lowered:
        return (
            f"the {what} at {shown} requires a password: put it in {variable} "
            "(redis://:PASSWORD@HOST:PORT/DB)"
        )
    return (
        f"the {what} at {shown} refused the password or user name ({said}): "
        f"check the credentials in {variable}"
    )


def _response(what: str, shown: str, variable: str, said: str) -> str:
    lowered = said.lower()
    if "noauth" in lowered or "authentication required" in lowered:
        return _auth(what, shown, variable, "authentication required")
    if "db index" in lowered or "invalid db" in lowered:
        return (
            f"the {what} at {shown} has no such database ({said}): use a database number "
            f"the server has (0 to its `databases` setting minus 1) in {variable}"
        )
    return f"the {what} at {shown} refused the connection ({said}): check {variable}"


def _connection(what: str, shown: str, variable: str, url: str, said: str) -> str:
    lowered = said.lower()
    tls = url.startswith("rediss://")
    if "ssl" in lowered or "tls" in lowered or "wrong version number" in lowered:
        hint = (
            "use redis:// if that Redis does not speak TLS"
            if tls
            else "use rediss:// if that Redis speaks TLS"
        )
        return f"cannot reach the {what} at {shown}: the TLS handshake failed ({said}): {hint}"
    if tls and "timeout" in lowered:
        return (
            f"cannot reach the {what} at {shown}: no TLS answer within "
            f"{CONNECT_TIMEOUT_SECONDS:g} s ({said}): use redis:// in {variable} "
            "if that Redis does not speak TLS"
        )
    if not tls and ("closed by server" in lowered or "reset by peer" in lowered):
        return (
            f"cannot reach the {what} at {shown}: the server closed the connection ({said}): "
            f"if that Redis speaks TLS, use rediss:// in {variable}"
        )
    return (
        f"cannot reach the {what} at {shown} ({said}): check that Redis runs there "
        f"and that {variable} names it"
    )
