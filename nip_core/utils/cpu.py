"""What this machine's CPU can do natively (read from ``/proc/cpuinfo``; no torch needed)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

#: CPU flags (Linux ``/proc/cpuinfo``) of native bfloat16 arithmetic: AVX-512 BF16 or AMX.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@lru_cache(maxsize=1)
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's ``flags`` (empty where the file does not exist, e.g. macOS)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """Whether the CPU computes in bfloat16 natively (else bf16 is emulated, and slower than fp32)."""
    return bool(cpu_flags() & BF16_FLAGS)
