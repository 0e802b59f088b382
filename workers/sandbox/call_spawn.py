"""The two ways a call's bwrap is started, and its output drained until it ends.

- Through a slot launcher (`launcher_client.py`): the launcher, already in the
  slot's cgroups with the call's rlimits and the sandbox uid, posix_spawns
  bwrap with the --args and --seccomp memfds at fixed numbers (ARGS_FD,
  SECCOMP_FD) and sets RLIMIT_CPU on it (`process.drive_child` drains it), or
  the call's command is written to a standby already started (`standby.py`).
- Directly, where no launcher can serve the call: `/bin/sh` sets the rlimits
  (dash `ulimit`) and joins the call's fresh cgroup (`cgroup.wrapper_argv`), a
  root worker's call drops to the sandbox uid through `setpriv`, then bwrap runs
  with the memfds at the numbers this process holds them (`process.run_process`).

Either way bwrap executes the command prefix (`command_prefix.py`: the
Landlock ruleset, then the tool's command) with the tool's arguments as flags
(`input: args`) or as one JSON line on stdin.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from broker.model import DeclaredTool
from workers.arguments import args_flags
from workers.sandbox import seccomp
from workers.sandbox.bwrap import Layout, bwrap_options, spawn_env
from workers.sandbox.cgroup import CallCgroup, wrapper_argv
from workers.sandbox.identity import SandboxIdentity
from workers.sandbox.launcher_client import Launcher
from workers.sandbox.launcher_protocol import ARGS_FD, SECCOMP_FD
from workers.sandbox.limits import Limits
from workers.sandbox.process import Child, Drain, Finished, drive_child, run_process, start_child
from workers.sandbox.standby import STANDBY_FLAG, Standby, StandbyLost
from workers.sandbox.watchdog import WorkspaceWatch

__all__ = ["CallSpawner"]


class CallSpawner:
    """Starts calls' bwrap for one runner: the binaries it found, whom calls run as."""

    def __init__(
        self,
        *,
        bwrap: str,
        prefix: Sequence[str],
        identity: SandboxIdentity,
        setpriv: str | None,
        hard_cap_bytes: int,
    ) -> None:
        self.bwrap = bwrap
        self.prefix = tuple(prefix)
        self.identity = identity
        #: The direct path's drop for a root worker (None: not found, or not needed).
        self.setpriv = setpriv
        self.hard_cap_bytes = hard_cap_bytes

    def run(
        self,
        *,
        layout: Layout,
        tool: DeclaredTool,
        arguments: dict[str, Any],
        timeout: float,
        cancel: threading.Event | None,
        cgroup: CallCgroup | None,
        launcher: Launcher | None,
        limits: Limits,
        watch: WorkspaceWatch,
        keep_chars: int,
        standby: Standby | None = None,
    ) -> Finished:
        """Run the call to its end (exit, timeout, cancel, output flood, workspace limit);
        in `standby` (started by `start_standby` for this layout, on `launcher`) if given.

        OSError if it cannot start. A standby that cannot take the call (its command too
        large, the standby gone) is killed and the call started the usual way."""
        command, stdin = self.command(tool, arguments)
        drain = Drain(
            timeout=timeout,
            keep_chars=keep_chars,
            hard_cap_bytes=self.hard_cap_bytes,
            cancel=cancel,
            watch=watch.poll,
        )
        started: tuple[Child, int, int | None] | None = None
        if standby is not None:
            # Else killed: its layout is this call's, started the usual way.
            with contextlib.suppress(StandbyLost):
                started = standby.release(command)
        seccomp_fd = seccomp.filter_fd()
        args_fd = -1
        try:
            if started is None:
                if launcher is None:
                    return self._run_direct(
                        layout=layout,
                        command=command,
                        stdin=stdin,
                        seccomp_fd=seccomp_fd,
                        cgroup=cgroup,
                        limits=limits,
                        drain=drain,
                    )
                # A launcher's child finds the memfds at fixed numbers.
                share_net = launcher.shared_network
                options = bwrap_options(layout, seccomp_fd=SECCOMP_FD, share_net=share_net)
                args_fd = _args_memfd(options)
                via, memfds = launcher, (args_fd, seccomp_fd)

                def launch(stdin_fd: int | None, out_fd: int) -> Child:
                    via.send_spawn(
                        [self.bwrap, "--args", str(ARGS_FD), "--", *self.prefix, *command],
                        env=spawn_env(),
                        stdin_fd=stdin_fd,
                        out_fd=out_fd,
                        args_fd=memfds[0],
                        seccomp_fd=memfds[1],
                        cpu_seconds=(limits.cpu_seconds, limits.cpu_hard_seconds),
                        share_net=share_net,
                    )
                    return via.spawned()

                started = start_child(launch, with_stdin=stdin is not None)
        finally:
            os.close(seccomp_fd)
            if args_fd >= 0:
                os.close(args_fd)
        child, out_fd, in_fd = started
        return drive_child(child, out_fd, in_fd, stdin=stdin, drain=drain)

    def _run_direct(
        self,
        *,
        layout: Layout,
        command: list[str],
        stdin: bytes | None,
        seccomp_fd: int,
        cgroup: CallCgroup | None,
        limits: Limits,
        drain: Drain,
    ) -> Finished:
        """The direct path: `/bin/sh` (rlimits, the cgroup), setpriv, bwrap, by Popen,
        which keeps the memfds at the numbers this process holds them."""
        args_fd = _args_memfd(bwrap_options(layout, seccomp_fd=seccomp_fd))
        try:
            return run_process(
                [
                    *wrapper_argv(
                        cgroup.procs_files if cgroup is not None else [], limits.ulimit_script()
                    ),
                    *self._drop_argv(),
                    self.bwrap,
                    "--args",
                    str(args_fd),
                    "--",
                    *self.prefix,
                    *command,
                ],
                stdin=stdin,
                env=spawn_env(),
                pass_fds=(seccomp_fd, args_fd),
                drain=drain,
            )
        finally:
            os.close(args_fd)

    @staticmethod
    def command(tool: DeclaredTool, arguments: dict[str, Any]) -> tuple[list[str], bytes | None]:
        """The call's command after the prefix, and its stdin (None: /dev/null)."""
        if tool.input == "args":
            return [*tool.command, *args_flags(arguments)], None
        return list(tool.command), json.dumps(arguments).encode() + b"\n"

    def start_standby(
        self,
        *,
        key: Hashable,
        layout: Layout,
        launcher: Launcher,
        limits: Limits,
        with_stdin: bool,
        on_discard: Callable[[Standby], None],
        hole_outbox: Path | None = None,
    ) -> Standby:
        """Start on `launcher` a sandbox of `layout` that waits for its command
        (`standby.py`); OSError if it cannot. Only with the static prefix.

        `hole_outbox`: `layout.workspace` is the launcher's hole, where the call's
        workspace and this outbox are mounted when the call comes (`launcher_holes.py`)."""
        seccomp_fd = seccomp.filter_fd()
        args_fd = command_r = command_w = -1
        try:
            share_net = launcher.shared_network
            args_fd = _args_memfd(bwrap_options(layout, seccomp_fd=SECCOMP_FD, share_net=share_net))
            command_r, command_w = os.pipe2(os.O_CLOEXEC)
            out_fd, child_out = os.pipe2(os.O_CLOEXEC)
            child_in, in_fd = os.pipe2(os.O_CLOEXEC) if with_stdin else (-1, -1)
            try:
                # Not waited for: the launcher starts it while this call's result goes back.
                launcher.send_spawn(
                    [self.bwrap, "--args", str(ARGS_FD), "--", *self.prefix, STANDBY_FLAG],
                    env=spawn_env(),
                    stdin_fd=child_in if with_stdin else None,
                    out_fd=child_out,
                    args_fd=args_fd,
                    seccomp_fd=seccomp_fd,
                    cpu_seconds=(limits.cpu_seconds, limits.cpu_hard_seconds),
                    share_net=share_net,
                    command_fd=command_r,
                )
            except BaseException:
                for fd in (out_fd, in_fd):
                    if fd >= 0:
                        os.close(fd)
                raise
            finally:
                for fd in (child_out, child_in):
                    if fd >= 0:
                        os.close(fd)
            standby = Standby(
                key=key,
                launcher=launcher,
                out_fd=out_fd,
                in_fd=in_fd if with_stdin else None,
                command_fd=command_w,
                workspace=layout.workspace,
                outbox=layout.outbox if hole_outbox is None else hole_outbox,
                stage=layout.stage,
                on_discard=on_discard,
                hole=hole_outbox is not None,
            )
            command_w = -1  # the standby's now
            return standby
        finally:
            for fd in (seccomp_fd, args_fd, command_r, command_w):
                if fd >= 0:
                    os.close(fd)

    def _drop_argv(self) -> list[str]:
        """The direct path's `setpriv ...` to the sandbox uid for a root worker (else none)."""
        if not self.identity.drop:
            return []
        if self.setpriv is None:
            raise OSError(
                "setpriv (util-linux) not found: a root worker starts calls "
                f"as uid {self.identity.uid} with it (apt-get install util-linux)"
            )
        return self.identity.setpriv_argv(self.setpriv)


def _args_memfd(options: Sequence[str]) -> int:
    """bwrap's options in a memfd (`--args FD`), read from its start."""
    fd = os.memfd_create("vessel-bwrap-args", os.MFD_CLOEXEC)
    try:
        os.write(fd, ("\0".join(options) + "\0").encode())
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
