"""`vessel-workers files AGENT TURN ls|get|put|rm`: a turn's workspace from the command line.

    vessel-workers files field-guide turn-42 put uploads/notes.md notes.md
    vessel-workers files field-guide turn-42 ls uploads
    vessel-workers files field-guide turn-42 get report.md -o report.md
    vessel-workers files field-guide turn-42 rm uploads

With VESSEL_BROKER_URL each operation runs on the turn's home host, as
`client.files` does (`broker.files`); without it (the embedded default), in the
workspace root of this machine (`VESSEL_WORKSPACE_ROOT`), which is where an
embedded `vessel-workers call --turn` runs its tools.

`ls` prints one line per entry, `KIND SIZE NAME` (tab-separated; `--json` for
JSON); `get` writes the file to standard output or `-o FILE`; `put` reads FILE,
or standard input for `-` or none.

Exit status: 0 done; 1 refused by the workspace (no such file, a folder where a
file is wanted, too large) or no answer within --timeout; 2 refused before
anything was sent (a path of the wrong form, an unknown agent, an invalid
deployment or setting).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from broker.errors import (
    BrokerUnavailable,
    ConfigError,
    InvalidDeployment,
    TransientError,
    UnknownAgent,
    WorkspaceError,
)
from workers.commands.call import EXIT_ERROR, EXIT_OK, EXIT_REFUSED

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "files",
        parents=[common],
        help="list, get, put or remove files in a turn's workspace",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("agent", metavar="AGENT")
    parser.add_argument("turn", metavar="TURN")
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="give up after this long without an answer (default 30)",
    )
    ops = parser.add_subparsers(dest="op", required=True, metavar="OP")
    ls = ops.add_parser("ls", help="list a folder (default: the workspace)")
    ls.add_argument("path", metavar="PATH", nargs="?", default=".")
    ls.add_argument("--json", action="store_true", help="print the entries as JSON")
    get = ops.add_parser("get", help="print a file, or write it to -o FILE")
    get.add_argument("path", metavar="PATH")
    get.add_argument("-o", "--output", type=Path, default=None, metavar="FILE")
    put = ops.add_parser("put", help="write a file from FILE or standard input")
    put.add_argument("path", metavar="PATH")
    put.add_argument("source", metavar="FILE", nargs="?", default="-")
    rm = ops.add_parser("rm", help="remove a file, link or folder")
    rm.add_argument("path", metavar="PATH")
    parser.set_defaults(run=run)


def _fail(message: str, code: int = EXIT_REFUSED) -> int:
    print(f"vessel-workers files: {message}", file=sys.stderr)
    return code


class _LocalFiles:
    """The embedded default's workspace operations: this machine's workspace root."""

    def __init__(self, deployment: Any, agent: str, turn: str) -> None:
        from workers.sandbox.workspace import (  # noqa: PLC0415
            WorkspaceStore,
            default_workspace_root,
        )

        self._cap = deployment.agent(agent).settings.disk_limit_mb * 1024 * 1024
        self._store = WorkspaceStore(default_workspace_root())
        self._agent, self._turn = agent, turn
        self.workspace_lost = False

    def _run(self, op: str, path: str, data: bytes | None = None) -> dict[str, Any]:
        from workers.workspace_ops import OpRefused, perform  # noqa: PLC0415

        try:
            workspace = self._store.for_turn(self._agent, self._turn)
            return perform(workspace, op, path, data, put_cap=self._cap)
        except OpRefused as exc:
            raise WorkspaceError(str(exc)) from None
        except OSError as exc:
            raise WorkspaceError(f"{op} {path}: {exc.strerror or exc}") from None

    def put(self, path: str, data: bytes) -> None:
        self._run("put", path, data)

    def get(self, path: str) -> bytes:
        import base64  # noqa: PLC0415

        return base64.b64decode(self._run("get", path)["data"])

    def list(self, path: str = ".") -> list[dict[str, Any]]:
        return list(self._run("list", path)["entries"])

    def delete(self, path: str) -> None:
        self._run("delete", path)


def _do(files: Any, args: argparse.Namespace) -> None:
    if args.op == "ls":
        entries = files.list(args.path)
        if args.json:
            print(json.dumps(entries, indent=2, ensure_ascii=False))
        else:
            for entry in entries:
                print(f"{entry['kind']}\t{entry['size']}\t{entry['name']}")
    elif args.op == "get":
        data = files.get(args.path)
        if args.output is None:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            args.output.write_bytes(data)
    elif args.op == "put":
        source = args.source
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
        files.put(args.path, data)
    else:
        files.delete(args.path)
    if getattr(files, "workspace_lost", False):
        print(
            "vessel-workers files: the turn's workspace was lost with its host; "
            "this operation started with an empty one",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    # Imported here, not at the top (see workers.commands.call).
    from broker.config import Settings  # noqa: PLC0415
    from broker.files import check_path  # noqa: PLC0415
    from broker.loading import load_deployment  # noqa: PLC0415

    try:
        settings = Settings.from_environ()
        deployment = load_deployment(args.deployment)
        deployment.agent(args.agent)
        check_path(args.path, allow_root=args.op == "ls")
        if args.op == "put" and args.source != "-" and not Path(args.source).is_file():
            raise ValueError(f"{args.source}: no such file to put")
    except InvalidDeployment as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_REFUSED
    except (ValueError, ConfigError, UnknownAgent) as exc:
        return _fail(str(exc))

    if settings.embedded:
        files: Any = _LocalFiles(deployment, args.agent, args.turn)
        try:
            _do(files, args)
        except ValueError as exc:
            return _fail(str(exc))
        except (WorkspaceError, OSError) as exc:
            return _fail(str(exc), EXIT_ERROR)
        return EXIT_OK

    from broker.client import VesselClient  # noqa: PLC0415
    from broker.reach import check_reachable  # noqa: PLC0415

    try:
        check_reachable(settings)  # one line, exit 2, for a broker not there or refusing us
        client = VesselClient(deployment, settings)
    except (ConfigError, BrokerUnavailable) as exc:
        return _fail(str(exc))
    try:
        _do(client.files(args.agent, args.turn, timeout=args.timeout), args)
    except ValueError as exc:
        return _fail(str(exc))
    except (WorkspaceError, TransientError, OSError) as exc:
        return _fail(str(exc), EXIT_ERROR)
    finally:
        client.close()
    return EXIT_OK
