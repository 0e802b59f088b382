"""Final names: what a name the operator wrote means, and "did you mean".

Declared and service tools keep their names; a plugin tool's final name is
`<slug>__<key>` (seed 002), so two plugins may both have `search`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["MODEL_NAME_LIMIT", "did_you_mean", "plugin_tool_name"]

#: The model APIs refuse a tool name longer than this (broker.tool_formats).
MODEL_NAME_LIMIT = 64


def plugin_tool_name(slug: str, key: str) -> str:
    """A plugin tool's final name."""
    return f"{slug}__{key}"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest of `known`, or '' when none is close.

    A name without its plugin's prefix (`get_forecast` for `weather__get_forecast`)
    is matched to the final names that end with it, the likeliest slip; then
    the closest by spelling; then one that begins the other.
    """
    names = sorted(set(known))
    suffixed = [n for n in names if n.endswith(f"__{name}")]
    close = suffixed[:1] or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    close = close or [n for n in names if name.startswith(n) or n.startswith(name)][:1]
    return f"; did you mean {close[0]!r}?" if close else ""
