"""`vessel-workers files` on the embedded default (no VESSEL_BROKER_URL): the
workspace root of this machine, the one an embedded `call --turn` uses; exit
codes 0 / 1 / 2. With a broker it runs on the turn's home host
(tests/cluster/test_cluster_turns.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, REPO

from broker.errors import WorkspaceError

DEPLOYMENT = str(EXAMPLES / "deployment.toml")


def run(
    root: Path, verb: str, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VESSEL_BROKER")}
    environ.pop("VESSEL_RESULT_BACKEND", None)
    environ["VESSEL_WORKSPACE_ROOT"] = str(root)
    command = ["files", "-d", DEPLOYMENT, "field-guide", "turn-cli", *args]
    if verb == "call":
        command = ["call", "-d", DEPLOYMENT, "field-guide", *args, "--turn", "turn-cli"]
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *command],
        input=stdin,
        env=environ,
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )


def test_a_file_put_from_stdin_is_read_by_a_call_of_the_turn(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    done = run(root, "files", "put", "notes/x.md", stdin=b"one two three\n")
    assert done.returncode == 0, done.stderr
    listed = run(root, "files", "ls", "notes", "--json")
    assert json.loads(listed.stdout) == [{"name": "x.md", "size": 14, "kind": "file"}]
    counted = run(root, "call", "word_count", '{"path": "/tmp/vessel/notes/x.md"}')
    assert counted.returncode == 0, counted.stderr
    assert counted.stdout.decode().strip() == "3"
    got = run(root, "files", "get", "notes/x.md", "-o", str(tmp_path / "out.md"))
    assert got.returncode == 0 and (tmp_path / "out.md").read_bytes() == b"one two three\n"
    assert run(root, "files", "get", "notes/x.md").stdout == b"one two three\n"
    assert run(root, "files", "rm", "notes").returncode == 0
    assert b"notes" not in run(root, "files", "ls").stdout


def test_a_file_put_from_a_file_and_the_exit_codes(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    source = tmp_path / "in.bin"
    source.write_bytes(bytes(range(256)))
    assert run(root, "files", "put", "in.bin", str(source)).returncode == 0
    assert run(root, "files", "get", "in.bin").stdout == bytes(range(256))
    missing = run(root, "files", "get", "nope")
    assert missing.returncode == 1 and b"nope: no such file" in missing.stderr
    folder = run(root, "files", "get", ".")
    assert folder.returncode == 2 and b"not the workspace" in folder.stderr
    escape = run(root, "files", "get", "../../etc/passwd")
    assert escape.returncode == 2 and b"inside the workspace" in escape.stderr
    absolute = run(root, "files", "put", "/etc/x", str(source))
    assert absolute.returncode == 2 and b"is absolute" in absolute.stderr
    no_source = run(root, "files", "put", "x", str(tmp_path / "absent"))
    assert no_source.returncode == 2 and b"no such file to put" in no_source.stderr


def test_client_files_on_the_embedded_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from broker.config import Settings
    from broker.loading import load_deployment
    from workers.embedded import embedded_client

    monkeypatch.setenv("VESSEL_WORKSPACE_ROOT", str(tmp_path / "ws"))
    deployment = load_deployment(DEPLOYMENT)
    with embedded_client(deployment, Settings(), "sandbox") as client:
        files = client.files("field-guide", "turn-emb")
        files.put("a.md", b"four words right here")
        result = client.call(
            "field-guide",
            "word_count",
            {"path": "/tmp/vessel/a.md"},
            owner="web/a",
            turn="turn-emb",
            timeout=30,
        )
        assert result.output.strip() == "4" and not result.workspace_lost
        assert [e["name"] for e in files.list()] == ["a.md", "outbox"]
        with pytest.raises(WorkspaceError, match="no such file"):
            files.get("b.md")
