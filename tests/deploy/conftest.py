"""compose.yaml and sandbox.Dockerfile, parsed once for the deploy tests."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from conftest import REPO

try:
    import yaml
except ImportError:  # pragma: no cover - the test extra must carry PyYAML
    yaml = None

COMPOSE = REPO / "compose.yaml"
DOCKERFILE = REPO / "sandbox.Dockerfile"
APT_LIST = REPO / ".ci" / "apt-packages.txt"
STEPS = REPO / ".ci" / "dockerfile_steps.sh"


def load_compose() -> dict[str, Any]:
    if yaml is None:
        pytest.fail("PyYAML is missing: the test extra needs `pyyaml` to read compose.yaml")
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="session")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


def argv(command: str | list[str]) -> list[str]:
    """A service's command as an argument vector (the string form is split like a shell)."""
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) for item in env)
        return {p[0]: (p[1] if len(p) > 1 else "") for p in pairs}
    return {str(k): str(v) for k, v in env.items()}


def bind_mounts(service: dict[str, Any]) -> dict[PurePosixPath, Path]:
    """Container path -> host path of every bind mount (relative to the compose file)."""
    mounts: dict[PurePosixPath, Path] = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            if volume.get("type") != "bind":
                continue
            source, target = volume["source"], volume["target"]
        else:
            source, target, *_ = str(volume).split(":")
            if not source.startswith((".", "/")):
                continue  # a named volume
        mounts[PurePosixPath(target)] = (COMPOSE.parent / source).resolve()
    return mounts


def host_path(service: dict[str, Any], container_path: str) -> Path | None:
    """Where a container path of `service` comes from on the host, if a bind mount covers it."""
    path = PurePosixPath(container_path)
    for target, source in sorted(bind_mounts(service).items(), key=lambda m: -len(m[0].parts)):
        if path == target or target in path.parents:
            return source.joinpath(*path.relative_to(target).parts)
    return None


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int


def dockerfile_instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined = " ".join(p for p in pending if p)
        keyword, _, arguments = joined.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
        pending = []
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


@pytest.fixture(scope="session")
def instructions() -> list[Instruction]:
    return dockerfile_instructions(DOCKERFILE.read_text())


def apt_packages() -> list[str]:
    """The package names of .ci/apt-packages.txt."""
    names: list[str] = []
    for line in APT_LIST.read_text().splitlines():
        names += re.sub(r"#.*", "", line).split()
    return names
