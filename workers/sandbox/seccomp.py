"""The seccomp filter: what namespaces and dropped capabilities cannot stop.

Built once per process with pyseccomp (libseccomp) and exported as BPF bytes;
every call gets those bytes in a fresh memfd (`filter_fd`), because bwrap reads
its `--seccomp FD` to the end. The default action is ALLOW: this is a deny list
of the system calls a confined tool has no business making, each refused with
EPERM (or ENOSYS where libc must fall back), not killed, so a tool sees an
ordinary error it can report.

libseccomp's native-arch filter kills any system call made through another ABI
(i386 `int 0x80`, x32), so the rules cannot be bypassed by switching ABI.

The rules are compiled as a binary tree over the system call numbers
(libseccomp's `SCMP_FLTATR_CTL_OPTIMIZE` 2) rather than libseccomp's default
list in priority order: the same decisions (`seccomp_check.py` runs both on
every native system call), reached in at most 34 instructions instead of 103
(14 instead of 73 on average). The kernel walks the filter for every system
call number when it attaches it (its allow cache) and on every system call the
cache cannot answer: the tree halves what the filter costs a call, about 0.2 ms
of CPU less (bench/seccomp_cost.py, bench/README.md).

bwrap applies the filter just before it executes the command, after its own
setup: `--new-session` (bwrap's own setsid) runs before the filter applies.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from dataclasses import dataclass

import pyseccomp

__all__ = [
    "AF_UNIX",
    "AF_VSOCK",
    "CLONE_NAMESPACE_FLAGS",
    "RULES",
    "TIOCLINUX",
    "TIOCSTI",
    "Rule",
    "build_filter_bytes",
    "filter_bytes",
    "filter_fd",
]

# ioctl request numbers (asm-generic/ioctls.h). The kernel compares the low 32
# bits of the request, so the rules do too (a masked comparison): setting high
# bits must not smuggle the same request past the filter.
TIOCSTI = 0x5412  # push a byte into a terminal's input queue: typing into the host's shell
TIOCLINUX = 0x541C  # virtual-console tricks, including a paste that types into the console

AF_UNIX = 1  # socket(AF_UNIX, ...): a socket file in the filesystem, or an abstract name
AF_VSOCK = 40  # socket(AF_VSOCK, ...): virtio sockets to the hypervisor, outside any netns
#: The CLONE_NEW* flags clone() accepts (CLONE_NEWTIME, 0x80, only works with
#: clone3/unshare: in clone() that bit belongs to the exit signal).
CLONE_NAMESPACE_FLAGS: tuple[tuple[str, int], ...] = (
    ("CLONE_NEWNS", 0x00020000),
    ("CLONE_NEWCGROUP", 0x02000000),
    ("CLONE_NEWUTS", 0x04000000),
    ("CLONE_NEWIPC", 0x08000000),
    ("CLONE_NEWUSER", 0x10000000),
    ("CLONE_NEWPID", 0x20000000),
    ("CLONE_NEWNET", 0x40000000),
)


@dataclass(frozen=True, slots=True)
class Rule:
    """One refused system call (optionally only for some arguments) and why."""

    syscall: str
    why: str
    errno: int = errno.EPERM
    #: (argument index, op, datum_a, datum_b) conditions, all of which must hold.
    args: tuple[tuple[int, int, int, int], ...] = ()


#: libseccomp's `SCMP_FLTATR_CTL_OPTIMIZE`: 2 compiles a binary tree (libseccomp 2.5+).
_OPTIMIZE_BINARY_TREE = 2

_ME = pyseccomp.MASKED_EQ
_LOW32 = 0xFFFFFFFF

RULES: tuple[Rule, ...] = (
    # --- seed 000: cannot start a new session or process group -----------------
    Rule("setsid", "a new session escapes the call's process group and its kill"),
    Rule("setpgid", "a new process group escapes killpg at the timeout"),
    # --- terminal injection ------------------------------------------------------
    Rule("ioctl", "TIOCSTI types into a terminal", args=((1, _ME, _LOW32, TIOCSTI),)),
    Rule("ioctl", "TIOCLINUX pastes into a console", args=((1, _ME, _LOW32, TIOCLINUX),)),
    # --- seed 000: no shared memory or message queues (System V and POSIX) -------
    Rule("shmget", "System V shared memory"),
    Rule("shmat", "System V shared memory"),
    Rule("shmctl", "System V shared memory"),
    Rule("shmdt", "System V shared memory"),
    Rule("msgget", "System V message queues"),
    Rule("msgsnd", "System V message queues"),
    Rule("msgrcv", "System V message queues"),
    Rule("msgctl", "System V message queues"),
    Rule("semget", "System V semaphores: the same IPC family, no tool needs it"),
    Rule("semop", "System V semaphores"),
    Rule("semtimedop", "System V semaphores"),
    Rule("semctl", "System V semaphores"),
    Rule("mq_open", "POSIX message queues"),
    Rule("mq_unlink", "POSIX message queues"),
    Rule("mq_timedsend", "POSIX message queues"),
    Rule("mq_timedreceive", "POSIX message queues"),
    Rule("mq_notify", "POSIX message queues"),
    Rule("mq_getsetattr", "POSIX message queues"),
    # --- seed 000: cannot make socket files ---------------------------------------
    # A filter cannot read the sockaddr given to bind(), so socket(AF_UNIX, ...)
    # itself is refused: no socket file and no abstract socket can be made.
    # socketpair(AF_UNIX) stays allowed: it makes no file, and Python's asyncio
    # (and many runtimes) use it as a self-pipe; bind() on one of its ends
    # could still make a socket file or an abstract name, which the call's
    # Landlock domain refuses where the kernel has it (landlock.py). glibc falls
    # back from nscd to the files when its socket() fails.
    # The domain is an int: compare its low 32 bits, as the kernel reads it.
    Rule("socket", "AF_UNIX sockets make socket files", args=((0, _ME, _LOW32, AF_UNIX),)),
    # vsock is not namespaced: a new network namespace does not stop it, and on a
    # VM (Firecracker, QEMU, Kata) it reaches the host's agents (CID 2).
    Rule(
        "socket",
        "AF_VSOCK reaches the hypervisor host past the network namespace",
        args=((0, _ME, _LOW32, AF_VSOCK),),
    ),
    # --- io_uring performs socket/open/... without passing through this filter ----
    Rule("io_uring_setup", "io_uring runs operations this filter cannot see"),
    Rule("io_uring_enter", "io_uring"),
    Rule("io_uring_register", "io_uring"),
    # --- other processes' memory and the kernel's attack surface -----------------
    Rule("ptrace", "tracing another process reads and writes its memory"),
    Rule("process_vm_readv", "reads another process's memory"),
    Rule("process_vm_writev", "writes another process's memory"),
    Rule("kcmp", "compares other processes' kernel objects: an information leak"),
    Rule(
        "personality",
        "changing the execution domain (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE) weakens ASLR; "
        "the query personality(0xffffffff) stays allowed",
        args=((0, pyseccomp.NE, 0xFFFFFFFF, 0),),
    ),
    Rule("keyctl", "the kernel keyring is not namespaced"),
    Rule("add_key", "the kernel keyring is not namespaced"),
    Rule("request_key", "the kernel keyring is not namespaced"),
    Rule("bpf", "eBPF programs: a large kernel attack surface"),
    Rule("perf_event_open", "performance counters: side channels and kernel bugs"),
    Rule("userfaultfd", "stalls the kernel on a page fault: the classic race-exploit helper"),
    Rule("lookup_dcookie", "kernel profiling internals"),
    Rule("open_by_handle_at", "opens files by handle, bypassing the mount tree (Shocker)"),
    Rule("name_to_handle_at", "the other half of open_by_handle_at"),
    # --- new namespaces and mounts: the sandbox's layout is final ----------------
    Rule("unshare", "new namespaces (bwrap's --disable-userns covers user namespaces)"),
    Rule("setns", "joining another namespace"),
    # One rule per flag: "any of these bits set" is not one comparison.
    *(
        Rule("clone", f"clone with {name} makes a namespace", args=((0, _ME, flag, flag),))
        for name, flag in CLONE_NAMESPACE_FLAGS
    ),
    # clone3 passes its flags in memory the filter cannot read: ENOSYS makes glibc
    # (and Go, Rust) fall back to clone, which the rule above checks.
    Rule("clone3", "flags out of the filter's sight; libc falls back to clone", errno.ENOSYS),
    Rule("mount", "changing the mount tree"),
    Rule("umount2", "uncovering what a mount hides"),
    Rule("pivot_root", "changing the root"),
    Rule("chroot", "changing the root"),
    Rule("move_mount", "the new mount API"),
    Rule("open_tree", "the new mount API"),
    Rule("fsopen", "the new mount API"),
    Rule("fsconfig", "the new mount API"),
    Rule("fsmount", "the new mount API"),
    Rule("fspick", "the new mount API"),
    Rule("mount_setattr", "the new mount API"),
    # --- the machine itself (all need capabilities we drop; refused regardless) --
    Rule("kexec_load", "replacing the kernel"),
    Rule("kexec_file_load", "replacing the kernel"),
    Rule("reboot", "rebooting the host"),
    Rule("init_module", "loading kernel modules"),
    Rule("finit_module", "loading kernel modules"),
    Rule("delete_module", "unloading kernel modules"),
    Rule("swapon", "host swap"),
    Rule("swapoff", "host swap"),
    Rule("acct", "host process accounting"),
    Rule("iopl", "raw I/O ports"),
    Rule("ioperm", "raw I/O ports"),
    Rule("syslog", "the kernel log"),
    Rule("quotactl", "host disk quotas"),
    Rule("settimeofday", "the host clock"),
    Rule("clock_settime", "the host clock"),
    Rule("clock_adjtime", "the host clock"),
    Rule("adjtimex", "the host clock"),
    Rule("vhangup", "hanging up the terminal"),
    Rule("uselib", "obsolete loader entry point, a past exploit vector"),
    Rule("fanotify_init", "watching the host's filesystem"),
)


def build_filter_bytes(*, tree: bool = True) -> bytes:
    """Compile `RULES` to BPF with libseccomp; raises OSError if it cannot.

    `tree`: as a binary tree where this libseccomp can (2.5 and later); False:
    libseccomp's default order (the bench compares the two).
    """
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    if tree:
        with contextlib.suppress(OSError):  # older libseccomp: the default order, same rules
            flt.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, _OPTIMIZE_BINARY_TREE)
    for rule in RULES:
        conds = [pyseccomp.Arg(i, op, a, b) for i, op, a, b in rule.args]
        flt.add_rule(pyseccomp.ERRNO(rule.errno), rule.syscall, *conds)
    fd = os.memfd_create("vessel-seccomp-build", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            flt.export_bpf(out)
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


_lock = threading.Lock()
_cached: list[bytes] = []


def filter_bytes() -> bytes:
    """The compiled filter, built once per process (the rules never change)."""
    with _lock:
        if not _cached:
            _cached.append(build_filter_bytes())
        return _cached[0]


def filter_fd() -> int:
    """A fresh memfd holding the filter, positioned at 0: pass it as `--seccomp FD`.

    The caller owns the descriptor and closes it after spawning. It is created
    close-on-exec, so only a child it is explicitly passed to (pass_fds) gets it.
    """
    data = filter_bytes()
    fd = os.memfd_create("vessel-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
