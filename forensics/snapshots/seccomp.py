"""Would a process's seccomp filters let a system call through?

The ptrace snapshot injects system calls (clone, close_range, wait4) into a
process; under a filter that kills, traps or fails them, it must not.  The
filters (classic BPF programs, read with PTRACE_SECCOMP_GET_FILTER) are run
here on the seccomp_data the kernel would give them, and the results
combined as the kernel combines them: the strictest action wins.
"""

from __future__ import annotations

import struct

AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ACTION_FULL = 0xFFFF0000
_RET_ALLOW = 0x7FFF0000
_RET_LOG = 0x7FFC0000


def run_filter(prog: list[tuple[int, int, int, int]], data: bytes) -> int:
    """Run one classic BPF seccomp program on seccomp_data *data*; its 32-bit result."""
    a = x = 0
    mem = [0] * 16
    pc = 0
    m32 = 0xFFFFFFFF
    for _ in range(4096):
        if pc >= len(prog):
            return 0  # falls off the end: the kernel never loads such a filter
        code, jt, jf, k = prog[pc]
        pc += 1
        cls = code & 0x07
        if cls == 0x00:  # BPF_LD
            mode = code & 0xE0
            if mode == 0x20 and (code & 0x18) == 0x00:  # ABS, W
                a = struct.unpack_from("<I", data, k)[0] if k + 4 <= len(data) else 0
            elif mode == 0x00:  # IMM
                a = k
            elif mode == 0x60:  # MEM
                a = mem[k & 15]
            elif mode == 0x80:  # LEN
                a = len(data)
            else:
                return 0
        elif cls == 0x01:  # BPF_LDX
            mode = code & 0xE0
            x = k if mode == 0x00 else mem[k & 15] if mode == 0x60 else len(data) if mode == 0x80 else 0
        elif cls == 0x02:  # BPF_ST
            mem[k & 15] = a
        elif cls == 0x03:  # BPF_STX
            mem[k & 15] = x
        elif cls == 0x04:  # BPF_ALU
            op = code & 0xF0
            src = x if code & 0x08 else k
            if op == 0x00:
                a = (a + src) & m32
            elif op == 0x10:
                a = (a - src) & m32
            elif op == 0x20:
                a = (a * src) & m32
            elif op == 0x30:
                if not src:
                    return 0  # the kernel's converted program ends: KILL_THREAD
                a = a // src
            elif op == 0x40:
                a |= src
            elif op == 0x50:
                a &= src
            elif op == 0x60:
                a = (a << (src & 31)) & m32  # x86 masks the count to 5 bits
            elif op == 0x70:
                a = a >> (src & 31)
            elif op == 0x80:
                a = (-a) & m32
            elif op == 0x90:
                if not src:
                    return 0
                a = a % src
            elif op == 0xA0:
                a ^= src
        elif cls == 0x05:  # BPF_JMP
            op = code & 0xF0
            src = x if code & 0x08 else k
            if op == 0x00:  # JA
                pc += k
                continue
            if op == 0x10:
                cond = a == src
            elif op == 0x20:
                cond = a > src
            elif op == 0x30:
                cond = a >= src
            elif op == 0x40:
                cond = bool(a & src)
            else:
                return 0
            pc += jt if cond else jf
        elif cls == 0x06:  # BPF_RET
            return (a if (code & 0x18) == 0x10 else k) & m32
        elif cls == 0x07:  # BPF_MISC
            if code & 0xF8 == 0x00:
                x = a  # TAX
            else:
                a = x  # TXA
    return 0


def _action_rank(ret: int) -> int:
    """The kernel's precedence of a filter result (lower wins)."""
    action = ret & _RET_ACTION_FULL
    order = (0x80000000, 0x00000000, 0x00030000, 0x00050000, 0x7FC00000, 0x7FF00000, _RET_LOG,
             _RET_ALLOW)
    return order.index(action) if action in order else 0


def seccomp_allows(filters, nr: int, args: tuple[int, ...], ip: int) -> bool:
    """Would these filters let system call *nr* with *args* at *ip* run?"""
    a = list(args) + [0] * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, AUDIT_ARCH_X86_64, ip, *[v & ((1 << 64) - 1) for v in a])
    worst = _RET_ALLOW
    for prog in filters:
        r = run_filter(prog, data)
        if _action_rank(r) < _action_rank(worst):
            worst = r
    return (worst & _RET_ACTION_FULL) in (_RET_ALLOW, _RET_LOG)
