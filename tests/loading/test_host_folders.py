"""Host folders a sandbox is shown: packages and mount sources (`exposed_folder_problem`).

A tool reads everything such a folder holds, so neither may be the host root,
hold the deployment file (at any depth), show the workspaces, or lie in the
kernel's /proc, /sys or /dev.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.constants import DEFAULT_WORKSPACE_ROOT, ENV_WORKSPACE_ROOT
from broker.loading import check_deployment
from broker.loading.host_folders import exposed_folder_problem, workspace_root

from .conftest import ECHO, GUIDE, Tree

FILE = "deployment.toml"


def agent(package: str, mounts: str = "") -> dict[str, str]:
    text = f'[[agents]]\nid = "guide"\npackage = "{package}"\n'
    if mounts:
        text += f"[agents.mounts]\n{mounts}\n"
    return {FILE: text}


def test_a_package_holding_the_deployment_file_is_refused(tree: Tree) -> None:
    # The red-team case: `check` said valid, then a tool printed /agent/deployment.toml.
    tree.write({"vessel.toml": GUIDE, "tools/echo.toml": ECHO, "tools/echo.py": "print(1)\n"})
    tree.expect(agent("."), FILE, "agents[0].package", "'.' holds the deployment file")


def test_a_package_holding_the_deployment_file_deep_down_is_refused(tree: Tree) -> None:
    # The deployment sits two folders below the package folder.
    deep = tree.root / "guide" / "etc" / "deploy"
    deep.mkdir(parents=True)
    (deep / FILE).write_text('[[agents]]\nid = "guide"\npackage = "../.."\n')
    lines = [str(p) for p in check_deployment(deep / FILE)]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{deep / FILE}: agents[0].package: '../..' holds the deployment")


def test_a_package_reached_through_a_symlink_is_judged_by_its_target(tree: Tree) -> None:
    (tree.root / "link").symlink_to(tree.root)
    tree.expect(agent("link"), FILE, "agents[0].package", "holds the deployment file")


def test_the_host_root_as_package_is_refused(tree: Tree) -> None:
    tree.expect(agent("/"), FILE, "agents[0].package", "'/' is the host's root folder")


@pytest.mark.parametrize("source", ["/proc", "/proc/self", "/sys", "/sys/kernel", "/dev"])
def test_a_kernel_folder_is_refused_as_package(tree: Tree, source: str) -> None:
    kernel = "/" + source.split("/")[1]
    tree.expect(agent(source), FILE, "agents[0].package", f"inside {kernel}, the kernel's own")


@pytest.mark.parametrize("source", ["/proc", "/proc/self", "/sys/kernel", "/dev", "/dev/shm"])
def test_a_kernel_folder_is_refused_as_mount(tree: Tree, source: str) -> None:
    kernel = "/" + source.split("/")[1]
    tree.expect(
        agent("guide", f'"/data" = "{source}"'),
        FILE,
        'agents[0].mounts."/data"',
        f"{source!r} is inside {kernel}, the kernel's own folder",
    )


def test_a_symlink_into_proc_is_refused_as_mount(tree: Tree) -> None:
    (tree.root / "data" / "self").symlink_to("/proc/self")
    tree.expect(
        agent("guide", '"/data" = "data/self"'), FILE, 'agents[0].mounts."/data"', "inside /proc"
    )


@pytest.fixture
def workspaces(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$VESSEL_WORKSPACE_ROOT at `spool/workspaces`, with a turn's folder in it."""
    root = tree.root / "spool" / "workspaces"
    (root / "guide" / "turn").mkdir(parents=True)
    monkeypatch.setenv(ENV_WORKSPACE_ROOT, str(root))
    return root


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("spool/workspaces", "is inside the workspace root"),
        ("spool/workspaces/guide/turn", "is inside the workspace root"),
        ("spool", "holds the workspace root"),
    ],
)
def test_the_workspace_root_is_refused_as_mount(
    tree: Tree, workspaces: Path, source: str, fragment: str
) -> None:
    line = tree.expect(
        agent("guide", f'"/data" = "{source}"'), FILE, 'agents[0].mounts."/data"', fragment
    )
    assert str(workspaces.resolve()) in line and ENV_WORKSPACE_ROOT in line


def test_a_package_inside_the_workspace_root_is_refused(tree: Tree, workspaces: Path) -> None:
    (workspaces / "guide" / "turn" / "vessel.toml").write_text("")
    tree.expect(
        agent("spool/workspaces/guide/turn"), FILE, "agents[0].package", "inside the workspace"
    )


def test_a_folder_beside_the_workspace_root_is_accepted(tree: Tree, workspaces: Path) -> None:
    (tree.root / "spool" / "data").mkdir()
    tree.write(agent("guide", '"/data" = "spool/data"'))
    assert tree.problems() == []


def test_the_default_workspace_root_is_guarded(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_WORKSPACE_ROOT, raising=False)
    assert workspace_root() == DEFAULT_WORKSPACE_ROOT
    # /var/lib exists on every host, and holds /var/lib/vessel-workers/workspaces.
    tree.expect(
        agent("guide", '"/data" = "/var/lib"'),
        FILE,
        'agents[0].mounts."/data"',
        f"holds the workspace root {str(DEFAULT_WORKSPACE_ROOT)!r}",
    )


def test_the_rule_is_one_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Plugin folders use the same function; its answers complete "<folder> ...".
    monkeypatch.setenv(ENV_WORKSPACE_ROOT, str(tmp_path / "ws"))
    deployment = tmp_path / "deploy" / FILE
    assert exposed_folder_problem(tmp_path / "plugins", deployment) is None
    assert "deployment file" in str(exposed_folder_problem(tmp_path, deployment))
    assert "root folder" in str(exposed_folder_problem(Path("/"), deployment))
    assert "workspace root" in str(exposed_folder_problem(tmp_path / "ws" / "a", deployment))
    assert "/sys" in str(exposed_folder_problem(Path("/sys/fs"), deployment))
