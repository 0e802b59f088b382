"""The network namespace declared calls run in (`workers/sandbox/launcher_network.py`).

A slot launcher's calls share one empty namespace of the launcher's, one call after
another: no interface up, nothing a call can change, never two calls in it at
once, and a new one whenever a call left a socket behind. These tests run as root
and as an unprivileged user (scripts/test-unprivileged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from tests.sandbox.conftest import Sandbox, make_sandbox
from workers.sandbox.runner import SandboxRunner
from workers.sandbox.workspace import WorkspaceStore

# What a call reports of its network: its namespace, loopback's flags, what a
# connection to 127.0.0.1 and an attempt to bring loopback up get.
_REPORT = textwrap.dedent(
    """
    import errno, fcntl, json, os, socket, struct
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0)))[1]
    try:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))
        up = "done"
    except OSError as exc:
        up = errno.errorcode[exc.errno]
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1)
        tcp = "connected"
    except OSError as exc:
        tcp = errno.errorcode.get(exc.errno, str(exc))
    print(json.dumps({"ns": os.readlink("/proc/self/ns/net"), "lo_up": bool(flags & IFF_UP),
                      "bring_up": up, "tcp": tcp}))
    """
)


def _report(sandbox: Sandbox, **options: object) -> dict[str, object]:
    result = sandbox.call(_REPORT, name="netreport", **options)  # type: ignore[arg-type]
    assert not result.is_error, result.output
    report: dict[str, object] = json.loads(result.output)
    return report


def test_calls_of_one_launcher_share_its_empty_namespace(sandbox: Sandbox) -> None:
    """One call after another in one slot: the same namespace, not the worker's, with
    loopback down, unreachable, and out of the calls' power to bring up."""
    assert sandbox.runner.network_mode.startswith("slot:"), sandbox.runner.network_mode
    first, second = _report(sandbox), _report(sandbox)
    assert first["ns"] == second["ns"]
    assert first["ns"] != os.readlink("/proc/self/ns/net")
    for report in (first, second):
        assert report["lo_up"] is False, report
        assert report["bring_up"] == "EPERM", report
        assert report["tcp"] == "ENETUNREACH", report


def test_calls_at_once_are_in_namespaces_of_their_own(sandbox: Sandbox) -> None:
    """Two calls running at the same time (two slots) never share one."""
    script = (
        "import os, time\n"
        "open(f'/tmp/vessel/{os.getpid()}', 'w').close()\n"
        "deadline = time.monotonic() + 3\n"
        "while len(os.listdir('/tmp/vessel')) < 2 and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"  # both calls are running now
        "print(os.readlink('/proc/self/ns/net'), len(os.listdir('/tmp/vessel')))\n"
    )
    outputs: list[str] = []

    def run(role: str) -> None:
        outputs.append(sandbox.call(script, name=role, turn="both", timeout=6).output)

    threads = [threading.Thread(target=run, args=(role,)) for role in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert len(outputs) == 2, outputs
    (ns_a, seen_a), (ns_b, seen_b) = (out.split() for out in outputs)
    assert (seen_a, seen_b) == ("2", "2"), outputs
    assert ns_a != ns_b


# A call that leaves a socket alive after it ends: a datagram socket bound to an
# abstract name, in flight in a pair's queue with both ends of that pair, so the
# pair holds itself: a cycle only the kernel's garbage collector frees.
_LEAVE_A_SOCKET = textwrap.dedent(
    """
    import os, socket
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    bound, spare = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)  # socket(): EPERM
    bound.bind(b"\\0{name}")
    socket.send_fds(a, [b"x"], [bound.fileno(), spare.fileno(), a.fileno(), b.fileno()])
    print(os.readlink("/proc/self/ns/net"))
    """
)
_LOOK_FOR_IT = textwrap.dedent(
    """
    import errno, os, socket
    listed = "{name}" in open("/proc/self/net/unix").read()
    c, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        c.sendto(b"hello", b"\\0{name}")
        sent = "SENT"
    except OSError as exc:
        sent = errno.errorcode[exc.errno]
    print(os.readlink("/proc/self/ns/net"), listed, sent)
    """
)


def test_a_socket_a_call_leaves_is_not_in_the_next_calls_namespace(sandbox: Sandbox) -> None:
    """The next call of the slot finds no trace of it: either the kernel collected it
    before the launcher looked, or the launcher saw it and made a new namespace."""
    name = f"vessel-left-{os.getpid()}"
    for _ in range(5):
        left = sandbox.call(_LEAVE_A_SOCKET.replace("{name}", name), name="leave")
        assert not left.is_error, left.output
        seen = sandbox.call(_LOOK_FOR_IT.replace("{name}", name), name="look")
        assert not seen.is_error, seen.output
        _ns, listed, sent = seen.output.split()
        assert (listed, sent) == ("False", "ECONNREFUSED"), (left.output, seen.output)


def test_per_call_mode_gives_each_call_bwraps_namespace(tmp_path: Path) -> None:
    """VESSEL_SANDBOX_NETWORK=per-call: a namespace per call, loopback up (as bwrap makes it)."""
    sandbox = make_sandbox(tmp_path)
    sandbox.runner.close()
    sandbox.runner = SandboxRunner(WorkspaceStore(tmp_path / "workspaces"), network="per-call")
    try:
        assert sandbox.runner.network_mode == "per-call (bwrap's, loopback up)"
        first, second = _report(sandbox), _report(sandbox)
        assert first["ns"] != second["ns"]
        assert first["lo_up"] is True and first["tcp"] == "ECONNREFUSED", first
        assert first["bring_up"] in ("EPERM", "done"), first  # already up: a no-op
    finally:
        sandbox.runner.close()


_RENEWAL = textwrap.dedent(
    """
    import json, os, socket, sys
    from workers.sandbox.launcher_network import CallNetwork, sockets_in_namespace
    host = os.readlink("/proc/self/ns/net")
    net = CallNetwork.enter()
    steps = [("entered", os.readlink("/proc/self/ns/net"), sockets_in_namespace())]
    net.ready_for_call(children_gone=True)
    steps.append(("empty", os.readlink("/proc/self/ns/net"), net.renewed))
    left = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    net.ready_for_call(children_gone=True)
    steps.append(("a socket", os.readlink("/proc/self/ns/net"), net.renewed))
    net.ready_for_call(children_gone=False)
    steps.append(("a child", os.readlink("/proc/self/ns/net"), net.renewed))
    print(json.dumps({"host": host, "uid": os.getuid(), "steps": steps}))
    """
)


def test_the_launcher_renews_its_namespace_when_a_call_left_anything() -> None:
    """CallNetwork itself, in a process of its own: kept while empty; a new one when a
    socket is in it or a child is left (the launcher's check before every call)."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _RENEWAL],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["uid"] == os.getuid()  # its own ids, mapped to themselves
    (_, entered, sockets), (_, empty, kept), (_, renewed, one), (_, again, two) = out["steps"]
    assert entered != out["host"] and sockets == 0
    assert (empty, kept) == (entered, 0)
    assert renewed != entered and one == 1
    assert again not in (entered, renewed) and two == 2
