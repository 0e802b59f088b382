"""Broker settings, read from the environment once and frozen.

    VESSEL_BROKER_URL              redis://… of the broker (or sentinel://host:port;sentinel://…
                                   with VESSEL_SENTINEL_MASTER); unset: the embedded default
    VESSEL_SENTINEL_MASTER         the master's name Sentinel knows (sentinel:// URLs only)
    VESSEL_BROKER_OUTAGE_SECONDS   how long a worker waits for an unreachable broker, at
                                   start and during an outage, before it exits (300)
    VESSEL_RESULT_BACKEND          where results go (default: the broker URL)
    VESSEL_LEASE_GRACE_SECONDS     a call's lease is its tool's time limit + this (30)
    VESSEL_VISIBILITY_TIMEOUT      seconds before Redis re-delivers an unacked message
                                   (default: the longest tool time limit + 2 x grace)
    VESSEL_HEARTBEAT_SECONDS       how often a worker re-registers its capacity (2)
    VESSEL_SWEEP_SECONDS           how often a worker re-queues expired leases (2)
    VESSEL_RESULT_EXPIRES          seconds a result (and the call's records) are kept (86400)
    VESSEL_TASK_EVENTS             `on-request` (default): workers send Celery task events
                                   while a monitor asks for them (Flower does, every 5 s);
                                   `always`: from the start, and clients send task-sent events
    VESSEL_FAST_PATH               `on` (default): admission pushes each call's prepared Celery
                                   message into its lane itself, when this kombu/Celery allow it
                                   (broker/fast_path.py); `off`: every call is published with
                                   Celery's `send_task`, and kombu's own Redis transport is used

The two URLs may carry a password; `repr` and `str` never show it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, urlsplit, urlunsplit

from broker.constants import ENV_BROKER_URL, ENV_RESULT_BACKEND
from broker.errors import ConfigError

__all__ = [
    "DEFAULT_BROKER_OUTAGE_SECONDS",
    "DEFAULT_HEARTBEAT_SECONDS",
    "DEFAULT_LEASE_GRACE_SECONDS",
    "DEFAULT_RESULT_EXPIRES_SECONDS",
    "DEFAULT_SWEEP_SECONDS",
    "ENV_BROKER_OUTAGE_SECONDS",
    "ENV_FAST_PATH",
    "ENV_HEARTBEAT_SECONDS",
    "ENV_LEASE_GRACE_SECONDS",
    "ENV_RESULT_EXPIRES",
    "ENV_SENTINEL_MASTER",
    "ENV_SWEEP_SECONDS",
    "ENV_TASK_EVENTS",
    "ENV_VISIBILITY_TIMEOUT",
    "TASK_EVENT_MODES",
    "Settings",
    "TaskEvents",
    "hide_password",
    "is_plain_redis",
    "is_sentinel",
    "is_tls_redis",
]

ENV_LEASE_GRACE_SECONDS = "VESSEL_LEASE_GRACE_SECONDS"
ENV_VISIBILITY_TIMEOUT = "VESSEL_VISIBILITY_TIMEOUT"
ENV_HEARTBEAT_SECONDS = "VESSEL_HEARTBEAT_SECONDS"
ENV_SWEEP_SECONDS = "VESSEL_SWEEP_SECONDS"
ENV_RESULT_EXPIRES = "VESSEL_RESULT_EXPIRES"
ENV_TASK_EVENTS = "VESSEL_TASK_EVENTS"
ENV_BROKER_OUTAGE_SECONDS = "VESSEL_BROKER_OUTAGE_SECONDS"
ENV_SENTINEL_MASTER = "VESSEL_SENTINEL_MASTER"
ENV_FAST_PATH = "VESSEL_FAST_PATH"

TaskEvents = Literal["on-request", "always"]
#: `on-request` is Celery's own default (a worker sends events once a monitor
#: runs `enable_events`); every event is a publish to the broker, four per call.
TASK_EVENT_MODES: tuple[TaskEvents, ...] = ("on-request", "always")

#: Time a call may overrun its tool's limit (kill, outbox, result write) before
#: its slot is taken back and the call given to another worker.
DEFAULT_LEASE_GRACE_SECONDS = 30.0
#: A worker missing three heartbeats no longer counts towards a lane's window.
DEFAULT_HEARTBEAT_SECONDS = 2.0
#: Expired leases are noticed within this (plus the lease itself).
DEFAULT_SWEEP_SECONDS = 2.0
#: A platform reads a result within a day or never.
DEFAULT_RESULT_EXPIRES_SECONDS = 86_400
#: A Redis restart, an upgrade or a Sentinel failover takes seconds to a
#: minute; five minutes without a broker is an outage an operator must see
#: (the worker exits, its supervisor restarts it and says so).
DEFAULT_BROKER_OUTAGE_SECONDS = 300.0

_REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel"})


def is_plain_redis(url: str | None) -> bool:
    """True for a `redis://` URL: not `rediss://` or `sentinel://`."""
    return _scheme(url) == "redis"


def is_tls_redis(url: str | None) -> bool:
    """True for a `rediss://` URL."""
    return _scheme(url) == "rediss"


def _scheme(url: str | None) -> str:
    return str(url).split("://", 1)[0].lower() if url else ""


def _url_problem(name: str, url: str) -> str | None:
    """What is wrong with `url` as the Redis of `name`, or None."""
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme == "unix":
        return (
            f"{name}={hide_password(url)!r}: Redis over a Unix socket is not supported "
            "(kombu, which carries Celery's messages, takes no unix:// URL): use "
            "redis://HOST:PORT, or rediss://HOST:PORT for TLS."
        )
    if scheme not in _REDIS_SCHEMES:
        shown = hide_password(url)
        return f"{name} must be a redis://, rediss:// or sentinel:// URL, not {shown!r}."
    if scheme == "rediss" and "ssl_cert_reqs" not in parse_qs(parts.query):
        # kombu would default to no certificate check (CERT_NONE) and Celery's result
        # backend refuses it: the choice is the operator's, said in the URL.
        return (
            f"{name}={hide_password(url)!r}: a rediss:// URL must say how the server's "
            "certificate is checked: add ?ssl_cert_reqs=required (with &ssl_ca_certs=PATH "
            "when a private CA signed it), or ?ssl_cert_reqs=none to skip the check."
        )
    return None


def is_sentinel(url: str) -> bool:
    """True for Celery's `sentinel://host:port;sentinel://host:port` form."""
    return urlsplit(url.split(";", 1)[0]).scheme == "sentinel"


def hide_password(url: str) -> str:
    """`url` with any password replaced by `***` (for logs, `repr`, messages)."""
    if ";" in url:  # sentinel://a;sentinel://b: each part may carry one
        return ";".join(hide_password(part) for part in url.split(";"))
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _number(environ: Mapping[str, str], name: str, default: float | None) -> float | None:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {text!r}.") from None
    if value <= 0:
        raise ConfigError(f"{name} must be greater than zero, not {text!r}.")
    return value


def _switch(environ: Mapping[str, str], name: str, default: bool) -> bool:
    text = environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("on", "1", "true", "yes"):
        return True
    if text in ("off", "0", "false", "no"):
        return False
    raise ConfigError(f"{name} must be `on` or `off`, not {text!r}.")


def _task_events(environ: Mapping[str, str]) -> TaskEvents:
    text = environ.get(ENV_TASK_EVENTS, "").strip() or "on-request"
    for mode in TASK_EVENT_MODES:
        if text == mode:
            return mode
    raise ConfigError(
        f"{ENV_TASK_EVENTS} must be one of {', '.join(TASK_EVENT_MODES)}, not {text!r}."
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """Where the broker and results live, and the timings of leases and heartbeats."""

    #: None: the embedded default (in-process broker, results and worker).
    broker_url: str | None = None
    result_backend: str | None = None
    lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS
    #: None: derived from the deployment's longest tool time limit.
    visibility_timeout_seconds: float | None = None
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    sweep_seconds: float = DEFAULT_SWEEP_SECONDS
    result_expires_seconds: float = DEFAULT_RESULT_EXPIRES_SECONDS
    task_events: TaskEvents = "on-request"
    broker_outage_seconds: float = DEFAULT_BROKER_OUTAGE_SECONDS
    #: The master's name for sentinel:// URLs (VESSEL_SENTINEL_MASTER).
    sentinel_master: str | None = None
    #: False: never the fast path (broker/fast_path.py), whatever kombu allows.
    fast_path: bool = True

    def __post_init__(self) -> None:
        if self.task_events not in TASK_EVENT_MODES:
            raise ConfigError(
                f"{ENV_TASK_EVENTS} must be one of {', '.join(TASK_EVENT_MODES)}, "
                f"not {self.task_events!r}."
            )
        for name, url in (
            (ENV_BROKER_URL, self.broker_url),
            (ENV_RESULT_BACKEND, self.result_backend),
        ):
            problem = _url_problem(name, url) if url is not None else None
            if problem is not None:
                raise ConfigError(problem)
            if url is not None and is_sentinel(url) and not self.sentinel_master:
                raise ConfigError(
                    f"{name} is a sentinel:// URL but {ENV_SENTINEL_MASTER} is not set: "
                    "set it to the master's name in sentinel.conf (`sentinel monitor NAME ...`)."
                )
        if self.result_backend is not None and self.broker_url is None:
            raise ConfigError(
                f"{ENV_RESULT_BACKEND} is set but {ENV_BROKER_URL} is not: set both, "
                "or neither for the embedded default."
            )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        broker = env.get(ENV_BROKER_URL, "").strip() or None
        backend = env.get(ENV_RESULT_BACKEND, "").strip() or None
        return cls(
            broker_url=broker,
            result_backend=backend,
            lease_grace_seconds=_number(env, ENV_LEASE_GRACE_SECONDS, DEFAULT_LEASE_GRACE_SECONDS)
            or DEFAULT_LEASE_GRACE_SECONDS,
            visibility_timeout_seconds=_number(env, ENV_VISIBILITY_TIMEOUT, None),
            heartbeat_seconds=_number(env, ENV_HEARTBEAT_SECONDS, DEFAULT_HEARTBEAT_SECONDS)
            or DEFAULT_HEARTBEAT_SECONDS,
            sweep_seconds=_number(env, ENV_SWEEP_SECONDS, DEFAULT_SWEEP_SECONDS)
            or DEFAULT_SWEEP_SECONDS,
            result_expires_seconds=_number(env, ENV_RESULT_EXPIRES, DEFAULT_RESULT_EXPIRES_SECONDS)
            or DEFAULT_RESULT_EXPIRES_SECONDS,
            task_events=_task_events(env),
            broker_outage_seconds=_number(
                env, ENV_BROKER_OUTAGE_SECONDS, DEFAULT_BROKER_OUTAGE_SECONDS
            )
            or DEFAULT_BROKER_OUTAGE_SECONDS,
            sentinel_master=env.get(ENV_SENTINEL_MASTER, "").strip() or None,
            fast_path=_switch(env, ENV_FAST_PATH, True),
        )

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: `call` runs everything in-process."""
        return self.broker_url is None

    @property
    def backend_url(self) -> str | None:
        """The result backend: VESSEL_RESULT_BACKEND, else the broker's Redis."""
        return self.result_backend or self.broker_url

    def visibility_timeout(self, longest_tool_seconds: float) -> float:
        """Seconds before Redis re-delivers an unacked message.

        Above the longest tool time limit plus twice the grace, so a call still
        running is never delivered a second time (DESIGN.md: with acks_late a
        task running longer than this runs again while it runs).
        """
        if self.visibility_timeout_seconds is not None:
            return self.visibility_timeout_seconds
        return longest_tool_seconds + 2 * self.lease_grace_seconds

    def __repr__(self) -> str:
        broker = None if self.broker_url is None else hide_password(self.broker_url)
        backend = None if self.result_backend is None else hide_password(self.result_backend)
        return (
            f"Settings(broker_url={broker!r}, result_backend={backend!r}, "
            f"lease_grace_seconds={self.lease_grace_seconds}, "
            f"visibility_timeout_seconds={self.visibility_timeout_seconds}, "
            f"heartbeat_seconds={self.heartbeat_seconds}, sweep_seconds={self.sweep_seconds}, "
            f"result_expires_seconds={self.result_expires_seconds}, "
            f"task_events={self.task_events!r}, "
            f"broker_outage_seconds={self.broker_outage_seconds}, "
            f"sentinel_master={self.sentinel_master!r}, fast_path={self.fast_path})"
        )

    __str__ = __repr__
