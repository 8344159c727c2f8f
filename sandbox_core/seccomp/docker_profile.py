"""The policy as a Docker seccomp profile (``docker run --security-opt seccomp=<json>``).

Written the way moby's own default profile is: default SCMP_ACT_ERRNO (EPERM), one entry
of allowed names, and argument rules (SCMP_CMP_MASKED_EQ for flags, SCMP_CMP_EQ for
values; each entry's conditions on distinct arguments, which runc ANDs; several
entries for one call are ORed). A refusal with
another errno than the default is spelt out value by value, because libseccomp lets a
call's unconditional rule override its conditional ones. libseccomp compares all 64
bits, so a stray high word is refused here where the BPF filter lets the kernel drop it
(but by RefuseWhenAll's entries, which test bits of the low word one by one).
runc itself answers ENOSYS above the highest call it knows, like bpf.py does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sandbox_core.seccomp import policy
from sandbox_core.seccomp.arches import ARCHES
from sandbox_core.seccomp.policy import Decision, FlagsClear, OneOf, Refuse, RefuseWhenAll, Rule

Entry = dict[str, Any]


def _arg(index: int, value: int, op: str, value_two: int = 0) -> dict[str, Any]:
    return {"index": index, "value": value, "valueTwo": value_two, "op": op}


def _allow(args: list[dict[str, Any]]) -> Entry:
    return {"action": "SCMP_ACT_ALLOW", "args": args}


def _errno(errno: int, args: list[dict[str, Any]] | None = None) -> Entry:
    entry: Entry = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno}
    if args:
        entry["args"] = args
    return entry


def _entries(d: Decision) -> Iterator[Entry]:
    """Entries (without names) that carry out ``d`` for one call."""
    default = policy.DEFAULT_ERRNO
    if isinstance(d, policy.Allow):
        yield {"action": "SCMP_ACT_ALLOW"}
    elif isinstance(d, Refuse):
        if d.errno != default:
            yield _errno(d.errno)
    elif isinstance(d, FlagsClear):
        yield _allow([_arg(d.index, d.mask, "SCMP_CMP_MASKED_EQ", 0)])
        if d.refuse != default:  # any one of the bits set
            for bit in (1 << i for i in range(64) if d.mask >> i & 1):
                yield _errno(d.refuse, [_arg(d.index, bit, "SCMP_CMP_MASKED_EQ", bit)])
    elif isinstance(d, RefuseWhenAll):
        # Allowed where some argument differs from its value in one of its low 32 bits
        # (the kernel reads an int there: comparing all 64 would let a stray high word
        # through), bit by bit; the rest is refused by the default.
        for index, value in d.equal:
            for bit in (1 << i for i in range(32)):
                yield _allow([_arg(index, bit, "SCMP_CMP_MASKED_EQ", ~value & bit)])
    else:
        yield from _one_of(d)


def _one_of(d: OneOf) -> Iterator[Entry]:
    requires = {value: (other, want) for value, other, want in d.requires}
    for value in d.values:
        args = [_arg(d.index, value, "SCMP_CMP_EQ")]
        if value in requires:
            other, want = requires[value]
            args.append(_arg(other, want, "SCMP_CMP_EQ"))
        yield _allow(args)
    if d.refuse == policy.DEFAULT_ERRNO:
        return
    for value in range(d.known_below):
        if value not in d.values:
            yield _errno(d.refuse, [_arg(d.index, value, "SCMP_CMP_EQ")])
    yield _errno(d.refuse, [_arg(d.index, d.known_below, "SCMP_CMP_GE")])
    for value, (other, want) in requires.items():
        args = [_arg(d.index, value, "SCMP_CMP_EQ"), _arg(other, want, "SCMP_CMP_NE")]
        yield _errno(d.refuse, args)


def _with_names(rule: Rule, names: list[str], entry: Entry, first: bool) -> Entry:
    out: Entry = {"names": names, **entry}
    if first:  # the reason once per rule: the profile travels in every container's config
        out["comment"] = rule.why
    if rule.arches != policy.ALL_ARCHES:
        out["includes"] = {"arches": [ARCHES[a].docker for a in rule.arches]}
    return out


def profile() -> dict[str, Any]:
    policy.check()
    syscalls: list[Entry] = []
    for rule in policy.RULES:
        if isinstance(rule.decision, policy.Allow | Refuse):  # one entry for all its names
            groups = [list(rule.names)]
        else:
            groups = [[name] for name in rule.names]
        entries = [(names, e) for names in groups for e in _entries(rule.decision)]
        syscalls += [_with_names(rule, n, e, i == 0) for i, (n, e) in enumerate(entries)]
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": policy.DEFAULT_ERRNO,
        "architectures": [arch.scmp for arch in ARCHES.values()],
        "syscalls": syscalls,
    }


def profile_json() -> str:
    return json.dumps(profile(), separators=(",", ":"))
