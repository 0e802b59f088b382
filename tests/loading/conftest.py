"""A small valid deployment in tmp_path that each test breaks in one place.

The working directory is the deployment's folder, so problem lines read as an
operator would see them: `guide/tools/echo.toml: name: ...`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from broker.loading import check_deployment, load_deployment
from broker.model import Deployment

DEPLOYMENT = """\
[[agents]]
id = "guide"
package = "guide"
[agents.mounts]
"/data" = "data"

[[agents]]
id = "records"
package = "records"
[agents.services.records]
url = "http://127.0.0.1:8000"
headers = { "X-Internal-Token" = "env:RECORDS_TOKEN" }
"""

GUIDE = """\
[tools]
declared = ["tools/echo.toml"]
"""

ECHO = """\
name = "echo"
description = "Echo the arguments."
command = ["python3", "{package}/tools/echo.py"]
[parameters]
type = "object"
[parameters.properties.text]
type = "string"
"""

RECORDS = """\
[tools]
declared = ["tools/lookup.toml"]
"""

LOOKUP = """\
name = "lookup"
description = "Look up a record by its id."
service = "records"
path = "/agent-tools/lookup"
[parameters]
type = "object"
required = ["id"]
[parameters.properties.id]
type = "string"
"""

BASE: Mapping[str, str] = {
    "deployment.toml": DEPLOYMENT,
    "guide/vessel.toml": GUIDE,
    "guide/tools/echo.toml": ECHO,
    "guide/tools/echo.py": "print('echo')\n",
    "records/vessel.toml": RECORDS,
    "records/tools/lookup.toml": LOOKUP,
    "data/hello.txt": "hello\n",
}


class Tree:
    """The deployment's folder: write or remove files, then check or load it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.write(BASE)

    def write(self, files: Mapping[str, str | bytes | None]) -> None:
        """Write each file (creating folders); None removes it."""
        for name, content in files.items():
            path = self.root / name
            if content is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)

    def problems(self, deployment: str = "deployment.toml") -> list[str]:
        return [str(p) for p in check_deployment(deployment)]

    def load(self, deployment: str = "deployment.toml") -> Deployment:
        return load_deployment(deployment)

    def only_problem(self, files: Mapping[str, str | bytes | None]) -> str:
        """Write `files` and return the one problem line they cause."""
        self.write(files)
        lines = self.problems()
        assert len(lines) == 1, lines
        return lines[0]

    def expect(
        self, files: Mapping[str, str | bytes | None], file: str, field: str, fragment: str
    ) -> str:
        """`files` cause exactly one problem, `FILE: FIELD: message` with `fragment` in it."""
        line = self.only_problem(files)
        prefix = f"{file}: {field}: "
        assert line.startswith(prefix), line
        assert fragment in line[len(prefix) :], line
        return line


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tree]:
    monkeypatch.chdir(tmp_path)
    yield Tree(tmp_path)
