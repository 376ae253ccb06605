"""Native bfloat16 is read from the CPU's flags, and TRL jobs on a CPU train in bf16 only with it."""

from __future__ import annotations

import pytest

from nip_core.utils import cpu

INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n\nprocessor\t: 1\n"
AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 sha_ni\n"


@pytest.mark.parametrize("text, native", [(INTEL, True), (AMD, False)])
def test_native_bf16_follows_the_cpu_flags(tmp_path, monkeypatch, text, native):
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    flags = cpu.cpu_flags.__wrapped__(str(info))
    assert ("avx512_bf16" in flags) is native and "avx2" in flags
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    assert cpu.cpu_has_native_bf16() is native
    trl_training = pytest.importorskip("nipflow_llm_server.engines.trl_training")
    monkeypatch.setattr(trl_training, "cpu_has_native_bf16", cpu.cpu_has_native_bf16)
    assert trl_training._precision("cpu") == {"bf16": native}
    assert trl_training._precision("cuda:0") == {}  # TRL's default (bf16) on a GPU


def test_no_cpuinfo_means_no_flags(tmp_path):
    assert cpu.cpu_flags.__wrapped__(str(tmp_path / "absent")) == frozenset()
