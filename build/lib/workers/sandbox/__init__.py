"""The sandbox runner: declared tools confined with bubblewrap, seccomp and rlimits.

One module per concern: `bwrap` (the sandbox's shape), `seccomp` (the filter),
`limits` (rlimits), `cgroup` (per-call pids/memory/cpu cgroups where writable),
`process` (spawn, drain, kill the tree), `watchdog` (the workspace's size and
files while a call runs), `launcher` (a slot's fork server,
pre-placed in its cgroups), `outbox`, `workspace`, `probe`
(the start-up self-check) and `runner` (one call, end to end).
"""

__all__: list[str] = []
