"""Settings of the sandbox worker that name one of a few choices, read from its
environment once (`VESSEL_SANDBOX_CGROUPS`, `VESSEL_SANDBOX_NETWORK`,
`VESSEL_SANDBOX_STANDBY`): one reading and one error text for all of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

__all__ = ["choice_of", "env_choice"]

_Choice = TypeVar("_Choice", bound=str)


def choice_of(name: str, value: str, choices: tuple[_Choice, ...]) -> _Choice:
    """The one of `choices` that `value` is; ValueError naming the setting, what it was
    and what it may be, if none."""
    for choice in choices:
        if value == choice:
            return choice
    raise ValueError(f"{name}={value!r}: expected one of {', '.join(choices)}")


def env_choice(environ: Mapping[str, str], name: str, choices: tuple[_Choice, ...]) -> _Choice:
    """`environ[name]`, spaces stripped, as one of `choices` (unset or empty: the first)."""
    return choice_of(name, environ.get(name, "").strip() or choices[0], choices)
