"""The architectures the policy is compiled for: their audit ids, names and syscall tables."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass

from sandbox_core.seccomp import syscalls_aarch64, syscalls_x86_64


@dataclass(frozen=True)
class Arch:
    name: str  # platform.machine()
    audit: int  # AUDIT_ARCH_*: seccomp_data.arch of the native ABI
    scmp: str  # libseccomp's name, for a Docker profile's "architectures"
    docker: str  # Go's name, for a Docker profile's "includes"
    syscalls: Mapping[str, int]
    # x86_64 only: x32 calls are native-arch calls with this bit set in the number.
    x32_bit: int | None = None

    @property
    def highest(self) -> int:
        return max(self.syscalls.values())


X86_64 = Arch(
    "x86_64", 0xC000003E, "SCMP_ARCH_X86_64", "amd64", syscalls_x86_64.SYSCALLS, 0x40000000
)
AARCH64 = Arch("aarch64", 0xC00000B7, "SCMP_ARCH_AARCH64", "arm64", syscalls_aarch64.SYSCALLS)
ARCHES: dict[str, Arch] = {arch.name: arch for arch in (X86_64, AARCH64)}


def native() -> Arch | None:
    """The running machine's architecture, or None where the policy has no table for it."""
    return ARCHES.get(platform.machine())
