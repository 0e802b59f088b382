"""Upper bounds of the numbers an operator sets, so no setting can overflow later.

The seeds only ask for positive numbers; these caps stop values that would
break a worker at run time (a timeout beyond what `subprocess` and Celery
accept, an rlimit beyond a C long, a concurrency no host can give).
"""

from __future__ import annotations

__all__ = [
    "MAX_ARGUMENT_BYTES",
    "MAX_CONCURRENT_CALLS",
    "MAX_CPU_LIMIT",
    "MAX_DISK_LIMIT_MB",
    "MAX_LISTED_TOOLS",
    "MAX_MEMORY_LIMIT_MB",
    "MAX_TIMEOUT_SECONDS",
    "MAX_TOOL_OUTPUT_CHARS",
    "MAX_WORKSPACE_FILES",
    "MAX_WORKSPACE_LIMIT_MB",
    "MIN_CPU_LIMIT",
    "MIN_LISTED_TOOLS",
]

#: One day: a tool call longer than that is a job, not a call.
MAX_TIMEOUT_SECONDS = 86_400.0
#: Ten million characters, far beyond any model's context window.
MAX_TOOL_OUTPUT_CHARS = 10_000_000
#: 1 TiB, in MB: fits RLIMIT_FSIZE in bytes with room to spare.
MAX_DISK_LIMIT_MB = 1_048_576
#: 1 TiB, in MB: beyond any host's memory.
MAX_MEMORY_LIMIT_MB = 1_048_576
#: Per agent, across all workers and hosts.
MAX_CONCURRENT_CALLS = 100_000
#: 1 TiB, in MB, as disk_limit_mb.
MAX_WORKSPACE_LIMIT_MB = 1_048_576
#: Ten million entries: the watchdog walks the workspace while the call runs
#: (about 4 s per walk at this size here), so far more would never be checked.
MAX_WORKSPACE_FILES = 10_000_000
#: Cores per call: beyond any host; the cgroup quota (cpu_limit x the 100 ms
#: period) stays far below the kernel's maximum.
MAX_CPU_LIMIT = 1024.0
#: The kernel's smallest CFS quota is 1 ms per 100 ms period: 0.01 of a core.
MIN_CPU_LIMIT = 0.01
#: 100 MB: a call's message is one Redis value (at most 512 MB) and is decoded
#: whole in a worker, several times its size in memory.
MAX_ARGUMENT_BYTES = 100_000_000
#: A list the model is given: no model API takes more tools in one request.
MAX_LISTED_TOOLS = 100_000
#: search_tools and call_tool take the last two places when tools are hidden.
MIN_LISTED_TOOLS = 2
