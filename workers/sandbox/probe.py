"""No confinement, no run: the sandbox worker's start-up self-check.

`check_confinement` proves the sandbox works here by running a real, tiny
confined command through the same runner every call uses, and reading the
kernel's own account of it (/proc/self/status inside): a seccomp filter in
force, no capabilities, no_new_privs; from the host, the owner of a file
it made in its workspace: a host uid that is not 0 (a root worker's calls run
as `VESSEL_SANDBOX_UID`, `identity.py`). (uid_map read inside cannot tell: bwrap
nests a second user namespace for --disable-userns.) And the Landlock prefix's
own report (`landlock.REPORT_FLAG`): what of Landlock is in force, logged at
start-up, and refused if the kernel offers more than holds. Anything missing raises
`ConfinementUnavailable` saying what and how to fix it. Success is cached per
process (a prefork child inherits the parent's success only if the parent
checked; each process may check again cheaply).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from broker.constants import SANDBOX_HOME
from broker.errors import ConfinementUnavailable
from broker.model import Agent, AgentSettings, DeclaredTool
from workers.sandbox import landlock, seccomp
from workers.sandbox.identity import SandboxIdentity
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.workspace import WorkspaceStore

__all__ = ["check_confinement"]

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_confirmed: set[int] = set()  # pids of processes that passed (os.fork keeps the set)

_FIX_BWRAP = "install it: apt-get install -y bubblewrap"
_FIX_USERNS = (
    "bubblewrap cannot create namespaces here. On a host, allow user namespaces "
    "(sysctl -w kernel.unprivileged_userns_clone=1 and user.max_user_namespaces=15000; "
    "on Ubuntu 24.04+ also kernel.apparmor_restrict_unprivileged_userns=0). In a "
    "container, run it with --security-opt seccomp=unconfined --security-opt "
    "apparmor=unconfined (or --privileged), since Docker's default profiles forbid "
    "unshare and mount"
)
_FIX_SECCOMP = (
    "install libseccomp (apt-get install -y libseccomp2) and the Python binding "
    "(pip install pyseccomp)"
)
_PROBE_SCRIPT = f"cat /proc/self/status; echo; cat /proc/1/cmdline; : > {SANDBOX_HOME}/owner"


def _fail(what: str) -> ConfinementUnavailable:
    return ConfinementUnavailable(f"no confinement, so no declared tool may run: {what}")


def check_confinement() -> None:
    """Raise ConfinementUnavailable unless a confined command really runs here."""
    with _lock:
        if os.getpid() in _confirmed:
            return
        _check()
        _confirmed.add(os.getpid())


def _check() -> None:
    if shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin") is None:
        raise _fail(f"bubblewrap (bwrap) is not installed; {_FIX_BWRAP}")
    try:
        seccomp.filter_bytes()
    except (ImportError, OSError, AttributeError) as exc:
        raise _fail(f"the seccomp filter cannot be built ({exc}); {_FIX_SECCOMP}") from exc
    try:
        identity = SandboxIdentity.for_worker()
    except ValueError as exc:
        raise _fail(str(exc)) from exc

    with tempfile.TemporaryDirectory(prefix="vessel-probe-") as tmp:
        root = Path(tmp)
        # A root worker's calls run as the sandbox uid: it must pass through
        # (0711: search only, the names inside are not listable).
        os.chmod(root, 0o711)  # noqa: S103 (search only: nothing to list)
        package = root / "package"
        package.mkdir()
        tool = DeclaredTool(
            name="probe",
            description="confinement self-check",
            parameters={"type": "object", "properties": {}},
            scope="tools:read",
            timeout_seconds=10.0,
            source=package / "probe.toml",
            command=(landlock.REPORT_FLAG, "/bin/sh", "-c", _PROBE_SCRIPT),
            input="args",
        )
        agent = Agent(
            id="probe",
            package_dir=package,
            settings=AgentSettings(
                workdir=SANDBOX_HOME,
                tool_timeout_seconds=10.0,
                tool_output_chars=100_000,
                disk_limit_mb=1,
                memory_limit_mb=256,
            ),
            tools={"probe": tool},
            mounts={},
            grants={},
            max_concurrent_calls=1,
        )
        try:
            runner = SandboxRunner(WorkspaceStore(root / "workspaces", identity=identity))
        except ValueError as exc:  # VESSEL_LANDLOCK_EXEC names no executable
            raise _fail(str(exc)) from exc
        prefix = runner.prefix.describe
        try:
            result = runner.run(call_id="probe", agent=agent, tool=tool, arguments={}, turn="probe")
            try:
                owner: int | None = (
                    (runner.workspaces.turn_dir("probe", "probe") / "owner").stat().st_uid
                )
            except OSError:
                owner = None
        finally:
            runner.close()  # its launchers and stage: nothing of the probe stays
    out = result.output
    if result.outcome != "ok":
        lowered = out.lower()
        if "namespace" in lowered or "uid map" in lowered or "permission" in lowered:
            raise _fail(f"{_FIX_USERNS}. bwrap said: {out.strip()[:500]}")
        raise _fail(f"a confined test command failed ({result.outcome}): {out.strip()[:500]}")
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line and "\t" in line)
    seccomp_mode = fields.get("Seccomp", "").strip()
    if seccomp_mode != "2":
        raise _fail(
            f"the seccomp filter was not applied inside the sandbox (Seccomp: {seccomp_mode!r}); "
            "bwrap must be 0.5 or newer with --seccomp support"
        )
    if fields.get("CapEff", "").strip().strip("0"):
        raise _fail(f"the sandbox kept capabilities (CapEff {fields['CapEff'].strip()})")
    if fields.get("NoNewPrivs", "").strip() != "1":
        raise _fail("no_new_privs is not set inside the sandbox")
    if str(root) in out:
        raise _fail("host paths are visible in the sandbox's /proc/1/cmdline")
    if owner is None or owner == 0:
        seen = "an unknown uid" if owner is None else "host uid 0"
        raise _fail(
            f"the confined command ran as {seen}: a root worker's calls must run as an "
            f"unprivileged uid ({identity.describe()})"
        )
    report = landlock.parse_report(out)
    if report is None:
        raise _fail(
            f"the sandbox's Landlock prefix, {prefix}, printed no report; "
            f"it said: {out.strip()[:500]}"
        )
    if problems := report.problems():
        raise _fail("; ".join(problems))
    all_held = report.make_sock and report.scope_abstract
    (_log.info if all_held else _log.warning)(
        "sandbox: Landlock: %s (applied by %s)", report.describe(), prefix
    )
