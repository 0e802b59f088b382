"""Landlock inside the sandbox: no socket file anywhere, no abstract socket reached.

The seccomp filter refuses socket(AF_UNIX), but socketpair(AF_UNIX) must stay
(asyncio and many runtimes use it as a self-pipe), and bind() on one of its
ends makes a socket file, or binds an abstract name: a filter cannot read
bind()'s address. Landlock can:

- `LANDLOCK_ACCESS_FS_MAKE_SOCK` handled, and granted nowhere: bind() to a
  path (and mknod(S_IFSOCK)) fails with EACCES everywhere in the sandbox.
- the `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` scope: connect()/sendto() to an
  abstract name bound outside the call's own Landlock domain fails with EPERM.
  (Abstract names live in a network namespace, and no two calls are ever in
  one at once: `launcher_network.py`. The scope also covers anything outside
  the call that would share its namespace.)

A Landlock domain that handles any filesystem right forbids mount(2), which
bwrap needs for its setup, so the ruleset is applied INSIDE the sandbox, after
bwrap's setup, by the command bwrap executes. Two implementations do the same
(`command_prefix.py` picks one): `landlock_exec.c`, a static executable bound
into each call (the default where it is built: ~0.07 ms a call), and
`COMMAND_PREFIX` (where it is not), a Perl
one-liner (perl-base is Essential in Debian, so /usr/bin/perl is in every
Debian image; its built-in `syscall()` needs no module) that applies the
ruleset, deletes PWD (bwrap sets it after --chdir; seed 000's environment holds
exactly five variables) and its own `PREFIX_ENV`, and `exec`s the tool's
command: the tool is the same process, so its exit status and its death by
signal are bwrap's to report, as before. It replaced `/usr/bin/env -u PWD --`;
a call costs about 1 ms more (measured: docs/sockets-and-landlock.md).

Best effort per Landlock ABI (what the running kernel offers; never fails a
call because Landlock is missing):

    ABI 0 (no Landlock, or disabled at boot)  nothing; seccomp and namespaces only
    ABI 1 (5.13-5.18)                         nothing: see below
    ABI 2-5 (5.19+)                           socket files refused
    ABI 6+ (6.12+)                            socket files refused, abstract names scoped

Every filesystem domain also handles LANDLOCK_ACCESS_FS_REFER (moving or
linking a file into another folder) whether asked or not; the ruleset handles
it explicitly and grants it beneath / (a rule), so renames work as before.
ABI 1 has no way to grant REFER: a domain there would make every rename into
another folder fail with EXDEV, so ABI 1 gets no domain at all.

The syscall numbers (444, 445, 446) are the same on every architecture (new
system calls share one table since 5.1). The ruleset's fd is close-on-exec
(the kernel makes it so) and so is the O_PATH fd of / (Perl marks every fd it
opens above 2 so): the tool inherits neither. The domain lives on through
exec and is inherited by every child.

With `REPORT_FLAG` as the first word of the command, the prefix first prints
one line saying what it applied (the kernel accepted the ruleset and the
domain) and what it saw refused, tested, not assumed: a socketpair end bound
to a path in $TMPDIR, and a datagram sent to an abstract name bound before
the domain (as by anything outside the call). The confinement probe runs it
at start-up (`probe.py`, which logs it). A tool may use the flag too: it
learns nothing it could not test itself.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ABI_REFER",
    "ABI_SCOPE",
    "COMMAND_PREFIX",
    "PERL",
    "PREFIX_ENV",
    "REPORT_FLAG",
    "SCRIPT",
    "LandlockReport",
    "kernel_abi",
    "parse_report",
]

PERL = "/usr/bin/perl"
#: The first ABI whose rulesets can grant REFER: socket files are refused from here.
ABI_REFER = 2
#: The first ABI with scopes (LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET).
ABI_SCOPE = 6
#: Command's first word that makes the prefix print its report line first.
REPORT_FLAG = "--vessel-landlock-report"

#: Set by bwrap for the prefix alone (it deletes them before exec): Perl skips
#: loading the C.UTF-8 locale at start-up (about 0.35 ms of CPU per call here;
#: the prefix prints nothing locale-dependent).
PREFIX_ENV: Mapping[str, str] = {"PERL_SKIP_LOCALE_INIT": "1"}

_SYS_CREATE_RULESET = 444
_CREATE_RULESET_VERSION = 1  # landlock_create_ruleset(NULL, 0, this) returns the ABI
_MAKE_SOCK = 1 << 9  # LANDLOCK_ACCESS_FS_MAKE_SOCK (ABI 1)
_REFER = 1 << 13  # LANDLOCK_ACCESS_FS_REFER (ABI 2)
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (ABI 6)

# The one-liner. First every signal back to its default disposition (ignored
# ones survive execve; a worker started with SIGINT ignored would hand that on
# to the tool). $abi: the ABI (-1: no Landlock). The ruleset attribute is
# {u64 handled_access_fs; u64 handled_access_net; u64 scoped}; the size passed
# (8 or 24) tells the kernel which fields are given. The rule is
# {u64 allowed_access; s32 parent_fd} packed (12 bytes), type 1 = PATH_BENEATH,
# on an O_PATH (010000000) fd of /. no_new_privs is already set by bwrap.
# In report mode, before the domain: a datagram socketpair end ($x), turned
# unconnected (connect AF_UNSPEC: then anyone may send to it) and bound to an
# abstract name; after it: $p, 1 if binding a socketpair end to a path was
# refused, and $n, 1 if sending to that name from inside the domain was
# (-1: not tested).
_PERL_SCRIPT = r"""
$SIG{$_} = 'DEFAULT' for keys %SIG;
my $r = $ARGV[0] eq '@REPORT@' && shift;
my ($abi, $fs, $sc, $p, $n, $x) = (syscall(444, 0, 0, 1), 0, 0, 0, 0, 0);
my $an = pack('S', 1) . "\0vessel-landlock-$$";
$x = socketpair(U, V, 1, 2, 0) && connect(U, pack('S', 0)) && bind(U, $an) if $r;
if ($abi >= @ABI_REFER@) {
  my $s = $abi >= @ABI_SCOPE@ ? @SCOPE@ : 0;
  my ($fd, $root) = syscall(444, pack('QQQ', @HANDLED@, 0, $s), $s ? 24 : 8, 0);
  if ($fd >= 0 && sysopen($root, '/', 010000000)
      && syscall(445, $fd, 1, pack('Ql', @REFER@, fileno $root), 0) == 0
      && syscall(446, $fd, 0) == 0) { $fs = 1; $sc = $s ? 1 : 0 }
}
if ($r) {
  my $path = ($ENV{TMPDIR} || '/tmp') . "/.vessel-landlock-$$";
  socketpair(C, D, 1, 2, 0) or die "socketpair: $!";
  $p = bind(C, pack('S', 1) . $path) ? 0 : 1; unlink $path unless $p;
  $n = $x ? (send(C, 'x', 0, $an) ? 0 : 1) : -1;
  print "vessel-landlock: abi=$abi make_sock=$fs scope_abstract=$sc ",
    "socket_file_refused=$p abstract_send_refused=$n\n";
}
delete @ENV{'PWD', @PREFIX_ENV@};
exec { $ARGV[0] } @ARGV;
my ($e, $m) = ($! + 0, "$!");
print STDERR "cannot run '$ARGV[0]': $m\n";
exit($e == 2 ? 127 : 126);
"""

SCRIPT: str = (
    _PERL_SCRIPT.strip()
    .replace("@REPORT@", REPORT_FLAG)
    .replace("@ABI_REFER@", str(ABI_REFER))
    .replace("@ABI_SCOPE@", str(ABI_SCOPE))
    .replace("@SCOPE@", str(_SCOPE_ABSTRACT_UNIX_SOCKET))
    .replace("@HANDLED@", str(_MAKE_SOCK | _REFER))
    .replace("@REFER@", str(_REFER))
    .replace("@PREFIX_ENV@", ", ".join(f"'{name}'" for name in PREFIX_ENV))
)

#: What bwrap executes: the prefix, then the tool's command (`--` ends perl's
#: own options, so a command starting with `-` is still a command).
COMMAND_PREFIX: tuple[str, ...] = (PERL, "-e", SCRIPT, "--")

_REPORT_LINE = re.compile(
    r"^vessel-landlock: abi=(-?\d+) make_sock=([01]) scope_abstract=([01]) "
    r"socket_file_refused=([01]) abstract_send_refused=(-?[01])$",
    re.MULTILINE,
)


def kernel_abi() -> int:
    """The Landlock ABI of the running kernel (0: none, or disabled at boot)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        abi = int(libc.syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(abi, 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class LandlockReport:
    """What the prefix applied in one call, and what it saw refused."""

    abi: int
    make_sock: bool
    scope_abstract: bool
    socket_file_refused: bool
    #: None: the test name could not be bound before the domain (not tested).
    abstract_send_refused: bool | None

    @property
    def expected(self) -> tuple[bool, bool]:
        """(socket files refused, abstract names scoped): what this kernel's ABI allows."""
        return self.abi >= ABI_REFER, self.abi >= ABI_SCOPE

    def problems(self) -> list[str]:
        """What this kernel offers but is not in force (empty: all it can hold, holds)."""
        files, scoped = self.expected
        out = []
        if files and not (self.make_sock and self.socket_file_refused):
            out.append(
                f"Landlock ABI {self.abi} can refuse socket files, but a socket file "
                "could be made in the sandbox"
            )
        if scoped and not (self.scope_abstract and self.abstract_send_refused is not False):
            out.append(
                f"Landlock ABI {self.abi} can scope abstract unix sockets, but one bound "
                "outside the call's domain could be reached"
            )
        return out

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.abi <= 0:
            where = "no Landlock in this kernel (5.13+ with CONFIG_SECURITY_LANDLOCK, lsm=landlock)"
        else:
            where = f"Landlock ABI {self.abi}"
        files = (
            "socket files refused (LANDLOCK_ACCESS_FS_MAKE_SOCK)"
            if self.make_sock and self.socket_file_refused
            else "socket files NOT refused (needs Landlock ABI 2, kernel 5.19+)"
        )
        abstract = (
            "abstract unix sockets scoped to the call (LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET)"
            if self.scope_abstract and self.abstract_send_refused is not False
            else "abstract unix sockets NOT scoped (needs Landlock ABI 6, kernel 6.12+; "
            "a call's network namespace, never two calls' at once, still holds its names)"
        )
        return f"{where}: {files}; {abstract}"


def parse_report(output: str) -> LandlockReport | None:
    """The report line the prefix printed in `REPORT_FLAG` mode (None: none found)."""
    match = _REPORT_LINE.search(output)
    if match is None:
        return None
    abi, make_sock, scoped, file_refused, send_refused = match.groups()
    return LandlockReport(
        abi=max(int(abi), 0),
        make_sock=make_sock == "1",
        scope_abstract=scoped == "1",
        socket_file_refused=file_refused == "1",
        abstract_send_refused=None if send_refused == "-1" else send_refused == "1",
    )
