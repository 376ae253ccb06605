"""Native CPU kernels for hot paths that eager PyTorch runs poorly (docs/performance.md).

:func:`~nip_core.native.build.load` compiles a kernel's C source with the system's C
compiler on first use and caches the shared library; when that is not possible the callers
run their PyTorch composition instead.
"""
