"""Run the compiled seccomp filter on a system call, as the kernel does, to see what it decides.

libseccomp compiles `seccomp.RULES` to classic BPF; which instructions it emits
depends on its version and on the filter's optimisation (`seccomp.py` asks for a
binary tree). This interpreter reads those bytes the way the kernel's
`seccomp_run_filters` does, over a `struct seccomp_data` built from a system
call number, an audit architecture and six arguments, so the tests can check
every native system call's decision against the rules, and the bench can say
how many instructions a decision walks (`Decision.steps`): what each call's
tool pays on every system call the kernel's allow cache does not cover.

Only what a seccomp filter may contain is accepted (loads of `seccomp_data`,
the scratch memory, ALU with constants, jumps, returns); anything else is a
ValueError naming the instruction.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AUDIT_ARCH_I386", "AUDIT_ARCH_X86_64", "Decision", "decide", "instructions"]

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003

_INSTRUCTION = struct.Struct("<HBBI")  # struct sock_filter: code, jt, jf, k
_MASK32 = 0xFFFFFFFF
#: Far more than any path through a filter of a few hundred instructions: a
#: filter jumps only forwards, so a longer walk means a broken interpreter.
_MAX_STEPS = 4096


@dataclass(frozen=True, slots=True)
class Decision:
    #: The filter's return value: SECCOMP_RET_* action in the high 16 bits, data below.
    value: int
    #: Instructions executed to reach it.
    steps: int

    @property
    def action(self) -> int:
        return self.value & 0xFFFF0000

    @property
    def data(self) -> int:
        return self.value & 0xFFFF


def instructions(program: bytes) -> list[tuple[int, int, int, int]]:
    """The (code, jt, jf, k) instructions of a filter's bytes."""
    if len(program) % _INSTRUCTION.size:
        raise ValueError(f"a BPF program is 8-byte instructions, not {len(program)} bytes")
    return [_INSTRUCTION.unpack_from(program, i) for i in range(0, len(program), 8)]


def _seccomp_data(nr: int, arch: int, args: Sequence[int]) -> bytes:
    """struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]."""
    padded = [*args, *([0] * (6 - len(args)))]
    if len(padded) != 6:
        raise ValueError("a system call has at most six arguments")
    return struct.pack("<iIQ6Q", nr, arch, 0, *(a & 0xFFFFFFFFFFFFFFFF for a in padded))


def decide(
    program: bytes | Sequence[tuple[int, int, int, int]],
    nr: int,
    args: Sequence[int] = (),
    *,
    arch: int = AUDIT_ARCH_X86_64,
) -> Decision:
    """What the filter returns for system call `nr` with `args` under `arch`."""
    code_list = instructions(program) if isinstance(program, bytes) else list(program)
    data = _seccomp_data(nr, arch, args)
    a = x = 0
    mem = [0] * 16
    pc = steps = 0
    while steps < _MAX_STEPS:
        if not 0 <= pc < len(code_list):
            raise ValueError(f"the filter runs past its end at instruction {pc}")
        code, jt, jf, k = code_list[pc]
        steps += 1
        pc += 1
        cls = code & 0x07
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            if k % 4 or k + 4 > len(data):
                raise ValueError(f"instruction {pc - 1}: load at offset {k} outside seccomp_data")
            a = struct.unpack_from("<I", data, k)[0]
        elif code == 0x00:  # BPF_LD | BPF_IMM
            a = k
        elif code == 0x60:  # BPF_LD | BPF_MEM
            a = mem[k]
        elif code == 0x01:  # BPF_LDX | BPF_IMM
            x = k
        elif code == 0x61:  # BPF_LDX | BPF_MEM
            x = mem[k]
        elif code == 0x02:  # BPF_ST
            mem[k] = a
        elif code == 0x03:  # BPF_STX
            mem[k] = x
        elif cls == 0x04:  # BPF_ALU
            operand = x if code & 0x08 else k
            a = _alu(code & 0xF0, a, operand, pc - 1) & _MASK32
        elif cls == 0x05:  # BPF_JMP
            op = code & 0xF0
            operand = x if code & 0x08 else k
            if op == 0x00:  # JA
                pc += k
                continue
            taken = {
                0x10: a == operand,
                0x20: a > operand,
                0x30: a >= operand,
                0x40: bool(a & operand),
            }.get(op)
            if taken is None:
                raise ValueError(f"instruction {pc - 1}: jump op {op:#x} is not classic BPF")
            pc += jt if taken else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return Decision(value=k, steps=steps)
        elif code == 0x16:  # BPF_RET | BPF_A
            return Decision(value=a, steps=steps)
        elif code == 0x07:  # BPF_MISC | BPF_TAX
            x = a
        elif code == 0x87:  # BPF_MISC | BPF_TXA
            a = x
        else:
            raise ValueError(f"instruction {pc - 1}: code {code:#06x} has no place in a filter")
    raise ValueError(f"the filter did not return within {_MAX_STEPS} instructions")


def _alu(op: int, a: int, operand: int, at: int) -> int:
    if op in (0x30, 0x90) and operand == 0:
        raise ValueError(f"instruction {at}: division by zero")
    ops = {
        0x00: lambda: a + operand,
        0x10: lambda: a - operand,
        0x20: lambda: a * operand,
        0x30: lambda: a // operand,
        0x40: lambda: a | operand,
        0x50: lambda: a & operand,
        0x60: lambda: a << (operand & 31),
        0x70: lambda: a >> (operand & 31),
        0x80: lambda: -a,
        0x90: lambda: a % operand,
        0xA0: lambda: a ^ operand,
    }
    if op not in ops:
        raise ValueError(f"instruction {at}: ALU op {op:#x} is not classic BPF")
    return ops[op]()
