"""Reading one TOML table field by field, collecting a `Problem` for each mistake.

The loaders never raise on bad input: every check that fails adds one problem
(`FILE: FIELD: what is wrong`) and the reader returns None for that field, so
the caller can go on and find the next mistake. Unknown keys are refused when
the table is opened, so a typo is named even when everything else is wrong.
"""

from __future__ import annotations

import datetime
import difflib
import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from broker.errors import Problem

__all__ = ["Problems", "Table", "field_path", "type_name"]

# TOML bare keys; anything else is shown quoted, as it would be written in TOML.
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def field_path(where: str, key: str | int) -> str:
    """`where` + one more step: `agents[1]`, `services.records`, `mounts."/data"`."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    step = key if _BARE_KEY.fullmatch(key) else _quoted(key)
    return f"{where}.{step}" if where else step


def _quoted(key: str) -> str:
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def type_name(value: object) -> str:
    """What a TOML value is, in words ("a boolean", "a table", ...)."""
    # bool before int: in Python a bool is an int, in TOML it is not a number.
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime.date | datetime.time):
        return "a date or time"
    return type(value).__name__


class Problems:
    """The problems found so far, in the order found, without repeats."""

    def __init__(self) -> None:
        self._found: dict[Problem, None] = {}

    def add(self, file: str, field: str, message: str) -> None:
        self._found.setdefault(Problem(file=file, field=field, message=message), None)

    def __len__(self) -> int:
        return len(self._found)

    def as_list(self) -> list[Problem]:
        return list(self._found)


class Table:
    """One TOML table of one file: typed getters that report what is wrong.

    `keys` are the keys this table may hold; any other is refused at once,
    with the closest known key suggested.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        file: str,
        where: str,
        keys: Collection[str],
        problems: Problems,
    ) -> None:
        self.data = data
        self.file = file
        self.where = where
        self.problems = problems
        for key in data:
            if key not in keys:
                self.problem(key, _unknown_key(key, keys))

    def field(self, key: str | int) -> str:
        return field_path(self.where, key)

    def problem(self, key: str | int, message: str) -> None:
        self.problems.add(self.file, self.field(key), message)

    def has(self, key: str) -> bool:
        return key in self.data

    def _typed(self, key: str, kind: type | tuple[type, ...], what: str) -> Any:
        """The value if it has the wanted type, else None (a problem is added)."""
        value = self.data[key]
        if isinstance(value, bool) and kind is not bool:
            self.problem(key, f"must be {what}, not a boolean")
            return None
        if not isinstance(value, kind):
            self.problem(key, f"must be {what}, not {type_name(value)}")
            return None
        return value

    def string(self, key: str, *, default: str | None = None, required: bool = False) -> str | None:
        """A non-empty string (surrounding spaces do not count as content)."""
        if key not in self.data:
            if required:
                self.problem(key, "missing: this key is required")
            return default
        value = self._typed(key, str, "a string")
        if value is None:
            return None
        if not value.strip():
            self.problem(key, "must not be empty")
            return None
        return str(value)

    def positive_number(self, key: str, *, default: float | None, maximum: float) -> float | None:
        """An integer or a float, > 0, finite and at most `maximum`."""
        if key not in self.data:
            return default
        value = self._typed(key, (int, float), "a number")
        if value is None:
            return None
        if not math.isfinite(value) or value <= 0:
            self.problem(key, f"must be a positive number, not {value}")
            return None
        if value > maximum:
            self.problem(key, f"must be at most {maximum:g}, not {value}")
            return None
        return float(value)

    def positive_int(self, key: str, *, default: int, maximum: int) -> int | None:
        """An integer, > 0 and at most `maximum`."""
        if key not in self.data:
            return default
        value = self._typed(key, int, "an integer")
        if value is None:
            return None
        if value <= 0:
            self.problem(key, f"must be a positive integer, not {value}")
            return None
        if value > maximum:
            self.problem(key, f"must be at most {maximum}, not {value}")
            return None
        return int(value)

    def boolean(self, key: str, *, default: bool) -> bool | None:
        """true or false (None, a problem added, for anything else)."""
        if key not in self.data:
            return default
        value = self._typed(key, bool, "true or false")
        return None if value is None else bool(value)

    def list_of_strings(self, key: str, *, required: bool = False) -> list[str] | None:
        """A list whose items are all non-empty strings (each bad item named)."""
        if key not in self.data:
            if required:
                self.problem(key, "missing: this key is required")
            return None
        items = self._typed(key, list, "a list of strings")
        if items is None:
            return None
        good: list[str] = []
        for index, item in enumerate(items):
            where = field_path(self.field(key), index)
            if not isinstance(item, str):
                self.problems.add(self.file, where, f"must be a string, not {type_name(item)}")
            elif not item:
                self.problems.add(self.file, where, "must not be empty")
            else:
                good.append(item)
        return good if len(good) == len(items) else None

    def mapping(self, key: str) -> dict[str, Any] | None:
        """A sub-table as a plain dict (None when absent or not a table)."""
        if key not in self.data:
            return None
        value = self._typed(key, dict, "a table")
        return None if value is None else dict(value)

    def table(self, key: str, *, keys: Collection[str]) -> Table | None:
        """A sub-table, opened with its own known keys."""
        value = self.mapping(key)
        if value is None:
            return None
        return Table(
            value, file=self.file, where=self.field(key), keys=keys, problems=self.problems
        )


def _unknown_key(key: str, keys: Collection[str]) -> str:
    close = difflib.get_close_matches(key, sorted(keys), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    known = ", ".join(sorted(keys)) or "none"
    return f"unknown key (known keys: {known}){hint}"
