"""Quick figures for plugin tools: a trivial call (`return 1`) on a warm PluginRunner
against a fresh `bwrap ... node handler.js` per call, the same confinement both ways.

    .venv/bin/python -m bench.plugin_quick [--calls 40] [--threads 4]

Not part of the bench's rows (bench/run.py); a quick check of the runtime's own cost,
with no broker in the way. Prints p50/p90 latency and burst throughput of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.loading import load_deployment
from broker.request import Initiator
from workers.commands.check import publish_plugins
from workers.plugin import confine
from workers.plugin.runner import PluginRunner
from workers.plugin.stage import make_stage, node_binary, remove_stage
from workers.sandbox import seccomp
from workers.sandbox.bwrap import spawn_env
from workers.sandbox.identity import SandboxIdentity

HANDLER = 'globalThis.tools.one = { description: "One.", handler: () => 1 };\n'
RAW = "process.stdout.write(JSON.stringify((() => 1)()));\n"
FIELD_GUIDE = Path(__file__).resolve().parents[1] / "examples" / "field-guide"


class _NoHost:
    def call(self, context: object, chain: str, args: list[object]) -> object:
        raise NotImplementedError

    def logs(self, call_id: str) -> list[dict[str, object]]:
        return []

    def secrets(self, plugin: str) -> list[str]:
        return []

    def close(self) -> None:
        pass


def _figures(name: str, latencies: list[float], burst_calls: int, burst_s: float) -> None:
    q = statistics.quantiles(latencies, n=10)
    print(
        f"{name:>10}: p50 {statistics.median(latencies) * 1000:7.1f} ms  "
        f"p90 {q[8] * 1000:7.1f} ms  burst {burst_calls / burst_s:6.1f} calls/s"
    )


def _raw_once(stage: Path) -> float:
    node = node_binary()
    started = time.monotonic()
    fd = seccomp.filter_fd()
    try:
        options = confine.runtime_options(
            confine.Confinement(node=node, stage=stage, data_bytes=0), seccomp_fd=fd
        )
        done = subprocess.run(
            ["bwrap", *options, "--", confine.NODE_PATH, f"{confine.PLUGIN_ROOT}/handler.js"],
            pass_fds=(fd,),
            env=spawn_env(),
            capture_output=True,
            check=False,
            user=SandboxIdentity.for_worker().uid if os.geteuid() == 0 else None,
        )
    finally:
        os.close(fd)
    assert done.stdout == b"1", done
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp())
    (root / "bench").mkdir()
    (root / "bench" / "one.js").write_text(HANDLER)
    (root / "bench" / "handler.js").write_text(RAW)
    (root / "bench" / "plugin.toml").write_text('slug = "bench"\nsources = ["one.js"]\n')
    path = root / "deployment.toml"
    path.write_text(
        f'[[plugins]]\npackage = "bench"\n[[agents]]\nid = "a"\npackage = "{FIELD_GUIDE}"\n'
    )
    assert publish_plugins(path, None)[0] == []
    deployment = load_deployment(path)
    agent = deployment.agent("a")
    tool = agent.tools["bench__one"]
    runner = PluginRunner(deployment, _NoHost())  # type: ignore[arg-type]

    def warm_once(i: int = 0) -> float:
        started = time.monotonic()
        result = runner.run(
            call_id=f"c{i}",
            agent=agent,
            tool=tool,
            arguments={},
            owner="web/a",  # type: ignore[arg-type]
            turn=None,
            initiator=Initiator(),
        )
        assert result.output == "1", result
        return time.monotonic() - started

    try:
        time.sleep(1.0)
        latencies = []
        for i in range(args.calls):
            latencies.append(warm_once(i))
            time.sleep(0.05)  # calls arriving one after another, as a platform's do
        started = time.monotonic()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(warm_once, range(args.calls)))
        _figures("warm", latencies, args.calls, time.monotonic() - started)
    finally:
        runner.close()
    stage = make_stage(root / "bench", ["handler.js"])
    try:
        latencies = [_raw_once(stage) for _ in range(args.calls)]
        started = time.monotonic()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(lambda _: _raw_once(stage), range(args.calls)))
        _figures("raw bwrap", latencies, args.calls, time.monotonic() - started)
    finally:
        remove_stage(stage)


if __name__ == "__main__":
    main()
