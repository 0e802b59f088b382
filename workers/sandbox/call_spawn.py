"""The two ways a call's bwrap is started, and its output drained until it ends.

- Through a slot launcher (`launcher_client.py`): the launcher, already in the
  slot's cgroups with the call's rlimits and the sandbox uid, posix_spawns
  bwrap with the --args and --seccomp memfds at fixed numbers (ARGS_FD,
  SECCOMP_FD) and sets RLIMIT_CPU on it (`process.run_child` drains it).
- Directly, where no launcher can serve the call: `/bin/sh` sets the rlimits
  (dash `ulimit`) and joins the call's fresh cgroup (`cgroup.wrapper_argv`), a
  root worker's call drops to the sandbox uid through `setpriv`, then bwrap runs
  with the memfds at the numbers this process holds them (`process.run_process`).

Either way bwrap executes the command prefix (`command_prefix.py`: the
Landlock ruleset, then the tool's command) with the tool's arguments as flags
(`input: args`) or as one JSON line on stdin.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
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
from workers.sandbox.process import Child, Finished, run_child, run_process
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
    ) -> Finished:
        """Run the call to its end (exit, timeout, cancel, output flood, workspace limit)."""
        seccomp_fd = seccomp.filter_fd()
        args_fd = -1
        try:
            # A launcher's child finds the memfds at fixed numbers; Popen keeps ours.
            share_net = launcher is not None and launcher.shared_network
            options = bwrap_options(
                layout,
                seccomp_fd=SECCOMP_FD if launcher is not None else seccomp_fd,
                share_net=share_net,
            )
            args_fd = os.memfd_create("vessel-bwrap-args", os.MFD_CLOEXEC)
            os.write(args_fd, ("\0".join(options) + "\0").encode())
            os.lseek(args_fd, 0, os.SEEK_SET)
            command = list(tool.command)
            stdin: bytes | None
            if tool.input == "args":
                command += args_flags(arguments)
                stdin = None
            else:
                stdin = json.dumps(arguments).encode() + b"\n"
            bwrap_argv = [
                self.bwrap,
                "--args",
                str(ARGS_FD if launcher is not None else args_fd),
                "--",
                *self.prefix,
                *command,
            ]
            if launcher is None:
                return run_process(
                    [
                        *wrapper_argv(
                            cgroup.procs_files if cgroup is not None else [],
                            limits.ulimit_script(),
                        ),
                        *self._drop_argv(),
                        *bwrap_argv,
                    ],
                    stdin=stdin,
                    env=spawn_env(),
                    pass_fds=(seccomp_fd, args_fd),
                    timeout=timeout,
                    keep_chars=keep_chars,
                    hard_cap_bytes=self.hard_cap_bytes,
                    cancel=cancel,
                    watch=watch.poll,
                )
            via = launcher
            memfds = (args_fd, seccomp_fd)

            def launch(stdin_fd: int | None, out_fd: int) -> Child:
                return via.spawn(
                    bwrap_argv,
                    env=spawn_env(),
                    stdin_fd=stdin_fd,
                    out_fd=out_fd,
                    args_fd=memfds[0],
                    seccomp_fd=memfds[1],
                    cpu_seconds=(limits.cpu_seconds, limits.cpu_hard_seconds),
                    share_net=share_net,
                )

            return run_child(
                launch,
                stdin=stdin,
                timeout=timeout,
                keep_chars=keep_chars,
                hard_cap_bytes=self.hard_cap_bytes,
                cancel=cancel,
                watch=watch.poll,
            )
        finally:
            os.close(seccomp_fd)
            if args_fd >= 0:
                os.close(args_fd)

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
