"""The compiled seccomp filter decides every native system call as `seccomp.RULES` say.

The filter's bytes are run by `seccomp_check.decide` (the kernel's reading of
classic BPF) for every system call number and for arguments that meet and miss
each rule's conditions; the expected decision comes from the rules themselves,
not from another compilation. The hostile catalogue proves the same refusals
through real calls, for the few system calls it tries.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence

import pyseccomp
import pytest

from workers.sandbox import seccomp
from workers.sandbox.seccomp_check import (
    AUDIT_ARCH_I386,
    AUDIT_ARCH_X86_64,
    decide,
    instructions,
)

ARCH = pyseccomp.system_arch()
#: Past the highest system call number of any architecture libseccomp knows today.
MAX_NR = 600
_ARG_MASK = 0xFFFFFFFFFFFFFFFF
_KILL_ACTIONS = (pyseccomp.KILL_THREAD, pyseccomp.KILL_PROCESS)


def _numbered_rules() -> dict[int, list[seccomp.Rule]]:
    by_nr: dict[int, list[seccomp.Rule]] = {}
    for rule in seccomp.RULES:
        nr = pyseccomp.resolve_syscall(ARCH, rule.syscall)
        if nr >= 0:  # not a system call of this architecture: libseccomp leaves it out
            by_nr.setdefault(nr, []).append(rule)
    return by_nr


RULES_BY_NR = _numbered_rules()


def _holds(condition: tuple[int, int, int, int], args: Sequence[int]) -> bool:
    index, op, a, b = condition
    value = args[index] if index < len(args) else 0
    if op == pyseccomp.MASKED_EQ:
        return (value & a) == b
    if op == pyseccomp.NE:
        return value != a
    if op == pyseccomp.EQ:
        return value == a
    raise AssertionError(f"the test does not know comparison {op}")


def expected(nr: int, args: Sequence[int]) -> int:
    """What the rules say: the first rule of `nr` whose conditions all hold refuses it."""
    for rule in RULES_BY_NR.get(nr, ()):
        if all(_holds(c, args) for c in rule.args):
            return pyseccomp.ERRNO(rule.errno)
    return pyseccomp.ALLOW


def probes(nr: int) -> Iterator[tuple[int, ...]]:
    """Arguments that meet and that miss each condition of `nr`'s rules (high bits too)."""
    yield ()
    yield (_ARG_MASK,) * 6
    for rule in RULES_BY_NR.get(nr, ()):
        for index, op, a, b in rule.args:
            hits = (b, b | (1 << 32), b | 0xFFFF0000) if op == pyseccomp.MASKED_EQ else (a,)
            for value in (*hits, a + 1, 0, (a ^ 0xFF) & _ARG_MASK):
                args = [0] * 6
                args[index] = value & _ARG_MASK
                yield tuple(args)


@pytest.fixture(scope="module")
def program() -> list[tuple[int, int, int, int]]:
    return instructions(seccomp.filter_bytes())


def test_every_native_system_call_is_decided_as_the_rules_say(
    program: list[tuple[int, int, int, int]],
) -> None:
    wrong = []
    for nr in range(MAX_NR):
        for args in probes(nr):
            got = decide(program, nr, args, arch=ARCH).value
            if got != expected(nr, args):
                wrong.append((nr, args, hex(got), hex(expected(nr, args))))
    assert not wrong, wrong[:10]


def test_each_rule_refuses_with_its_errno(program: list[tuple[int, int, int, int]]) -> None:
    tiocsti = pyseccomp.resolve_syscall(ARCH, "ioctl")
    assert decide(program, tiocsti, (1, seccomp.TIOCSTI), arch=ARCH).value == pyseccomp.ERRNO(
        errno.EPERM
    )
    # The kernel compares the low 32 bits of an ioctl request: so does the filter.
    assert decide(
        program, tiocsti, (1, seccomp.TIOCSTI | (7 << 32)), arch=ARCH
    ).value == pyseccomp.ERRNO(errno.EPERM)
    clone3 = pyseccomp.resolve_syscall(ARCH, "clone3")
    assert decide(program, clone3, arch=ARCH).value == pyseccomp.ERRNO(errno.ENOSYS)
    read = pyseccomp.resolve_syscall(ARCH, "read")
    assert decide(program, read, (0, 0, 4096), arch=ARCH).value == pyseccomp.ALLOW


def test_another_abi_is_killed(program: list[tuple[int, int, int, int]]) -> None:
    other = AUDIT_ARCH_I386 if ARCH == AUDIT_ARCH_X86_64 else AUDIT_ARCH_X86_64
    assert decide(program, 0, arch=other).action in _KILL_ACTIONS
    if ARCH == AUDIT_ARCH_X86_64:  # x32: the same arch token, the 0x40000000 bit set
        read = pyseccomp.resolve_syscall(ARCH, "read")
        assert decide(program, read | 0x40000000, arch=ARCH).action in _KILL_ACTIONS


def test_a_decision_walks_a_tree_not_the_list(program: list[tuple[int, int, int, int]]) -> None:
    # What every system call outside the kernel's allow cache pays (ioctl, socket,
    # clone, personality: the rules that look at arguments): a few comparisons.
    ordered = instructions(seccomp.build_filter_bytes(tree=False))
    worst = max(decide(program, nr, arch=ARCH).steps for nr in range(MAX_NR))
    worst_ordered = max(decide(ordered, nr, arch=ARCH).steps for nr in range(MAX_NR))
    assert worst <= 40, worst
    assert worst * 2 < worst_ordered, (worst, worst_ordered)


def test_the_interpreter_refuses_what_is_not_a_filter() -> None:
    with pytest.raises(ValueError, match="8-byte instructions"):
        instructions(b"\x06\x00\x00")
    with pytest.raises(ValueError, match="runs past its end"):
        decide([(0x20, 0, 0, 0)], 0)  # a load, then nothing
    with pytest.raises(ValueError, match="outside seccomp_data"):
        decide([(0x20, 0, 0, 64), (0x06, 0, 0, 0)], 0)
    with pytest.raises(ValueError, match="has no place in a filter"):
        decide([(0xFF, 0, 0, 0)], 0)
