"""sandbox.Dockerfile: every file it copies exists, every package it installs is
Debian's, it runs as a non-root user, and its command is an entry point we ship."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import PurePosixPath

import pytest
from conftest import REPO

from .conftest import APT_LIST, DOCKERFILE, STEPS, Instruction, apt_packages


def _all(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def _exec_form(instruction: Instruction) -> list[str]:
    """CMD/ENTRYPOINT: the JSON (exec) form, the one that gets signals."""
    value = json.loads(instruction.arguments)
    assert isinstance(value, list), f"line {instruction.line}: use the exec form"
    return [str(v) for v in value]


def _copy_sources(instruction: Instruction) -> list[str]:
    words = [w for w in shlex.split(instruction.arguments) if not w.startswith("--")]
    if words and words[0].startswith("["):  # JSON form
        words = json.loads(instruction.arguments)
    assert len(words) >= 2, f"line {instruction.line}: COPY needs a source and a target"
    return words[:-1]


def _env(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in _all(instructions, "ENV"):
        for word in shlex.split(instruction.arguments):
            name, _, value = word.partition("=")
            env[name] = value
    return env


def _final_stage(instructions: list[Instruction]) -> list[Instruction]:
    """The instructions of the image's last stage (the one that ships)."""
    last = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    return instructions[last:]


def test_base_image_is_debian_12_python_311(instructions: list[Instruction]) -> None:
    stages = _all(instructions, "FROM")
    assert stages[-1].arguments == "python:3.11-slim-bookworm"
    # The build stages are the same Debian 12, so what they compile runs in the image.
    for stage in stages[:-1]:
        assert stage.arguments.split()[0] == "python:3.11-slim-bookworm"


def test_the_static_landlock_prefix_is_built_and_put_where_workers_look(
    instructions: list[Instruction],
) -> None:
    from workers.sandbox import command_prefix

    stages = _all(instructions, "FROM")
    name = stages[0].arguments.split()[-1]
    built = [
        i for i in _all(instructions, "RUN") if "workers.sandbox.command_prefix" in i.arguments
    ]
    assert len(built) == 1
    out = shlex.split(built[0].arguments)[-1]
    copied = [i for i in _all(instructions, "COPY") if f"--from={name}" in i.arguments]
    assert len(copied) == 1
    source, target = shlex.split(copied[0].arguments)[-2:]
    assert source == out
    # The final stage's virtualenv is sys.prefix there: command_prefix.default_path()'s place.
    venv = PurePosixPath(_env(instructions)["PATH"].split(":")[0]).parent
    relative = command_prefix.default_path().relative_to(sys.prefix)
    assert PurePosixPath(target) == venv / relative.as_posix()
    # The image itself installs no compiler.
    final_installs = [
        i for i in _all(_final_stage(instructions), "RUN") if "apt-get install" in i.arguments
    ]
    assert all("gcc" not in i.arguments for i in final_installs)


def test_every_copied_file_exists(instructions: list[Instruction]) -> None:
    copies = [i for i in _all(instructions, "COPY") if "--from=" not in i.arguments]
    assert copies
    for instruction in copies:
        for source in _copy_sources(instruction):
            path = REPO / source
            assert path.exists(), f"line {instruction.line}: COPY {source}: no such file"
            assert path.resolve().is_relative_to(REPO)


def test_the_project_is_copied_whole_enough_to_install(instructions: list[Instruction]) -> None:
    """What `pip install` of the image needs: the build file, the readme it names, the packages."""
    copied = {s.rstrip("/") for i in _all(instructions, "COPY") for s in _copy_sources(i)}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= copied, f"not copied: {sorted(needed - copied)}"


def test_apt_packages_come_from_the_one_list(instructions: list[Instruction]) -> None:
    list_path = APT_LIST.relative_to(REPO).as_posix()
    copied = [i for i in _all(instructions, "COPY") if list_path in _copy_sources(i)]
    assert copied, f"the Dockerfile does not copy {list_path}"
    target = shlex.split(copied[0].arguments)[-1]
    final = _final_stage(instructions)
    installs = [i for i in _all(final, "RUN") if "apt-get install" in i.arguments]
    assert len(installs) == 1, "install the packages in one place"
    run = installs[0].arguments
    assert target in run and "--no-install-recommends" in run and "apt-get update" in run
    # CI runs the same list on its own machine.
    assert list_path in STEPS.read_text()


def test_apt_list_has_what_the_sandbox_needs() -> None:
    assert {"bubblewrap", "libseccomp2", "util-linux"} <= set(apt_packages())


@pytest.fixture(scope="module")
def debian_packages() -> set[str]:
    """The names of .ci/apt-packages.txt that Debian's package lists know (one apt-cache run)."""
    apt_cache = shutil.which("apt-cache")
    assert apt_cache is not None, "apt-cache is missing: these tests run on Debian 12"
    done = subprocess.run(
        [apt_cache, "show", "--no-all-versions", *apt_packages()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return set(re.findall(r"^Package: (\S+)$", done.stdout, re.MULTILINE))


@pytest.mark.parametrize("package", apt_packages())
def test_apt_package_exists_in_debian(package: str, debian_packages: set[str]) -> None:
    assert package in debian_packages, (
        f"apt-cache does not know {package} (run apt-get update; CI does)"
    )


def test_runs_as_a_non_root_user(instructions: list[Instruction]) -> None:
    users = _all(instructions, "USER")
    assert users, "no USER: the image would run as root"
    user = users[-1].arguments.split(":")[0]
    assert user not in ("root", "0")
    # The user is created in the image, with a fixed uid (compose's tmpfs names it).
    created = [i for i in _all(instructions, "RUN") if "useradd" in i.arguments]
    assert created
    assert re.search(rf"useradd .*--uid (\d+) .*\b{user}\b", created[0].arguments)
    assert not re.search(r"useradd .*--uid 0\b", created[0].arguments)
    # Nothing runs after USER as root again, and no instruction after it is RUN as root.
    assert instructions.index(users[-1]) > max(instructions.index(i) for i in created)


def test_the_workspace_root_belongs_to_the_user(instructions: list[Instruction]) -> None:
    env = _env(instructions)
    root = env["VESSEL_WORKSPACE_ROOT"]
    user = _all(instructions, "USER")[-1].arguments.split(":")[0]
    made = [i for i in _all(instructions, "RUN") if root in i.arguments]
    assert made, f"nothing creates {root}"
    assert re.search(rf"-o {user}\b", made[0].arguments)
    assert "-m 0700" in made[0].arguments


def test_the_command_is_a_sandbox_worker(instructions: list[Instruction]) -> None:
    from workers.cli import build_parser

    (entrypoint,) = _all(instructions, "ENTRYPOINT")
    (cmd,) = _all(instructions, "CMD")
    init = _exec_form(entrypoint)
    command = _exec_form(cmd)
    # tini, installed from the list, is PID 1.
    assert init == ["/usr/bin/tini", "--"]
    assert "tini" in apt_packages()
    assert command[0] == "vessel-workers"
    args = build_parser().parse_args(command[1:])
    assert (args.verb, args.kind) == ("worker", "sandbox")
    assert str(args.deployment) == _env(instructions)["VESSEL_DEPLOYMENT"]


def test_the_entry_point_is_on_the_images_path(instructions: list[Instruction]) -> None:
    """`vessel-workers` is installed by pip into the virtualenv that PATH starts with."""
    env = _env(instructions)
    first = PurePosixPath(env["PATH"].split(":")[0])
    installs = [i for i in _all(instructions, "RUN") if "pip install" in i.arguments]
    assert installs
    assert f"{first}/pip install" in installs[0].arguments
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "vessel-workers" in project["project"]["scripts"]


def test_the_worker_code_is_outside_what_the_sandbox_binds(
    instructions: list[Instruction],
) -> None:
    """The sandbox binds /usr (and a few /etc files); the venv must live elsewhere."""
    venv = PurePosixPath(_env(instructions)["PATH"].split(":")[0]).parent
    assert venv.parts[1] not in ("usr", "bin", "lib", "lib64", "sbin", "etc", "tmp")


def test_ci_runs_the_dockerfile_steps() -> None:
    text = STEPS.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text
    ci = (REPO / ".ci" / "run").read_text()
    assert ".ci/dockerfile_steps.sh" in ci
    # The steps copy what the Dockerfile copies (the same build context).
    assert "cp pyproject.toml README.md" in text
    assert "cp -r broker workers" in text


def test_dockerfile_is_named_as_compose_builds_it() -> None:
    assert DOCKERFILE.name == "sandbox.Dockerfile"
    assert DOCKERFILE.is_file()
