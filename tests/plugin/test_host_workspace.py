"""`host.workspace` on the turn's real workspace folder: the operations, and the hostile
paths (`..`, absolute, symbolic links a declared tool of the turn left)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.plugin.host import HostFailed, HostRefused

from .host_support import HostSetup, host_setup, make_plugin


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[HostSetup]:
    with host_setup(make_plugin(), workspace_root=tmp_path / "ws", disk_limit_mb=1) as made:
        yield made


def test_write_read_list_delete(setup: HostSetup) -> None:
    saved = setup.call("workspace.write", {"path": "notes/trout.md", "content": "Brown trout"})
    assert saved == {"path": "notes/trout.md", "size": 11}
    # The declared tools of the turn see the same folder as their $HOME.
    assert (setup.workspace() / "notes" / "trout.md").read_text() == "Brown trout"
    assert setup.call("workspace.read", "notes/trout.md")["content"] == "Brown trout"
    assert setup.call("workspace.list", {"path": "notes"}) == {
        "path": "notes",
        "entries": [{"name": "trout.md", "type": "file", "size": 11}],
        "truncated": False,
    }
    assert setup.call("workspace.list")["entries"][0]["name"] == "notes"
    assert setup.call("workspace.delete", "notes/trout.md") == {
        "path": "notes/trout.md",
        "deleted": True,
    }
    assert setup.call("workspace.delete", "notes")["deleted"]
    assert setup.call("workspace.list")["entries"] == []


def test_binary_content_crosses_as_base64(setup: HostSetup) -> None:
    data = bytes(range(256))
    encoded = base64.b64encode(data).decode()
    setup.call("workspace.write", {"path": "b.bin", "content": encoded, "encoding": "base64"})
    assert (setup.workspace() / "b.bin").read_bytes() == data
    with pytest.raises(HostFailed, match="not UTF-8"):
        setup.call("workspace.read", "b.bin")
    assert setup.call("workspace.read", {"path": "b.bin", "encoding": "base64"})["content"] == (
        encoded
    )


def test_turns_have_their_own_workspaces(setup: HostSetup) -> None:
    setup.call("workspace.write", "a.txt", "one", turn="turn-1")
    with pytest.raises(HostFailed, match="no such file"):
        setup.call("workspace.read", "a.txt", turn="turn-2")


def test_a_call_with_no_turn_has_no_workspace(setup: HostSetup) -> None:
    with pytest.raises(HostRefused, match="no turn, so it has no workspace"):
        setup.call("workspace.write", "a.txt", "x", turn=None)


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("../escape.txt", "outside the workspace"),
        ("notes/../../escape.txt", "outside the workspace"),
        ("/etc/passwd", "is absolute"),
        ("a//b", "empty or `.` part"),
        ("./a", "empty or `.` part"),
        ("a\0b", "NUL"),
        ("", "empty"),
    ],
)
def test_paths_outside_the_workspace_are_refused(
    setup: HostSetup, tmp_path: Path, path: str, match: str
) -> None:
    with pytest.raises(HostRefused, match=match):
        setup.call("workspace.write", path, "x")
    assert not (tmp_path / "ws" / "escape.txt").exists()


@pytest.mark.hostile
def test_a_symlinked_folder_is_never_followed(setup: HostSetup, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    # What a declared tool of the same turn can leave in the workspace.
    os.symlink(outside, setup.workspace() / "notes")
    for chain, args in (
        ("workspace.write", ["notes/x.md", "planted"]),
        ("workspace.read", ["notes/secret.txt"]),
        ("workspace.list", ["notes"]),
        ("workspace.delete", ["notes/secret.txt"]),
    ):
        with pytest.raises(HostRefused, match="notes is a symbolic link"):
            setup.call(chain, *args)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.hostile
def test_a_symlinked_file_is_never_followed(setup: HostSetup, tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text("host file")
    os.symlink(target, setup.workspace() / "link.txt")
    with pytest.raises(HostRefused, match=r"link\.txt is a symbolic link"):
        setup.call("workspace.read", "link.txt")
    # Writing replaces the link itself; the file it pointed at is untouched.
    setup.call("workspace.write", "link.txt", "new")
    assert target.read_text() == "host file"
    assert not (setup.workspace() / "link.txt").is_symlink()
    # Deleting a link removes the link, never its target.
    os.symlink(target, setup.workspace() / "link2.txt")
    setup.call("workspace.delete", "link2.txt")
    assert target.read_text() == "host file"


@pytest.mark.hostile
def test_a_fifo_cannot_hang_a_read(setup: HostSetup) -> None:
    os.mkfifo(setup.workspace() / "pipe")
    with pytest.raises(HostFailed, match="not a file"):
        setup.call("workspace.read", "pipe")


def test_the_workspace_file_limit_applies(setup: HostSetup) -> None:
    # disk_limit_mb = 1 for this agent: no single file larger.
    with pytest.raises(HostRefused, match="larger than 1,048,576 bytes"):
        setup.call("workspace.write", "big.txt", "x" * (1024 * 1024 + 1))
    (setup.workspace() / "big.txt").write_bytes(b"x" * (1024 * 1024 + 1))
    with pytest.raises(HostFailed, match="larger than 1,048,576 bytes"):
        setup.call("workspace.read", "big.txt")


def test_errors_name_the_path_never_the_host_folder(setup: HostSetup, tmp_path: Path) -> None:
    setup.call("workspace.write", "d/a.txt", "x")
    with pytest.raises(HostFailed) as caught:
        setup.call("workspace.delete", "d")
    assert "not empty" in str(caught.value) and str(tmp_path) not in str(caught.value)
    with pytest.raises(HostFailed) as missing:
        setup.call("workspace.read", "nope/a.txt")
    assert str(tmp_path) not in str(missing.value)


def test_a_list_is_cut_at_a_thousand_entries(setup: HostSetup) -> None:
    folder = setup.workspace() / "many"
    folder.mkdir()
    for i in range(1005):
        (folder / f"{i:04}").touch()
    listed = setup.call("workspace.list", "many")
    assert len(listed["entries"]) == 1000 and listed["truncated"] is True
    assert listed["entries"][-1] == {"name": "0999", "type": "file", "size": 0}
    (folder / "0999").unlink()
    for i in range(1000, 1005):
        (folder / f"{i:04}").unlink()
    assert setup.call("workspace.list", "many")["truncated"] is False


def test_a_path_part_longer_than_a_file_name_is_refused(setup: HostSetup) -> None:
    with pytest.raises(HostRefused, match="part longer than 255 bytes"):
        setup.call("workspace.write", "x" * 300, "x")
