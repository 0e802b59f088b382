"""The sandbox's shape: bubblewrap's options for one call.

The options are passed to bwrap through `--args FD` (a memfd), not on its
command line: bwrap is pid 1 inside the sandbox, and `/proc/1/cmdline` would
otherwise show every host path (workspace, package, mounts). The sandbox sees
`bwrap --args 3 -- <the tool's command>` and nothing else of the host.

Layout (everything read-only except the workspace):

    /usr, /bin, /sbin, /lib*   the host's system folders (symlinks kept as symlinks)
    /.vessel                   ONE read-only bind of the worker's stage (`stage_system`):
    /.vessel/etc                 its /etc: a copy of a short allow-list of harmless
                                 entries (below), the host's CA certificates among
                                 them, plus a synthetic passwd/group/hosts/hostname;
                                 never the host's shadow, ssh keys, TLS private keys
                                 or tokens (re-staged when the certificates change)
    /.vessel/landlock-exec       a copy of the static Landlock prefix, when the worker
                                 has it (`command_prefix.py`; else /usr/bin/perl's)
    /etc                       a symlink to /.vessel/etc
    /proc                      a new procfs: the new pid namespace shows only the call
    /proc/sys, sysrq-trigger   read-only binds over it (sysctls are not a tool's to set;
                               the values shown are still the call's own namespaces')
    /dev                       bwrap's minimal /dev (null, zero, random, tty, pts...);
                               read-only, so /dev/shm cannot hold shared memory
    /tmp                       an empty folder of the read-only root, holding only:
    /tmp/vessel                the turn's workspace, read-write ($HOME, $TMPDIR)
    /tmp/vessel/outbox         this call's own empty outbox, read-write ($VESSEL_OUTBOX):
                               a folder bound over it in a turn's workspace (its calls
                               share the workspace), the workspace's own in a one-call one
    /agent                     the agent package
    <mounts>                   the deployment's data mounts
    <workdir>                  an empty folder if no mount provides it
    /                          bwrap's tmpfs root, remounted read-only last

Not bound: /root, /home, /var, /run, /opt, /srv, /mnt, /sys.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from broker.constants import OUTBOX_PATH, PACKAGE_PATH, SANDBOX_HOME
from workers.sandbox.command_prefix import STATIC_MOUNT, CommandPrefix

__all__ = [
    "ETC_ALLOWED",
    "ETC_MOUNT",
    "ETC_PARTS",
    "SANDBOX_ENV",
    "SANDBOX_HOSTNAME",
    "STAGE_MOUNT",
    "Layout",
    "bwrap_options",
    "certificates_signature",
    "file_signature",
    "spawn_env",
    "stage_system",
    "write_system_files",
]

SANDBOX_HOSTNAME = "vessel"

#: Seed 000: the environment holds only PATH, LANG, HOME, TMPDIR and VESSEL_OUTBOX.
SANDBOX_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": SANDBOX_HOME,
    "TMPDIR": SANDBOX_HOME,
    "VESSEL_OUTBOX": OUTBOX_PATH,
}

#: /etc entries the sandbox gets from the host (glob patterns on the name). Each
#: is configuration a program needs to start and holds no secret. Left out on
#: purpose: shadow/gshadow, ssh, ssl/private (bound: ssl/certs only), sudoers,
#: pip.conf/npmrc/gitconfig (may hold tokens), machine-id, passwd/group (synthetic).
ETC_ALLOWED: tuple[str, ...] = (
    "alternatives",  # Debian's /usr/bin/awk -> /etc/alternatives/awk -> mawk links
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "mime.types",
    "magic",
    "magic.mime",
    "os-release",
    "debian_version",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "locale.alias",
    "locale.conf",
    "ca-certificates",
    "ca-certificates.conf",
    "fonts",
    "python3*",
    "perl",
    "java-*-openjdk",  # the JVM's conf/ folder links here
    "ImageMagick-*",
)
#: Host folders of /etc copied only in part.
ETC_PARTS: tuple[str, ...] = ("ssl/certs", "ssl/openssl.cnf")
#: Where the worker's stage is bound inside: ONE read-only bind holding the
#: staged /etc and the static prefix. Each bind costs bwrap a read of the whole
#: mount table (so more on a host with many mounts): the etc entries, the
#: host's certificates and the prefix were once a bind each.
STAGE_MOUNT = "/.vessel"
#: The staged /etc inside; /etc is a symlink to it.
ETC_MOUNT = f"{STAGE_MOUNT}/etc"
#: What `certificates_signature` looks at: ca-certificates rewrites the folder
#: (links added and removed) and renames a new bundle into it.
_CERTIFICATES = ("ssl/certs", "ssl/certs/ca-certificates.crt")

_SYSTEM_TOP = ("usr",)
_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

_PASSWD = (
    f"root:x:0:0:root:{SANDBOX_HOME}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
_HOSTS = f"127.0.0.1\tlocalhost {SANDBOX_HOSTNAME}\n::1\tlocalhost ip6-localhost\n"


def write_system_files(folder: Path) -> Path:
    """Write the synthetic /etc files into `folder` (idempotent); return it."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name, text in (
        ("passwd", _PASSWD),
        ("group", _GROUP),
        ("hosts", _HOSTS),
        ("hostname", f"{SANDBOX_HOSTNAME}\n"),
    ):
        target = folder / name
        if not target.is_file() or target.read_text() != text:
            tmp = folder / f".{name}.tmp"
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.replace(target)
    return folder


def stage_system(folder: Path, *, prefix: Path | None, etc: Path = Path("/etc")) -> Path:
    """Build the worker's stage in `folder` from scratch; return it.

    `folder/etc` is what a call sees at /etc: each allowed top-level entry with
    its symlink followed, folders copied with their inner symlinks kept as
    symlinks (the certificates' links into /usr/share stay links), and the
    synthetic files; `folder/landlock-exec` a copy of the static prefix `prefix`
    (None: the Perl prefix, nothing to copy). Built in a fresh sibling folder and
    renamed into place: a call never binds a half-built stage. Folders 0755
    (umask aside); copied files keep their mode.
    """
    folder.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    build = folder.parent / f".{folder.name}.{secrets.token_hex(6)}"
    build.mkdir(mode=0o755)
    os.chmod(build, 0o755)  # noqa: S103 (the sandbox's /etc: world-readable, as the host's)
    try:
        staged_etc = build / "etc"
        staged_etc.mkdir(mode=0o755)
        os.chmod(staged_etc, 0o755)  # noqa: S103
        for entry in _etc_entries(etc):
            relative = Path(entry).relative_to(etc)
            target = staged_etc / relative
            if target.parent != staged_etc:
                target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                os.chmod(target.parent, 0o755)  # noqa: S103
            try:
                if os.path.isdir(entry):
                    shutil.copytree(entry, target, symlinks=True)
                else:
                    shutil.copy2(entry, target)
            except OSError:
                # Unreadable here: leave it out (a partial copy would be worse).
                with contextlib.suppress(OSError):
                    if target.is_dir() and not target.is_symlink():
                        shutil.rmtree(target)
                    else:
                        target.unlink()
        write_system_files(staged_etc)
        if prefix is not None:
            copied = build / PurePosixPath(STATIC_MOUNT).name
            shutil.copyfile(prefix, copied)
            os.chmod(copied, 0o755)  # noqa: S103 (every sandbox uid executes it)
        if folder.exists() or folder.is_symlink():
            old = folder.parent / f".{folder.name}.old-{secrets.token_hex(6)}"
            folder.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        build.rename(folder)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return folder


def file_signature(path: Path) -> tuple[int, int, int]:
    """(inode, mtime, size) of `path`, (0, 0, 0) if it is not there: what a new file
    renamed over it, or an entry added to or removed from a folder, changes."""
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def certificates_signature(etc: Path = Path("/etc")) -> tuple[tuple[int, int, int], ...]:
    """What changes when the host's CA certificates do (`file_signature` of each of
    `_CERTIFICATES`): a stage holds a copy of them."""
    return tuple(file_signature(etc / part) for part in _CERTIFICATES)


@functools.lru_cache(maxsize=1)
def _etc_entries(etc: Path = Path("/etc")) -> tuple[str, ...]:
    """The allowed /etc entries present here; looked up once per process (~20 ms)."""
    try:
        names = sorted(os.listdir(etc))
    except OSError:
        return ()
    picked = [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in ETC_ALLOWED)]
    picked += [p for p in ETC_PARTS if (etc / p).exists()]
    return tuple(str(etc / n) for n in picked)


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """Host paths of one call, and the sandbox paths they appear at."""

    package_dir: Path
    workspace: Path
    #: This call's own $VESSEL_OUTBOX folder, mounted over the workspace's outbox/;
    #: None: the workspace's outbox/ is the call's own (a one-call workspace).
    outbox: Path | None
    #: sandbox path -> host folder, read-only.
    mounts: Mapping[str, Path]
    workdir: str
    #: The worker's stage (`stage_system`), bound at `STAGE_MOUNT`: the staged
    #: /etc, and a copy of the static prefix when that is the prefix.
    stage: Path
    #: The command bwrap executes first (`command_prefix.py`).
    prefix: CommandPrefix


@functools.lru_cache(maxsize=256)
def _needs_workdir(workdir: str, mount_targets: tuple[str, ...]) -> bool:
    """True if no bound folder provides `workdir` (then it is made, empty): per agent,
    so cached (the paths' parsing cost ~0.1 ms a call)."""
    p = PurePosixPath(workdir)
    roots = (SANDBOX_HOME, PACKAGE_PATH, *mount_targets, "/usr", "/etc", "/proc", "/dev")
    return not any(p == PurePosixPath(r) or PurePosixPath(r) in p.parents for r in roots)


@functools.lru_cache(maxsize=8)
def _fixed_options(stage: Path, prefix: CommandPrefix) -> tuple[str, ...]:
    """The options that are the same for every call of this worker (cached)."""
    opts: list[str] = [
        # Namespaces: net, pid, ipc, uts, cgroup, user (explicit: --disable-userns needs it).
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",  # no nested user namespace: no way to regain capabilities
        "--die-with-parent",  # the worker thread that spawned us dies -> so does the call
        "--new-session",  # setsid before exec: no controlling terminal, no TIOCSTI target
        "--cap-drop",
        "ALL",  # run as root, bwrap would keep capabilities inside
        "--hostname",
        SANDBOX_HOSTNAME,
        "--clearenv",
    ]
    # The prefix's own variables too: it deletes them before it execs the tool.
    for name, value in {**SANDBOX_ENV, **dict(prefix.env)}.items():
        opts += ["--setenv", name, value]

    for top in _SYSTEM_TOP:
        opts += ["--ro-bind", f"/{top}", f"/{top}"]
    for name in _SYSTEM_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            opts += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            opts += ["--ro-bind", str(host), f"/{name}"]
    # The stage, bound once: /etc and the static prefix (a copy) are in it.
    opts += ["--ro-bind", str(stage), STAGE_MOUNT]
    opts += ["--symlink", ETC_MOUNT, "/etc"]

    # No tmpfs at /tmp: the workspace is bound at /tmp/vessel on bwrap's own
    # root, which --remount-ro / makes read-only (a tmpfs there would only be
    # remounted read-only too: one mount and one remount per call, ~0.2 ms).
    opts += ["--proc", "/proc"]
    # Read-only over the new procfs: bwrap covers /proc/irq and /proc/bus only
    # when it runs as root, and /proc/sys never. (The host's /proc/sys, bound:
    # a sysctl file shows the namespaces of the process reading it, so the
    # values are the call's own, as in its own procfs.)
    opts += ["--ro-bind", "/proc/sys", "/proc/sys"]
    opts += ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    opts += ["--dev", "/dev"]
    return tuple(opts)


def bwrap_options(layout: Layout, *, seccomp_fd: int, share_net: bool = False) -> list[str]:
    """Every bwrap option of one call, in order (the command is not included).

    `share_net`: the call runs in the network namespace bwrap is started in (a slot
    launcher's empty one, `launcher_network.py`) instead of a new one of its own."""
    opts = list(_fixed_options(layout.stage, layout.prefix))
    if share_net:
        opts.append("--share-net")
    opts += ["--bind", str(layout.workspace), SANDBOX_HOME]
    if layout.outbox is not None:
        opts += ["--bind", str(layout.outbox), OUTBOX_PATH]
    opts += ["--ro-bind", str(layout.package_dir), PACKAGE_PATH]
    # Shallow mounts first, so a mount nested in another one lands on top of it.
    for target in sorted(layout.mounts, key=lambda t: (t.count("/"), t)):
        opts += ["--ro-bind", str(layout.mounts[target]), target]

    if _needs_workdir(layout.workdir, tuple(layout.mounts)):
        opts += ["--dir", layout.workdir]
    opts += ["--chdir", layout.workdir]

    # Last: nothing but the workspace stays writable (tmpfs in RAM is unbounded).
    opts += ["--remount-ro", "/dev", "--remount-ro", "/"]
    opts += ["--seccomp", str(seccomp_fd)]
    return opts


def spawn_env() -> dict[str, str]:
    """The environment bwrap itself gets: nothing of the worker's.

    bwrap's --clearenv only clears the command's environment; bwrap's own copy
    is readable inside as /proc/1/environ, so it must not hold the worker's.
    """
    return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}
