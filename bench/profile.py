"""Where the time of one call goes: cProfile of the hot paths, top entries printed.

    python bench/profile.py [--calls N] [--only runner,client,worker] [--top K]

- runner: `SandboxRunner.run` of `/bin/true`, in this process (P1's path);
- client: `VesselClient.call` of the service tool against real workers (P2's
  client side: admission, publish, result polling);
- worker: the worker side of a call, `workers.tasks.run_call` (claim, run,
  finish_call: done + result + release, publish), profiled in a solo-pool Celery worker started in
  this process against the bench's Redis, for a service and a declared call;
- burst: a service burst into a threads-pool worker (x32) started in this
  process, every worker thread profiled (one cProfile per thread, merged):
  Celery's consumer, events and pool included, as a real worker spends its CPU;
- steps: no profiler, no worker: the steps of one service call's life done one
  after the other in this process against a real Redis and the local server,
  each timed (median ms per step), next to a bare Redis PING and a bare httpx
  POST, so the cost of each step reads without profiler overhead.

Each section prints wall time per call, then the top functions by own time
and by cumulative time. (cProfile sees only the thread it is enabled in, so the
worker section wraps `run_call` itself rather than profiling Celery's threads.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where this very file
# would shadow the standard library's `profile` that cProfile imports.
_REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == _REPO / "bench":
    sys.path[0] = str(_REPO)

import cProfile  # noqa: E402  (after the sys.path fix above)
import io  # noqa: E402
import pstats  # noqa: E402

__all__ = ["main", "profile_calls"]

SECTIONS = ("runner", "client", "worker", "steps", "burst")


def profile_calls(
    label: str, call: Callable[[], object], *, calls: int, warmup: int, top: int
) -> str:
    """Profile `calls` runs of `call` (after `warmup` unprofiled ones); the report text."""
    for _ in range(warmup):
        call()
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    elapsed = time.perf_counter() - started
    return _report(label, profiler, calls=calls, elapsed=elapsed, top=top)


def _report(label: str, profiler: cProfile.Profile, *, calls: int, elapsed: float, top: int) -> str:
    out = io.StringIO()
    out.write(
        f"\n=== {label}: {calls} calls, {elapsed / calls * 1000:.2f} ms per call "
        "(wall, profiler on)\n"
    )
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs()
    out.write(f"--- top {top} by own time\n")
    stats.sort_stats("tottime").print_stats(top)
    out.write(f"--- top {top} by cumulative time\n")
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def _runner_section(folder: Path, calls: int, top: int) -> str:
    import uuid

    from bench.deployment import TOOL_TRUE
    from bench.p1_sandbox import _build

    runner, agent, tools = _build(folder / "runner")

    def one() -> None:
        result = runner.run(
            call_id=uuid.uuid4().hex, agent=agent, tool=tools[TOOL_TRUE], arguments={}, turn=None
        )
        assert not result.is_error, result.output

    return profile_calls(
        "runner: SandboxRunner.run(/bin/true)", one, calls=calls, warmup=10, top=top
    )


def _client_section(folder: Path, calls: int, top: int) -> str:
    from bench.deployment import TOOL_PING
    from bench.stack import BenchCluster

    bench = BenchCluster(folder / "client")
    try:
        deployment, ours = bench.solo()
        agent = deployment.agents[0]
        return profile_calls(
            "client: VesselClient.call(service ping), real workers",
            lambda: ours.call(agent, TOOL_PING, {}),
            calls=calls,
            warmup=20,
            top=top,
        )
    finally:
        bench.close()


def _worker_section(folder: Path, calls: int, top: int) -> str:
    import os

    from celery.contrib.testing.worker import start_worker

    from bench.cluster import Cluster
    from bench.deployment import TOOL_PING, TOOL_TRUE, write_deployment
    from bench.ours import OursClient
    from broker.admission import RedisAdmission
    from broker.config import Settings
    from broker.queues import shared_lane
    from workers import tasks
    from workers.assembly import build_executor, build_runtime

    reports = []
    with Cluster(folder / "worker") as cluster:
        cluster.start_redis()
        service_url = cluster.start_httpd()
        deployment_files = write_deployment(
            folder / "worker-deployment", agents=1, service_url=service_url
        )
        url = cluster.redis_url(1)
        os.environ["VESSEL_WORKSPACE_ROOT"] = str(folder / "worker-workspaces")
        (folder / "worker-workspaces").mkdir(exist_ok=True)
        settings = Settings(broker_url=url, result_backend=url)
        client = OursClient(deployment_files.path, url)
        deployment = client.deployment
        agent = deployment_files.agents[0]
        for kind, tool in (("service", TOOL_PING), ("sandbox", TOOL_TRUE)):
            executor, _ = build_executor(deployment, kind)
            admission = RedisAdmission.from_url(url)
            hostname = f"profile-{kind}@bench"
            runtime = build_runtime(
                deployment,
                settings,
                kind,
                admission=admission,
                executor=executor,
                hostname=hostname,
            )
            app = runtime.app
            lane = shared_lane(kind)
            profiler = cProfile.Profile()
            original = tasks.run_call
            measured = {"on": False, "seconds": 0.0, "calls": 0}

            def profiled(
                rt: object, message: dict[str, object], _orig=original, _p=profiler, _m=measured
            ) -> str:
                if not _m["on"]:
                    return _orig(rt, message)
                started = time.perf_counter()
                _p.enable()
                try:
                    return _orig(rt, message)
                finally:
                    _p.disable()
                    _m["seconds"] += time.perf_counter() - started
                    _m["calls"] += 1

            tasks.run_call = profiled
            try:
                with start_worker(
                    app,
                    pool="solo",
                    concurrency=1,
                    queues=[lane],
                    perform_ping_check=False,
                    loglevel="WARNING",
                    shutdown_timeout=10,
                ):
                    # A long-lived capacity record: the housekeeper is not running here.
                    from broker.admission.publish import publish

                    publish(app, admission.heartbeat(kind, hostname, {lane: 1}, 600_000))
                    for _ in range(20):
                        client.call(agent, tool, {})
                    measured["on"] = True
                    started = time.perf_counter()
                    for _ in range(calls):
                        client.call(agent, tool, {})
                    round_trip = (time.perf_counter() - started) / calls * 1000
                    measured["on"] = False
            finally:
                tasks.run_call = original
                admission.close()
            per_call = measured["seconds"] / max(1, measured["calls"]) * 1000
            text = _report(
                f"worker: run_call({kind}), solo pool",
                profiler,
                calls=int(measured["calls"]),
                elapsed=float(measured["seconds"]),
                top=top,
            )
            reports.append(
                text + f"(round trip seen by the client: {round_trip:.2f} ms; "
                f"run_call itself: {per_call:.2f} ms)\n"
            )
        client.close()
    return "".join(reports)


def _steps_section(folder: Path, calls: int, top: int) -> str:
    import contextlib
    import json
    from collections.abc import Iterator

    import httpx

    from bench.cluster import Cluster
    from bench.deployment import TOOL_PING, write_deployment
    from bench.ours import OWNER, OursClient
    from bench.stats import summarize
    from broker.admission.finish import finish_call, results_in_admission
    from broker.admission.publish import publish
    from broker.queues import shared_lane
    from broker.request import CallRequest
    from workers.assembly import build_executor

    with Cluster(folder / "steps") as cluster:
        cluster.start_redis()
        service_url = cluster.start_httpd()
        files = write_deployment(folder / "steps-deployment", agents=1, service_url=service_url)
        url = cluster.redis_url(1)
        ours = OursClient(files.path, url)
        client, deployment = ours.client, ours.deployment
        admission, app = client.admission, client.app
        executor, _ = build_executor(deployment, "service")
        agent = files.agents[0]
        lane = shared_lane("service")
        # Capacity for the lane, as a worker's heartbeat would register it.
        publish(app, admission.heartbeat("service", "steps@bench", {lane: 1000}, 600_000))
        raw_http = httpx.Client()
        in_one_script = results_in_admission(app, admission)
        times: dict[str, list[float]] = {}

        cpu: dict[str, list[float]] = {}

        @contextlib.contextmanager
        def step(name: str) -> Iterator[None]:
            # Wall time and this thread's CPU time: at volume a worker is bound by
            # the CPU a call costs it (one GIL), not by its wall time.
            started, started_cpu = time.perf_counter(), time.thread_time()
            yield
            times.setdefault(name, []).append((time.perf_counter() - started) * 1000)
            cpu.setdefault(name, []).append((time.thread_time() - started_cpu) * 1000)

        for i in range(calls + 20):
            with step("redis PING (reference)"):
                admission.redis.ping()
            with step("httpx POST (reference)"):
                raw_http.post(service_url + "/ping", json={})
            with step("client: submit (admission + publish)"):
                call_id = client.submit(agent, TOOL_PING, {}, owner=OWNER).call_id
            request = CallRequest(
                call_id=call_id, agent=agent, tool=TOOL_PING, arguments={}, owner=OWNER
            )
            # The worker's steps, as workers.tasks.run_call takes them.
            with step("worker: claim"):
                admission.claim(call_id, "steps@bench", 60_000)
            with step("worker: Executor.run (ServiceCaller)"):
                result = executor.run(request)
            with step("worker: finish_call (result + release)"):
                _, dispatched = finish_call(
                    app,
                    admission,
                    result,
                    hostname="steps@bench",
                    ttl_seconds=3600,
                    in_one_script=in_one_script,
                )
            with step("worker: publish the next call"):
                publish(app, dispatched)
            with step("client: get_task_meta"):
                meta = app.backend.get_task_meta(call_id)
            assert meta["status"] == "SUCCESS", meta
            assert json.loads(result.output) == {"ok": True}, result.output
            if i < 20:  # warm-up
                times.clear()
                cpu.clear()
        raw_http.close()
        executor.service.close()
        ours.close()
    lines = [
        f"\n=== steps of one service call, {calls} calls, no profiler",
        f"  {'step':42s} {'wall med':>8s} {'wall p99':>8s} {'CPU med':>8s}  (ms)",
    ]
    wall_total = cpu_total = 0.0
    for name, values in times.items():
        wall, spent = summarize(values), summarize(cpu[name])
        if "reference" not in name:
            wall_total += wall.median
            cpu_total += spent.median
        lines.append(f"  {name:42s} {wall.median:8.2f} {wall.p99:8.2f} {spent.median:8.2f}")
    lines.append(f"  {'sum of the steps (medians)':42s} {wall_total:8.2f} {'':8s} {cpu_total:8.2f}")
    lines.append(
        "  (the real path adds Celery's delivery, acks and task events, and the client's "
        "result polling wait)"
    )
    return "\n".join(lines) + "\n"


def _burst_section(folder: Path, calls: int, top: int) -> str:
    import threading

    from celery.contrib.testing.worker import start_worker

    from bench.cluster import Cluster
    from bench.deployment import TOOL_PING, write_deployment
    from bench.ours import OursClient
    from broker.admission import RedisAdmission
    from broker.admission.publish import publish
    from broker.config import Settings
    from broker.queues import shared_lane
    from workers.assembly import build_executor, build_runtime

    profilers: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start_profiling_thread(*_: object) -> None:
        # Called once in each new thread (threading.setprofile): give the thread
        # a profiler of its own; cProfile can only see the thread enabling it.
        import sys as _sys

        _sys.setprofile(None)
        profiler = cProfile.Profile()
        with lock:
            profilers.append(profiler)
        profiler.enable()

    with Cluster(folder / "burst") as cluster:
        cluster.start_redis()
        service_url = cluster.start_httpd()
        files = write_deployment(folder / "burst-deployment", agents=1, service_url=service_url)
        url = cluster.redis_url(1)
        settings = Settings(broker_url=url, result_backend=url)
        client = OursClient(files.path, url)
        deployment = client.deployment
        executor, _ = build_executor(deployment, "service")
        admission = RedisAdmission.from_url(url)
        hostname = "profile-burst@bench"
        runtime = build_runtime(
            deployment,
            settings,
            "service",
            admission=admission,
            executor=executor,
            hostname=hostname,
        )
        app = runtime.app
        lane = shared_lane("service")
        agent = files.agents[0]
        threading.setprofile(start_profiling_thread)
        try:
            with start_worker(
                app,
                pool="threads",
                concurrency=32,
                queues=[lane],
                perform_ping_check=False,
                loglevel="WARNING",
                shutdown_timeout=10,
            ):
                publish(app, admission.heartbeat("service", hostname, {lane: 32}, 600_000))
                # No reset after a warm-up: a profiler can only be switched in
                # its own thread, so the first calls (connections, imports) count.
                started = time.perf_counter()
                handles = [client.submit(agent, TOOL_PING, {}) for _ in range(calls)]
                for handle in handles:
                    client.collect(handle, "service", timeout=120)
                elapsed = time.perf_counter() - started
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]
            admission.close()
            client.close()
    out = io.StringIO()
    out.write(
        f"\n=== burst: {calls} service calls into an in-process threads x32 worker: "
        f"{calls / elapsed:.0f} calls/s with the profiler on; {len(profilers)} threads profiled\n"
    )
    stats = pstats.Stats(profilers[0], stream=out)
    for p in profilers[1:]:
        stats.add(p)
    stats.strip_dirs()
    out.write(f"--- top {top} by own time (all worker threads)\n")
    stats.sort_stats("tottime").print_stats(top)
    out.write(f"--- top {top} by cumulative time (all worker threads)\n")
    stats.sort_stats("cumulative").print_stats(top)
    # Who builds Redis clients (and their ~170 response callbacks) while calls run.
    out.write("--- callers of redis.Redis.__init__\n")
    stats.print_callers(r"client.py:\d+\(__init__\)")
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/profile.py", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="profiled calls per section")
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    parser.add_argument("--top", type=int, default=20, help="functions listed per ordering")
    args = parser.parse_args(argv)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    sections = {
        "runner": _runner_section,
        "client": _client_section,
        "worker": _worker_section,
        "steps": _steps_section,
        "burst": _burst_section,
    }
    status = 0
    with tempfile.TemporaryDirectory(prefix="vessel-profile-") as tmp:
        # As in bench/run.py: a root worker's calls run as the sandbox uid,
        # which must pass through this folder to the workspaces under it.
        os.chmod(tmp, 0o711)
        for name in wanted:
            if name not in sections:
                parser.error(f"unknown section {name!r}; sections are {', '.join(SECTIONS)}")
            try:
                print(sections[name](Path(tmp), args.calls, args.top), flush=True)
            except Exception as exc:
                print(f"\n=== {name}: not profiled: {type(exc).__name__}: {exc}", flush=True)
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
