"""redis-py clients of the broker's Redis, direct or through Sentinel.

`redis_client(url, sentinel_master=…)` is the one place admission, workers and
clients build their redis-py client. For `redis://` and `rediss://` URLs it is
`redis.Redis.from_url`; for Celery's `sentinel://h1:26379;sentinel://h2:26379` form
it asks the Sentinels for the master named `sentinel_master`
(`VESSEL_SENTINEL_MASTER`) and follows it across failovers (redis-py's
`Sentinel(...).master_for(...)`). A password in the URL is the master's; the
database is the first part's path (`sentinel://h:26379/0`).

Timeouts: a connection attempt gives up after `CONNECT_TIMEOUT_SECONDS` and a
reply after `REPLY_TIMEOUT_SECONDS`, so a Redis that vanished without closing
its sockets (a failover, a partition) is noticed instead of hanging a worker
thread forever. redis-py's own retries are off: `broker.retrying` retries, with
a bound and one log line per outage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from broker.config import is_sentinel
from broker.errors import ConfigError

if TYPE_CHECKING:
    import redis

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "REPLY_TIMEOUT_SECONDS",
    "redis_client",
    "sentinel_hosts",
]

#: A TCP connect to a live Redis on a LAN takes milliseconds; 5 s covers a
#: loaded host and still notices a dead address quickly.
CONNECT_TIMEOUT_SECONDS = 5.0
#: Admission's scripts take well under a millisecond (O(1) per call, at most
#: 500 dispatched per script); 15 s without a reply means Redis is gone.
REPLY_TIMEOUT_SECONDS = 15.0


def sentinel_hosts(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The (host, port) of each Sentinel in `url`, and the master's connection options."""
    hosts: list[tuple[str, int]] = []
    options: dict[str, Any] = {}
    for part in url.split(";"):
        parts = urlsplit(part.strip())
        hosts.append((parts.hostname or "127.0.0.1", parts.port or 26379))
        if parts.password and "password" not in options:
            options["password"] = unquote(parts.password)
            if parts.username:
                options["username"] = unquote(parts.username)
        path = parts.path.strip("/")
        if path.isdigit() and "db" not in options:
            options["db"] = int(path)
    return hosts, options


def redis_client(
    url: str, *, sentinel_master: str | None = None, decode_responses: bool = True
) -> redis.Redis[Any]:
    """A client of the Redis `url` names (through Sentinel for sentinel:// URLs)."""
    import redis  # noqa: PLC0415 (the embedded default never loads redis-py)
    from redis.backoff import NoBackoff  # noqa: PLC0415
    from redis.retry import Retry  # noqa: PLC0415

    common: dict[str, Any] = {
        "decode_responses": decode_responses,
        "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": REPLY_TIMEOUT_SECONDS,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
    }
    if not is_sentinel(url):
        client: redis.Redis[Any] = redis.Redis.from_url(url, **common)
        return client
    if not sentinel_master:
        raise ConfigError("a sentinel:// URL needs the master's name (VESSEL_SENTINEL_MASTER)")
    hosts, options = sentinel_hosts(url)
    sentinel = redis.Sentinel(
        hosts,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=CONNECT_TIMEOUT_SECONDS,
    )
    master: redis.Redis[Any] = sentinel.master_for(sentinel_master, **common, **options)
    return master
