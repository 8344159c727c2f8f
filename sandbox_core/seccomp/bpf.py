"""The policy compiled to a classic BPF seccomp program (struct sock_filter[]) for one arch.

The program: refuse a foreign seccomp_data.arch and x32 numbers, ENOSYS above the table,
then a binary search (a tree of JGE) over runs of numbers that share a decision, so a
call costs ~log2(runs) comparisons; conditional calls end in a small argument check.

Arguments: only the low 32 bits of args[i] are read (offset 16 + 8*i; the arch check
guarantees a little-endian layout). That is all the kernel uses of each checked
argument: socket, socketpair and personality take int / unsigned int, clone reads
lower_32_bits(flags), setsockopt takes int level and optname, and unshare fails with
EINVAL on any high bit. A high-word check
would only refuse calls the kernel treats exactly like allowed ones.

Classic BPF jumps forward only, jt/jf by at most 255; a longer conditional jump goes
through a JA trampoline (32-bit offset) placed right after it.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from sandbox_core.seccomp import policy
from sandbox_core.seccomp.arches import Arch
from sandbox_core.seccomp.policy import Decision, FlagsClear, OneOf, Refuse, RefuseWhenAll

LD_W_ABS, JA, JEQ, JGT, JGE, JSET, RET = 0x20, 0x05, 0x15, 0x25, 0x35, 0x45, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
MAX_INSNS = 4096  # BPF_MAXINSNS: the kernel refuses a longer program
MAX_JUMP = 255  # jt / jf are 8 bits
NR, ARCH = 0, 4  # offsets in struct seccomp_data


def arg_low(index: int) -> int:
    return 16 + 8 * index


@dataclass
class Label:
    name: str


@dataclass
class Stmt:  # a load or a return
    code: int
    k: int


@dataclass
class Jump:  # conditional; a None target is the next instruction
    code: int
    k: int
    jt: str | None = None
    jf: str | None = None


@dataclass
class Goto:  # JA: 32-bit offset
    target: str


Item = Label | Stmt | Jump | Goto


def assemble(items: list[Item]) -> bytes:
    """Resolve labels into offsets, adding JA trampolines for conditional jumps > 255."""
    fresh = (f"~{n}" for n in itertools.count())
    while True:
        where = _layout(items)
        patched: list[Item] = []
        pos = 0
        for item in items:
            if isinstance(item, Jump) and any(
                t is not None and where[t] - pos - 1 > MAX_JUMP for t in (item.jt, item.jf)
            ):
                patched += _trampolined(item, where, pos, fresh)
            else:
                patched.append(item)
            pos += not isinstance(item, Label)
        if len(patched) == len(items):
            break
        items = patched
    return b"".join(_encode(item, where, pos) for pos, item in _numbered(items))


def _trampolined(jump: Jump, where: dict[str, int], pos: int, fresh: Iterator[str]) -> list[Item]:
    new = Jump(jump.code, jump.k, jump.jt, jump.jf)
    tail: list[Item] = []
    for attr in ("jt", "jf"):
        target = getattr(jump, attr)
        if target is not None and where[target] - pos - 1 > MAX_JUMP:
            hop = next(fresh)
            setattr(new, attr, hop)
            tail += [Label(hop), Goto(target)]
    after = next(fresh)  # a fall-through branch now has the trampolines to step over
    new.jt, new.jf = new.jt or after, new.jf or after
    return [new, *tail, Label(after)]


def _numbered(items: list[Item]) -> Iterator[tuple[int, Item]]:
    pos = 0
    for item in items:
        if not isinstance(item, Label):
            yield pos, item
            pos += 1


def _layout(items: list[Item]) -> dict[str, int]:
    where: dict[str, int] = {}
    pos = 0
    for item in items:
        if isinstance(item, Label):
            if item.name in where:
                raise ValueError(f"label {item.name} twice")
            where[item.name] = pos
        else:
            pos += 1
    return where


def _encode(item: Item, where: dict[str, int], pos: int) -> bytes:
    def offset(target: str | None) -> int:
        off = 0 if target is None else where[target] - pos - 1
        if off < 0:
            raise ValueError(f"backward jump to {target}")
        return off

    if isinstance(item, Stmt):
        return struct.pack("=HBBI", item.code, 0, 0, item.k)
    if isinstance(item, Goto):
        return struct.pack("=HBBI", JA, 0, 0, offset(item.target))
    assert isinstance(item, Jump)
    return struct.pack("=HBBI", item.code, offset(item.jt), offset(item.jf), item.k)


class _Program:
    """Emits the program: prologue, search tree, then argument checks and returns."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self._blocks: dict[Decision, str] = {}  # decision -> label of its code
        self._names = (f"L{n}" for n in itertools.count())

    def fresh(self) -> str:
        return next(self._names)

    def target(self, decision: Decision) -> str:
        """The label of the code that carries out ``decision`` (emitted later, once)."""
        if decision not in self._blocks:
            self._blocks[decision] = self.fresh()
        return self._blocks[decision]

    def emit(self, *items: Item) -> None:
        self.items.extend(items)

    def search(self, runs: list[tuple[int, Decision]]) -> str:
        """Emit a JGE tree over ``runs`` (first number, decision); return its entry label."""
        if len(runs) == 1:
            return self.target(runs[0][1])
        entry, mid = self.fresh(), len(runs) // 2
        jump = Jump(JGE, runs[mid][0])
        self.emit(Label(entry), jump)
        jump.jf = self.search(runs[:mid])  # emitted right here when it is a subtree
        jump.jt = self.search(runs[mid:])
        return entry

    def blocks(self) -> None:
        """Emit every decision's code: argument checks, then the returns they jump to."""
        checks = [d for d in self._blocks if not _returns(d)]
        for decision in checks:
            self.emit(Label(self._blocks[decision]))
            self._decision(decision)
        for decision in [d for d in self._blocks if _returns(d)]:
            self.emit(Label(self._blocks[decision]))
            self._decision(decision)

    def _decision(self, d: Decision) -> None:
        if isinstance(d, policy.Allow):
            self.emit(Stmt(RET, RET_ALLOW))
        elif isinstance(d, Refuse):
            self.emit(Stmt(RET, RET_ERRNO | d.errno))
        elif isinstance(d, FlagsClear):
            refuse = self.target(Refuse(d.refuse))
            self.emit(Stmt(LD_W_ABS, arg_low(d.index)))
            self.emit(Jump(JSET, d.mask, refuse, self.target(policy.ALLOW)))
        elif isinstance(d, RefuseWhenAll):
            refuse, allow = self.target(Refuse(d.refuse)), self.target(policy.ALLOW)
            for i, (index, value) in enumerate(d.equal):
                last = i == len(d.equal) - 1
                self.emit(Stmt(LD_W_ABS, arg_low(index)))
                self.emit(Jump(JEQ, value, refuse if last else None, allow))
        else:
            self._one_of(d)

    def _one_of(self, d: OneOf) -> None:
        refuse, allow = self.target(Refuse(d.refuse)), self.target(policy.ALLOW)
        requires = {value: (other, want) for value, other, want in d.requires}
        checks: list[tuple[str, int, int]] = []
        self.emit(Stmt(LD_W_ABS, arg_low(d.index)))
        for i, value in enumerate(d.values):
            last = i == len(d.values) - 1
            if value in requires:
                label = self.fresh()
                checks.append((label, *requires[value]))
                self.emit(Jump(JEQ, value, label, refuse if last else None))
            else:
                self.emit(Jump(JEQ, value, allow, refuse if last else None))
        for label, other, want in checks:
            self.emit(Label(label), Stmt(LD_W_ABS, arg_low(other)), Jump(JEQ, want, allow, refuse))


def _returns(d: Decision) -> bool:
    return isinstance(d, policy.Allow | Refuse)


def runs(arch: Arch) -> list[tuple[int, Decision]]:
    """Numbers 0..highest as runs (first number, decision): the policy's decision, the
    default for a call no rule names, ENOSYS for a number the table has no call for."""
    by_number = {arch.syscalls[name]: d for name, d in policy.decisions(arch).items()}
    known = set(arch.syscalls.values())
    out: list[tuple[int, Decision]] = []
    for nr in range(arch.highest + 1):
        default = policy.DEFAULT_ERRNO if nr in known else policy.NEWER_ERRNO
        decision = by_number.get(nr, Refuse(default))
        if not out or out[-1][1] != decision:
            out.append((nr, decision))
    return out


def compile_filter(arch: Arch) -> bytes:
    program = _Program()
    foreign = program.target(Refuse(policy.FOREIGN_ERRNO))
    program.emit(Stmt(LD_W_ABS, ARCH), Jump(JEQ, arch.audit, None, foreign))
    program.emit(Stmt(LD_W_ABS, NR))
    if arch.x32_bit is not None:
        program.emit(Jump(JGE, arch.x32_bit, foreign, None))
    program.emit(Jump(JGT, arch.highest, program.target(Refuse(policy.NEWER_ERRNO)), None))
    search = runs(arch)
    program.search(search)  # its root is the next instruction: len(search) > 1
    program.blocks()
    code = assemble(program.items)
    if len(code) // 8 > MAX_INSNS:
        raise ValueError(f"{arch.name}: {len(code) // 8} instructions, over {MAX_INSNS}")
    return code
