"""A standby sandbox: the next call's bwrap started before the call comes.

Most of a declared call's start is bwrap's own set-up (the namespaces, every
bind and remount, the seccomp filter), none of which depends on the call's
command or arguments. So after a call, the runner has the same slot launcher
start the next one's sandbox at once (`Launcher.send_spawn`: not waited for):
the same options (the agent's package, data mounts, workdir, the stage, and a
fresh one-call workspace, or for a turn's call its launcher's hole: the call's
turn workspace, with a fresh outbox of the call's own over its outbox/, is
mounted there when the call comes, `launcher_holes.py`; where the launcher has
no hole, the turn's workspace itself, so it serves that turn only), with
`landlock-exec --vessel-standby` as its command
(`landlock_exec.c`). The static prefix waits there, before it applies
anything, for the command on its fd 5 (`STANDBY_FD`): the length, then the
NUL-terminated words. The next call with the same `key` writes its command
and goes on as any call: the deadline starts when the command is written;
the signals, the Landlock domain and the environment rule are applied after
it; the output and stdin pipes were made with the standby and are driven as
a call's (`process.drive_child`).

What does not change: the confinement (the same bwrap options, the same
prefix, the same limits: the key holds everything they are made of), the
workspace (a one-call one made for that one call, never seen by another: the
standby has run nothing before its command comes; a turn's, as its calls share
it), and the rule that a launcher's calls run one after another (the standby
is the launcher's child, started once the previous call's processes were all
reaped).

Only where it is worth it: the runner starts one after a call whose key was
that of two of the worker process's four calls before it (an agent's calls in
a row, or a turn's, not a mix of agents or turns each leaving a standby nobody
takes); a
call takes a launcher whose standby fits it first, then one with none; a free
launcher whose standby does not fit the call is given the call after its
standby is killed. A standby older than `max_age` (half the workspaces' TTL:
the sweep never removes a workspace a standby holds), or bound to a turn's
workspace that was removed since (another folder at the same path is not the
one it binds), is killed instead of used; so is one at the hole whose call's
workspace the launcher cannot mount (the call starts the usual way); so is one
no call took within `STANDBY_IDLE_SECONDS` (the worker's housekeeping,
`SandboxRunner.drop_idle_standbys`: the calls it was started for have stopped
coming, and it holds a slot's launcher and a workspace).
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from workers.sandbox.env_choice import env_choice
from workers.sandbox.launcher_client import LaunchedChild, Launcher

__all__ = [
    "ENV_SANDBOX_STANDBY",
    "HOLE_MARK",
    "STANDBY_ARGS",
    "STANDBY_BYTES",
    "STANDBY_FLAG",
    "STANDBY_IDLE_SECONDS",
    "STANDBY_MODES",
    "Standby",
    "StandbyCounts",
    "StandbyLost",
    "prefix_takes_holes",
    "prefix_takes_standby",
    "standby_mode",
]

#: `on` (default): a call may find its sandbox started ahead; `off`: never.
ENV_SANDBOX_STANDBY = "VESSEL_SANDBOX_STANDBY"
STANDBY_MODES = ("on", "off")

#: The static prefix's flag for it (`landlock_exec.c`).
STANDBY_FLAG = "--vessel-standby"
#: The largest command a standby takes (`landlock_exec.c`'s buffers): a call with
#: a larger one kills the standby and starts its sandbox the usual way.
STANDBY_BYTES = 256 * 1024
STANDBY_ARGS = 8192
#: The static prefix's word for "enters its working directory again" (`landlock_exec.c`).
HOLE_MARK = b"vessel-standby-enters-workdir-again"
_LENGTH = struct.Struct("=Q")
#: A standby no call took this long after its start is killed by the sandbox worker's
#: housekeeping (which runs every minute: so it goes within two). The calls a standby
#: is for come close together: one a minute old is for calls that stopped.
STANDBY_IDLE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class StandbyCounts:
    """A worker process's standbys: started, taken by a call, killed unused (all so
    far), and waiting now (the `vessel_sandbox_standbys` metrics)."""

    started: int
    used: int
    unused: int
    waiting: int


def standby_mode(environ: Mapping[str, str]) -> str:
    """`$VESSEL_SANDBOX_STANDBY` (unset or empty: on); ValueError if unknown."""
    return env_choice(environ, ENV_SANDBOX_STANDBY, STANDBY_MODES)


def prefix_takes_standby(binary: Path | None) -> bool:
    """True if `binary` is a static prefix that knows STANDBY_FLAG (one built from an
    older source does not: a worker with it starts every sandbox at its call)."""
    return _binary_holds(binary, STANDBY_FLAG.encode())


def prefix_takes_holes(binary: Path | None) -> bool:
    """True if `binary` (a static prefix that takes standbys) enters its working
    directory again once a standby's command comes (`landlock_exec.c`), as a standby
    bound to its launcher's hole needs (`launcher_holes.py`)."""
    return _binary_holds(binary, HOLE_MARK)


def _binary_holds(binary: Path | None, mark: bytes) -> bool:
    if binary is None:
        return False
    try:
        return mark in binary.read_bytes()
    except OSError:
        return False


def _identity(folder: Path) -> tuple[int, int] | None:
    try:
        st = folder.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class StandbyLost(OSError):
    """A standby could not take its call's command; the call starts the usual way."""


class Standby:
    """One started sandbox waiting for its command, and what it holds."""

    def __init__(
        self,
        *,
        key: Hashable,
        launcher: Launcher,
        out_fd: int,
        in_fd: int | None,
        command_fd: int,
        workspace: Path,
        outbox: Path | None,
        stage: Path,
        on_discard: Callable[[Standby], None],
        hole: bool = False,
    ) -> None:
        self.key = key
        self.launcher = launcher
        #: Its bwrap, once the launcher's answer to the request is read (`_started`).
        self.child: LaunchedChild | None = None
        self.out_fd = out_fd
        self.in_fd = in_fd
        self.command_fd = command_fd
        #: The workspace bound at /tmp/vessel (a fresh one-call one, or the turn's), the
        #: call's own outbox bound over its outbox/ (a turn's call; None: the one-call
        #: workspace's own), and the stage at /.vessel.
        self.workspace = workspace
        self.outbox = outbox
        self.stage = stage
        #: `workspace` is its launcher's hole: the call's workspace is mounted there
        #: when the call comes (`at_call`, `launcher_holes.py`), so any turn's fits.
        self.hole = hole
        #: A standby at the hole: the launcher was asked to mount the call's workspace
        #: (`at_call`) and its answer is not read yet; or why it could not be asked.
        self._mount_asked = False
        self._mount_refused: str | None = None
        #: The workspace folder itself: a turn's removed and made again is another.
        self._workspace_id = None if hole else _identity(workspace)
        self.born = time.monotonic()
        #: Set once it took a call's command.
        self.released = False
        self._on_discard = on_discard

    def _started(self) -> LaunchedChild | None:
        """Its bwrap (the launcher's answer read now if it was not); None if the launcher
        could not start it."""
        if self.child is None and not self.launcher.broken:
            try:
                self.child = self.launcher.spawned()
            except OSError:
                return None
        return self.child

    def usable(self, max_age: float) -> bool:
        """True if it started and is still waiting (no exit from its launcher), and young."""
        if time.monotonic() - self.born > max_age or self._started() is None:
            return False
        if self.launcher.has_message():
            return False
        return self.hole or _identity(self.workspace) == self._workspace_id

    def at_call(self, workspace: Path) -> None:
        """The call's workspace (a standby at the hole, its `outbox/` mount point made):
        the launcher is asked now to mount it, with the standby's outbox, and mounts it
        while the worker readies the call; `release` reads its answer first."""
        try:
            self.launcher.send_mount(workspace, self.outbox)
            self._mount_asked = True
        except OSError as exc:
            self._mount_refused = str(exc)

    def _mount_answered(self, child: LaunchedChild) -> str | None:
        """Read the launcher's answer to `at_call`'s request: None if it mounted, else why not."""
        if not self._mount_asked:
            return self._mount_refused or "no workspace given for the call"
        self._mount_asked = False
        try:
            self.launcher.mounted(child)
        except OSError as exc:
            return str(exc)
        return None

    def release(self, command: Sequence[str]) -> tuple[LaunchedChild, int, int | None]:
        """Give it `command`: the call's child, output and stdin ends, now the caller's,
        as its workspace and stage are. StandbyLost if it cannot take the command (too
        large, or the standby is gone): it is then killed, its workspace and stage
        the caller's all the same (nothing ran in it), its launcher free again."""
        child = self._started()
        if child is None:
            self.cancel()
            raise StandbyLost("the standby sandbox did not start")
        data = b"".join(os.fsencode(word) + b"\0" for word in command)
        if not 0 < len(data) <= STANDBY_BYTES or len(command) > STANDBY_ARGS:
            self.cancel()  # more than the prefix's buffers hold
            raise StandbyLost("the command is larger than a standby takes")
        if self.hole:
            refused = self._mount_answered(child)
            if refused is not None:
                self.cancel()
                raise StandbyLost(f"the call's workspace was not mounted: {refused}")
        try:
            view = memoryview(_LENGTH.pack(len(data)) + data)
            while view:
                view = view[os.write(self.command_fd, view) :]
        except OSError as exc:
            self.cancel()
            raise StandbyLost(f"the standby sandbox is gone: {exc}") from exc
        os.close(self.command_fd)
        self.command_fd = -1
        self.launcher.standby = None
        self.released = True
        return child, self.out_fd, self.in_fd

    def cancel(self) -> None:
        """Kill it, wait for its exit and close its pipes; its workspace and stage stay
        held (the caller's, or `discard`'s to let go)."""
        if self.launcher.standby is self:
            self.launcher.standby = None
        child = self._started()
        if child is not None and self._mount_asked:  # its answer comes before the exit
            self._mount_answered(child)
        if child is not None:
            child.kill_tree()
            with contextlib.suppress(OSError):  # LauncherLost: the launcher is marked broken
                child.wait(None)
            child.close()
        self._close_fds()

    def discard(self) -> None:
        """`cancel` it and let its workspace and stage go."""
        self.cancel()
        self._on_discard(self)

    def abandon(self) -> None:
        """In a forked child: close this process's copies of its pipes, nothing else."""
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in (self.out_fd, self.in_fd, self.command_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.out_fd, self.in_fd, self.command_fd = -1, None, -1
