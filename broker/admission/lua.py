"""The admission scripts as Redis runs them: the constants, the shared library, the script.

Each script in `scripts/` is sent as one text: the `local` lines of
`broker.admission.keys.lua_preamble` (every key prefix and number, from the
one Python definition), then `scripts/lib.lua`, then the script itself.
"""

from __future__ import annotations

from pathlib import Path

from broker.admission.keys import lua_preamble

__all__ = ["SCRIPTS", "script_text"]

#: The operations, one file each in `scripts/` (`lib.lua` is shared by all).
SCRIPTS: tuple[str, ...] = (
    "submit",
    "claim",
    "finish",
    "release",
    "complete",
    "cancel",
    "heartbeat",
    "recover",
    "route",
    "home",
    "probe",
)

# Shipped next to this module (package-data "admission/scripts/*.lua").
_FOLDER = Path(__file__).resolve().parent / "scripts"


def script_text(name: str) -> str:
    """The whole text Redis runs for the operation `name` (one of `SCRIPTS`)."""
    if name not in SCRIPTS:
        raise ValueError(f"{name!r} is not an admission script ({', '.join(SCRIPTS)})")
    lib = (_FOLDER / "lib.lua").read_text(encoding="utf-8")
    body = (_FOLDER / f"{name}.lua").read_text(encoding="utf-8")
    return f"{lua_preamble()}{lib}\n{body}"
