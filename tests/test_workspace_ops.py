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


def test_each_refusal_says_its_reason(workspace: Path, tmp_path: Path) -> None:
    (workspace / "dir").mkdir()
    (workspace / "dir" / "f").write_bytes(b"12345")
    (workspace / "link").symlink_to(tmp_path)
    cases = [
        (("get", "absent"), "not_found"),
        (("list", "absent"), "not_found"),
        (("get", "link/x"), "symlink"),
        (("get", "dir"), "not_a_file"),
        (("list", "dir/f"), "not_a_file"),
        (("delete", "dir"), "not_empty"),
    ]
    for (op, path), reason in cases:
        options = {"only_empty": True} if op == "delete" else {}
        with pytest.raises(OpRefused) as caught:
            perform(workspace, op, path, **options)
        assert caught.value.reason == reason, (op, path, str(caught.value))
    with pytest.raises(OpRefused) as too_large:
        perform(workspace, "get", "dir/f", max_bytes=4)
    assert too_large.value.reason == "too_large"
    assert str(too_large.value) == "dir/f is 5 bytes, over the cap: no file larger than 4 bytes"


def test_a_delete_that_keeps_folders_removes_only_empty_ones(workspace: Path) -> None:
    perform(workspace, "put", "d/e/f.txt", b"x")
    with pytest.raises(OpRefused, match="the folder d is not empty"):
        perform(workspace, "delete", "d", only_empty=True)
    assert (workspace / "d" / "e" / "f.txt").read_bytes() == b"x"
    perform(workspace, "delete", "d/e/f.txt", only_empty=True)
    perform(workspace, "delete", "d/e", only_empty=True)
    perform(workspace, "delete", "d", only_empty=True)
    assert list(workspace.iterdir()) == []


def test_caps_lower_than_the_protocols(workspace: Path) -> None:
    for name in ("a", "b", "c"):
        perform(workspace, "put", name, b"abc")
    assert [e["name"] for e in perform(workspace, "list", ".", max_entries=2)["entries"]] == [
        "a",
        "b",
    ]
    assert base64.b64decode(perform(workspace, "get", "a", max_bytes=3)["data"]) == b"abc"
    # A cap above the protocol's is the protocol's.
    with open(workspace / "huge", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(OpRefused, match="over the cap"):
        perform(workspace, "get", "huge", max_bytes=MAX_FILE_BYTES * 2)
    # A put's temporary file is never listed.
    (workspace / ".vessel-put-0123456789abcdef").write_bytes(b"half")
    assert ".vessel-put-0123456789abcdef" not in {
        e["name"] for e in perform(workspace, "list", ".")["entries"]
    }
