"""Plugin tools (seed 002): TypeScript handlers in a confined Node.js runtime.

confine.py       the runtime process's sandbox: bubblewrap, seccomp, rlimits, uid
stage.py         the read-only folder the runtime sees: sources and runtime scripts
permissions.py   the permissions derived from the sources (`host.a.b` -> `host:a:b`)
registration.py  the sources run once, confined, to read the registry
publish.py       the publish check's rules and the lock it writes
process.py       one runtime process and its line protocol
runner.py        `PluginRunner`: warm processes per plugin, one call at a time each
js/              the runtime's own JavaScript (main thread and per-call isolate)
"""
