"""Building, caching and falling back for native kernels (nip_core/native/build.py)."""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nip_core.native import build
from nip_core.scenarios.graph_isomorphism.agents import attention


def _declare(library):
    library.nip_self_attention_lanes.restype = build.ctypes.c_int64


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
        for line in cpuinfo:
            if line.split(":", 1)[0].strip() in ("flags", "Features"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_a_build_lands_in_the_cache_directory_and_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_VARIABLE, str(tmp_path))
    library = build.load("self_attention", _declare)
    # one vector is one register of this CPU (-march=native): 16 floats with AVX-512, 8 with AVX
    flags = _cpu_flags()
    assert library is not None
    assert library.nip_self_attention_lanes() == (16 if "avx512f" in flags else 8 if "avx" in flags else 4)
    built = sorted(p.name for p in tmp_path.iterdir())
    assert len(built) == 1 and built[0].startswith("self_attention-") and built[0].endswith(".so")
    # another process finds the library there instead of compiling it again
    before = (tmp_path / built[0]).stat()
    script = "from nip_core.native import build; raise SystemExit(build.load('self_attention', lambda l: None) is None)"
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, build.CACHE_VARIABLE: str(tmp_path)})
    assert done.returncode == 0
    after = (tmp_path / built[0]).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(p.name for p in tmp_path.iterdir()) == built  # no partial files left behind


def test_a_compiler_that_refuses_the_vector_width_preference_still_builds_for_this_cpu(tmp_path, monkeypatch):
    """``-mprefer-vector-width=512`` goes with ``-march=native``; a compiler that refuses it gets
    ``-march=native`` alone (this CPU's register width), not the generic build."""
    seen = tmp_path / "seen"
    cc = _compiler(tmp_path, "cc", f'echo "$@" >> {seen}\n'
                   'for a in "$@"; do [ "$a" = -mprefer-vector-width=512 ] && exit 1; done; exec cc "$@"')
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv(build.CACHE_VARIABLE, str(tmp_path / "cache"))
    library = build.load("self_attention", _declare)
    flags = _cpu_flags()
    assert library is not None
    assert library.nip_self_attention_lanes() == (16 if "avx512f" in flags else 8 if "avx" in flags else 4)
    builds = [line for line in seen.read_text().splitlines() if "self_attention.c" in line]
    assert len(builds) == 2 and "-mprefer-vector-width=512" in builds[0].split()
    assert "-march=native" in builds[1].split() and "-mprefer-vector-width=512" not in builds[1].split()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instruction sets")
def test_two_compilers_of_one_version_do_not_share_a_cached_library(tmp_path, monkeypatch):
    """A wrapper script reports its compiler's version but may build otherwise (here: for 4-wide
    vectors); the cache tells them apart by the compiler's path, so neither loads the other's build."""
    monkeypatch.setenv(build.CACHE_VARIABLE, str(tmp_path / "cache"))
    native = _compiler(tmp_path, "cc-native", 'exec cc "$@"')
    narrow = _compiler(tmp_path, "cc-narrow", 'exec cc "${@/-march=native/-march=x86-64}"')
    flags = _cpu_flags()
    monkeypatch.setenv("CC", str(native))
    first = build.load("self_attention", _declare)
    monkeypatch.setenv("CC", str(narrow))
    second = build.load("self_attention", _declare)
    assert first is not None and second is not None
    assert first.nip_self_attention_lanes() == (16 if "avx512f" in flags else 8 if "avx" in flags else 4)
    assert second.nip_self_attention_lanes() == 4
    assert len(list((tmp_path / "cache").glob("self_attention-*.so"))) == 2


def test_the_loaded_library_is_remembered_per_cache_directory(tmp_path, monkeypatch):
    # load() runs on every kernel call: a second call in the same place builds and declares nothing
    monkeypatch.setenv(build.CACHE_VARIABLE, str(tmp_path / "a"))
    declared = []
    first = build.load("self_attention", declared.append)
    assert first is not None and build.load("self_attention", declared.append) is first and declared == [first]
    # another cache directory, in the same process, gets its own build there
    monkeypatch.setenv(build.CACHE_VARIABLE, str(tmp_path / "b"))
    second = build.load("self_attention", declared.append)
    assert second is not None and second is not first and declared == [first, second]
    assert [p.name for p in (tmp_path / "b").glob("*.so")] == [p.name for p in (tmp_path / "a").glob("*.so")]
    monkeypatch.setenv(build.CACHE_VARIABLE, str(tmp_path / "a"))
    assert build.load("self_attention", declared.append) is first and len(declared) == 2


def test_without_a_compiler_the_composition_runs_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(build.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        assert build.load("self_attention", _declare) is None
    assert "no working C compiler" in caplog.text and "no-such-cc" in caplog.text
    assert list(tmp_path.iterdir()) == []
    qkv, mask = _inputs()
    assert not attention.native_self_attention_applies(qkv, mask, 0.0)
    assert type(attention.self_attention(qkv, mask, 4, 0.0).grad_fn).__name__ != "_NativeSelfAttentionBackward"


def test_a_compiler_error_is_logged_and_nothing_is_cached(tmp_path, monkeypatch, caplog):
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo fake-cc 1.0; exit 0; }\n"
                       "echo 'self_attention.c:1: error: broken' >&2; exit 1\n")
    failing.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv(build.CACHE_VARIABLE, str(cache))
    monkeypatch.setenv("CC", str(failing))
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        assert build.load("self_attention", _declare) is None
    assert "could not be built" in caplog.text and "error: broken" in caplog.text
    assert list(cache.iterdir()) == []


def test_nipflow_native_0_turns_the_kernels_off(monkeypatch):
    monkeypatch.setenv(build.ENABLE_VARIABLE, "0")
    assert build.load("self_attention", _declare) is None
    qkv, mask = _inputs()
    assert not attention.native_self_attention_applies(qkv, mask, 0.0)


def test_nipflow_native_0_turns_every_kernel_off(monkeypatch):
    from nip_core.agents.mlp import FastTanh
    from nip_core.scenarios.graph_isomorphism.agents import aggregation, fused_mlp, layer_norm

    monkeypatch.setenv(build.ENABLE_VARIABLE, "0")
    x = torch.randn(2, 32, 16)
    assert not aggregation.native_aggregation_applies(x, FastTanh())
    assert not layer_norm.native_layer_norm_applies(x, None)
    assert not fused_mlp.native_mlp_applies(x, "relu", (16, 16, 16))
    y = layer_norm.stacked_layer_norm(x.requires_grad_(), None, None, 1e-5)
    assert type(y.grad_fn).__name__ != "_NativeLayerNormBackward"


def _kernel_calls():
    from nip_core.agents.mlp import FastTanh
    from nip_core.scenarios.graph_isomorphism.agents import aggregation, fused_mlp, layer_norm

    w = [torch.randn(2, 16, 16), torch.randn(2, 16), torch.randn(2, 16, 16), torch.randn(2, 16)]
    adjacency, mask = (torch.rand(4, 11, 11) < 0.3).float(), torch.ones(4, 11)
    return {
        "two_layer_mlp": (lambda x: fused_mlp.stacked_two_layer_mlp(x, w[0], w[1], "relu", w[2], w[3]), (2, 40, 16),
                          "_NativeStackedMlpBackward"),
        "gin_aggregate": (lambda z: aggregation.gin_aggregate(z, adjacency, mask, FastTanh()), (4, 11, 16),
                          "_NativeGinAggregateBackward"),
        "self_attention": (lambda qkv: attention.self_attention(qkv, torch.zeros(4, 1, 6, 6), 4, 0.0), (4, 6, 48),
                           "_NativeSelfAttentionBackward"),
        "layer_norm": (lambda x: layer_norm.stacked_layer_norm(x, None, None, 1e-5), (2, 40, 16),
                       "_NativeLayerNormBackward"),
    }


@pytest.mark.parametrize("kernel", ["two_layer_mlp", "gin_aggregate", "self_attention", "layer_norm"])
def test_a_backward_pass_uses_the_library_its_forward_pass_used(monkeypatch, kernel):
    """Turning the kernels off between a forward pass and its backward pass changes nothing for that pass."""
    fn, shape, backward = _kernel_calls()[kernel]
    x = torch.randn(*shape, requires_grad=True)
    (expected,) = torch.autograd.grad(fn(x).pow(2).sum(), x)
    y = fn(x)
    assert type(y.grad_fn).__name__ == backward
    monkeypatch.setenv(build.ENABLE_VARIABLE, "0")
    monkeypatch.setattr(build, "_loaded", {})
    assert type(fn(x).grad_fn).__name__ != backward  # off now for new forward passes
    (got,) = torch.autograd.grad(y.pow(2).sum(), x)
    assert torch.equal(got, expected)


def test_a_kernel_that_could_not_allocate_raises_memory_error_naming_it():
    build.check_status(0, "layer_norm")
    with pytest.raises(MemoryError, match="layer_norm kernel: could not allocate its work buffers"):
        build.check_status(-1, "layer_norm")


def _compiler(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


KERNEL_TESTS = [str(Path(__file__).parent / f"test_{name}_kernel.py")
                for name in ("two_layer_mlp", "self_attention", "gin_aggregate", "layer_norm")]


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instruction sets")
@pytest.mark.parametrize("target", ["x86-64", "x86-64-v3"])
def test_every_kernel_is_right_built_for_narrower_vectors(tmp_path, target):
    """The kernels' tests pass with libraries built for 4-wide vectors (SSE2: what a compiler that
    refuses ``-march=native`` builds) and for 8-wide ones (AVX2: x86-64-v3, where this CPU has it),
    whatever vector width this machine's own build has."""
    if target == "x86-64":
        # refuses -march=native, so build.py retries without it: the x86-64 baseline
        cc = _compiler(tmp_path, "cc", 'for a in "$@"; do [ "$a" = -march=native ] && exit 1; done; exec cc "$@"')
        lanes = 4
    else:
        if not {"avx2", "fma"} <= _cpu_flags():
            pytest.skip("this CPU has no AVX2")
        cc = _compiler(tmp_path, "cc", 'exec cc "${@/-march=native/-march=x86-64-v3}"')
        lanes = 8
    env = {**os.environ, "CC": str(cc), build.CACHE_VARIABLE: str(tmp_path / "cache")}
    check = ("from nip_core.native import build; from nip_core.scenarios.graph_isomorphism.agents import attention;"
             "library = attention._kernel(); print(library._name, library.nip_self_attention_lanes())")
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == str(lanes) and str(tmp_path / "cache") in done.stdout
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
    assert len(list((tmp_path / "cache").glob("*.so"))) == 4


@pytest.fixture(autouse=True)
def _forget_loaded(monkeypatch):
    monkeypatch.setattr(build, "_loaded", {})


def _inputs():
    qkv = torch.randn(4, 6, 48, requires_grad=True)
    return qkv, torch.zeros(4, 1, 6, 6)
