"""The sandbox runner: declared tools confined with bubblewrap, seccomp and rlimits.

One module per concern: `bwrap` (the sandbox's shape), `seccomp` (the filter),
`limits` (rlimits), `cgroup` (per-call pids/memory/cpu cgroups where writable),
`process` (spawn, drain, kill the tree), `watchdog` (the workspace's size and
files while a call runs), `identity` (the host uid calls run as: never 0),
`slot_launcher` (a slot's spawn server, pre-placed in its cgroups: the process
itself, with `launcher_protocol`, `launcher_placement`, `launcher_children` and
`launcher_network`, the empty network namespace its calls share one after another),
`launcher_client` and `launcher_pool` (the worker's side of it), `outbox`,
`workspace` and `folders` (the workspaces, and link-proof folder operations),
`probe` (the start-up self-check), `landlock` and `command_prefix` (the
ruleset applied inside each call, and which prefix applies it: the static
`landlock_exec.c` or Perl's), `system_stage` (the staged /etc and prefix), `reachable`
(a root worker's readability check), `call_spawn` (the two ways bwrap starts),
`call_results` (a finished call's `ToolResult`) and `runner` (one call, end to end).
"""

__all__: list[str] = []
