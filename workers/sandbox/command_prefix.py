"""Which command every sandbox call starts with: the static Landlock prefix, or Perl's.

Both do the same (`landlock.py`): apply the Landlock ruleset inside the sandbox,
after bwrap's mounts; take PWD out of the environment; exec the tool's command.
They differ in what they cost. Perl's interpreter starts for every call (about
1.6 ms of CPU here); `landlock_exec.c`, the same steps as a static executable
with no libc and nothing read from the sandbox's filesystem, costs about
0.07 ms over the tool's own exec (bench/README.md, issue 20).

The static prefix is built once per install, with a C compiler:

    python -m workers.sandbox.command_prefix            # into <venv>/libexec/vessel-workers/
    python -m workers.sandbox.command_prefix PATH       # anywhere

`scripts/setup.sh` and `sandbox.Dockerfile` do it. A worker uses it when it is
there: it copies the file into its stage (`system_stage.py`), which every call
binds read-only at /.vessel, so the prefix is at `STATIC_MOUNT` inside and a
root worker's sandbox uid need not reach the original; else the Perl one-liner
(/usr/bin/perl: perl-base is Essential in Debian). `VESSEL_LANDLOCK_EXEC` names
another path, or `perl` to keep the Perl prefix. The start-up probe runs
whichever is chosen in its report mode and names it in the log line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.sandbox import landlock

__all__ = [
    "ENV_LANDLOCK_EXEC",
    "SOURCE",
    "STATIC_MOUNT",
    "BuildFailed",
    "CommandPrefix",
    "build",
    "choose",
    "default_path",
    "main",
    "perl_prefix",
]

#: Names the static prefix's host path, or `perl` (the Perl prefix, always).
ENV_LANDLOCK_EXEC = "VESSEL_LANDLOCK_EXEC"
#: Where the static prefix appears inside every call (in the stage, beside /etc).
STATIC_MOUNT = "/.vessel/landlock-exec"
SOURCE = Path(__file__).resolve().parent / "landlock_exec.c"

#: Static, no libc, no start files: `_start` is the C file's own.
_CFLAGS = (
    "-Os",
    "-static",
    "-nostdlib",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    "-fno-pie",
    "-no-pie",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wl,--build-id=none",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandPrefix:
    """The words bwrap executes before the tool's command, and what they need bound."""

    #: Prepended to the tool's command (the report flag goes after them).
    argv: tuple[str, ...]
    #: The host file copied into the stage, at `argv[0]` inside (None: the
    #: sandbox's /usr has it).
    binary: Path | None = None
    #: (name, value) set for the prefix alone (it deletes them before it execs the
    #: tool). A tuple: the prefix keys bwrap's cached fixed options, env included.
    env: tuple[tuple[str, str], ...] = ()
    #: For the start-up log and the errors that name it.
    describe: str = ""

    @property
    def program(self) -> str:
        """What bwrap execs (a path inside the sandbox)."""
        return self.argv[0]

    @property
    def host_file(self) -> str:
        """The file on the host the calls need: the one the stage copies, or /usr's (the
        sandbox's /usr is the host's)."""
        return str(self.binary or self.program)

    def missing_text(self) -> str:
        """A call's error when the prefix is gone: the tool never ran."""
        fix = (
            "rebuild it: python -m workers.sandbox.command_prefix"
            if self.binary is not None
            else "install perl-base"
        )
        return (
            f"[sandbox error: {self.program} not found: every call starts with it "
            f"(it applies the Landlock ruleset, then runs the tool); {fix}]"
        )


def perl_prefix() -> CommandPrefix:
    """The Perl one-liner (`landlock.COMMAND_PREFIX`)."""
    return CommandPrefix(
        argv=landlock.COMMAND_PREFIX,
        env=tuple(landlock.PREFIX_ENV.items()),
        describe=f"the Perl prefix ({landlock.PERL})",
    )


def default_path() -> Path:
    """Where `build` puts the static prefix by default: beside this interpreter's install."""
    return Path(sys.prefix) / "libexec" / "vessel-workers" / "landlock-exec"


def choose(env: Mapping[str, str] = os.environ) -> CommandPrefix:
    """The static prefix if it is built here, else Perl's.

    Raises ValueError if `VESSEL_LANDLOCK_EXEC` names a file that is not an executable
    this worker can read (it copies it): an operator's setting that does nothing
    would hide its mistake.
    """
    asked = env.get(ENV_LANDLOCK_EXEC, "").strip()
    if asked == "perl":
        return perl_prefix()
    path = Path(asked) if asked else default_path()
    if not (path.is_file() and os.access(path, os.R_OK | os.X_OK)):
        if asked:
            raise ValueError(
                f"{ENV_LANDLOCK_EXEC}={asked}: not an executable file this worker can read "
                f"(build it with `python -m workers.sandbox.command_prefix {asked}`, or set "
                "it to `perl`)"
            )
        return perl_prefix()
    return CommandPrefix(
        argv=(STATIC_MOUNT,), binary=path.resolve(), describe=f"the static prefix ({path})"
    )


class BuildFailed(RuntimeError):
    """No C compiler, or it refused the source."""


def build(dest: Path | None = None, *, cc: str | None = None) -> Path:
    """Compile `landlock_exec.c` into `dest` (default: `default_path()`); return it.

    Written beside `dest` and renamed over it: a worker binding the old file
    meanwhile binds a whole one.
    """
    dest = (dest or default_path()).absolute()
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildFailed("no C compiler (cc or gcc) found: apt-get install -y gcc")
    dest.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *_CFLAGS, "-o", tmp, str(SOURCE)],
            check=False,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BuildFailed(f"{compiler} failed on {SOURCE}:\n{done.stderr.strip()}")
        os.chmod(tmp, 0o755)  # noqa: S103 (every sandbox uid executes it)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m workers.sandbox.command_prefix [DEST]", file=sys.stderr)
        return 2
    try:
        path = build(Path(args[0]) if args else None)
    except (BuildFailed, OSError) as exc:
        print(f"command_prefix: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
