"""`vessel-workers check`: validate the deployment and every agent package, publish every plugin.

Prints one `FILE: FIELD: what is wrong` line per problem and exits 1, or one
summary line (`deployment.toml: 2 agents, 3 tools: valid`) and exits 0.

Each `[[plugins]]` entry is published first: its sources run once, confined
(no network, no host API, a time and memory limit), the plugin rules are
applied to what they register, and `plugin.lock.json` is written into the
plugin folder (or `--lock-dir DIR` as `<slug>.lock.json`). Every other loader
reads that lock. A tool dropped for a built-in's name is a warning line (exit 0),
and so are a final name over 64 characters and an agent whose pinned and
always-listed tools take more places than its `max_listed_tools`.
`--verbose` prints each plugin's derived permissions and limits.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from broker.catalogue import catalogue_warnings
from broker.errors import InvalidDeployment, Problem
from broker.loading import default_lock_dir, load_deployment
from broker.loading.deployment import DEPLOYMENT_KEYS
from broker.loading.fields import Problems, Table
from broker.loading.lock import lock_path, write_lock
from broker.loading.plugins import PluginEntry, read_plugin_entries
from broker.loading.toml_file import read_toml
from broker.model import Deployment
from workers.plugin.publish import Published, publish
from workers.plugin.registration import register_sources

__all__ = ["EXIT_PROBLEMS", "EXIT_VALID", "add_parser", "publish_plugins", "run", "summary"]

EXIT_VALID = 0
EXIT_PROBLEMS = 1


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "check",
        parents=[common],
        help="validate the deployment and its packages; publish its plugins",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--lock-dir",
        type=Path,
        default=None,
        help="write plugin locks here as <slug>.lock.json (default: each plugin's folder; "
        "loaders read $VESSEL_PLUGIN_LOCK_DIR)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print each plugin's permissions"
    )
    parser.set_defaults(run=run)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def summary(deployment: Deployment) -> str:
    """`FILE: N agents, M tools: valid` (and the plugins, when there are some)."""
    tools = sum(len(agent.tools) for agent in deployment.agents.values())
    counts = f"{_count(len(deployment.agents), 'agent')}, {_count(tools, 'tool')}"
    if deployment.plugins:
        counts += f", {_count(len(deployment.plugins), 'plugin')}"
    return f"{deployment.path}: {counts}: valid"


def _entries(path: Path) -> list[PluginEntry]:
    """The deployment's well-formed `[[plugins]]` entries (problems: the full load reports them)."""
    scratch = Problems()
    data = read_toml(path, shown=str(path), problems=scratch)
    if data is None:
        return []
    top = Table(data, file=str(path), where="", keys=DEPLOYMENT_KEYS, problems=scratch)
    return read_plugin_entries(top, path) or []


def publish_plugins(path: Path, lock_dir: Path | None) -> tuple[list[Problem], list[str], set[str]]:
    """Publish every plugin of the deployment at `path`: (problems, warnings, unpublished locks).

    The third item holds the shown lock paths of plugins that failed, whose
    "no lock" problems would only repeat theirs.
    """
    problems: list[Problem] = []
    warnings: list[str] = []
    failed: set[str] = set()
    for entry in _entries(path):
        plugin = entry.plugin_file
        shown_lock = str(lock_path(Path(plugin.shown), plugin.slug, lock_dir))
        try:
            registration = register_sources(plugin.folder, plugin.sources)
            published = publish(plugin, registration)
        except OSError as exc:
            published = Published(
                lock=None,
                problems=(
                    Problem(
                        file=plugin.file,
                        field="sources",
                        message=f"the plugin runtime cannot run here: {exc}",
                    ),
                ),
            )
        problems += published.problems
        warnings += published.warnings
        if published.lock is None:
            failed.add(shown_lock)
            continue
        write_lock(lock_path(plugin.folder, plugin.slug, lock_dir), published.lock)
    return problems, warnings, failed


def run(args: argparse.Namespace) -> int:
    lock_dir = args.lock_dir or default_lock_dir()
    problems, warnings, failed = publish_plugins(args.deployment, lock_dir)
    for warning in warnings:
        print(warning)
    try:
        deployment = load_deployment(args.deployment, lock_dir=lock_dir)
    except InvalidDeployment as exc:
        problems += [p for p in exc.problems if p.file not in failed]
    if problems:
        for problem in dict.fromkeys(problems):
            print(problem)
        return EXIT_PROBLEMS
    for warning in catalogue_warnings(deployment):
        print(warning)
    if args.verbose:
        for plugin in deployment.plugins.values():
            shown = ", ".join(plugin.permissions) or "none"
            print(
                f"plugin {plugin.slug}: {_count(len(plugin.tools), 'tool')}, "
                f"{plugin.timeout_seconds:g} s, {plugin.memory_limit_mb} MB; "
                f"permissions: {shown}"
            )
    print(summary(deployment))
    return EXIT_VALID
