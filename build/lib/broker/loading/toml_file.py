"""Reading one TOML file into a table, or saying in one line why it cannot be read."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from broker.loading.fields import Problems

__all__ = ["FILE_FIELD", "MAX_FILE_BYTES", "read_toml"]

#: The FIELD of a problem about a file as a whole (missing, not UTF-8, bad TOML).
FILE_FIELD = "(file)"

#: Deployment, package and tool files are small; a larger one is a mistake (or
#: hostile) and is refused before it is parsed. 500 agents take about 50 kB.
MAX_FILE_BYTES = 4 * 1024 * 1024


def read_toml(path: Path, *, shown: str, problems: Problems) -> dict[str, Any] | None:
    """The file's top-level table; None (with one problem added) if it cannot be read.

    `shown` is the path as the user reaches it from their working directory,
    used in the problem line.
    """

    def refuse(message: str) -> None:
        problems.add(shown, FILE_FIELD, message)

    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        refuse("no such file")
        return None
    except IsADirectoryError:
        refuse("is a folder, not a file")
        return None
    except OSError as exc:
        refuse(f"cannot be read: {exc.strerror or exc}")
        return None
    if len(raw) > MAX_FILE_BYTES:
        refuse(f"is larger than {MAX_FILE_BYTES} bytes")
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        refuse(f"is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})")
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Python 3.11's message ends with "(at line L, column C)".
        refuse(f"invalid TOML: {exc}")
    except RecursionError:
        refuse("invalid TOML: nested too deeply")
    return None
