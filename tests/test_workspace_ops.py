"""The workspace operations' file handling (`workers.workspace_ops.perform`),
against what a hostile tool can leave in a workspace: links at any depth,
fifos, folders where files are expected, files over the cap."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from broker.files import MAX_FILE_BYTES, check_path
from workers.workspace_ops import OpRefused, perform

pytestmark = [pytest.mark.hostile]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


def test_put_get_list_delete(workspace: Path) -> None:
    perform(workspace, "put", "a/b/c.txt", b"hello")
    assert (workspace / "a" / "b" / "c.txt").read_bytes() == b"hello"
    assert oct((workspace / "a").stat().st_mode & 0o777) == "0o700"
    got = perform(workspace, "get", "a/b/c.txt")
    assert base64.b64decode(got["data"]) == b"hello"
    assert perform(workspace, "list", "a/b") == {
        "entries": [{"name": "c.txt", "size": 5, "kind": "file"}]
    }
    perform(workspace, "put", "a/b/c.txt", b"replaced")
    assert (workspace / "a" / "b" / "c.txt").read_bytes() == b"replaced"
    perform(workspace, "delete", "a")
    assert list(workspace.iterdir()) == []


def test_a_link_in_the_middle_of_a_path_is_never_followed(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (workspace / "d").symlink_to(outside)
    for op, data in (("get", None), ("put", b"x"), ("delete", None)):
        with pytest.raises(OpRefused, match="symbolic link"):
            perform(workspace, op, "d/secret", data)
    with pytest.raises(OpRefused, match="symbolic link"):
        perform(workspace, "list", "d")
    assert (outside / "secret").read_text() == "s"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_a_put_over_a_link_replaces_the_link_not_its_target(
    workspace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    target.write_text("keep")
    (workspace / "f").symlink_to(target)
    with pytest.raises(OpRefused, match="symbolic link"):
        perform(workspace, "get", "f")
    perform(workspace, "put", "f", b"new")
    assert target.read_text() == "keep"
    assert not (workspace / "f").is_symlink() and (workspace / "f").read_bytes() == b"new"
    (workspace / "g").symlink_to(target)
    perform(workspace, "delete", "g")
    assert target.exists()


def test_a_fifo_does_not_hang_a_get(workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")
    with pytest.raises(OpRefused, match="not a file"):
        perform(workspace, "get", "pipe")
    assert {"name": "pipe", "size": 0, "kind": "other"} in perform(workspace, "list", ".")[
        "entries"
    ]


def test_folders_where_files_are_wanted_and_the_caps(workspace: Path) -> None:
    (workspace / "dir").mkdir()
    with pytest.raises(OpRefused, match="is a folder"):
        perform(workspace, "put", "dir", b"x")
    with pytest.raises(OpRefused, match="not a file"):
        perform(workspace, "get", "dir")
    with pytest.raises(OpRefused, match="limit of one file"):
        perform(workspace, "put", "big", b"x" * 11, put_cap=10)
    with open(workspace / "huge", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(OpRefused, match="over the"):
        perform(workspace, "get", "huge")
    with pytest.raises(OpRefused, match="no such"):
        perform(workspace, "delete", "absent")
    assert [p.name for p in workspace.iterdir() if p.name.startswith(".vessel-put")] == []


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/./b", "", "a\0b", "x" * 5000]
)
def test_paths_of_the_wrong_form_are_refused(path: str) -> None:
    with pytest.raises(ValueError):
        check_path(path)
    assert check_path("a/b/") == "a/b"
    assert check_path(".", allow_root=True) == "."
