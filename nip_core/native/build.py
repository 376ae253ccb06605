"""Compile a C kernel on first use, cache the shared library, load it with ``ctypes``.

The library is built with ``$CC`` (default ``cc``) for this machine's CPU (``-march=native
-mprefer-vector-width=512``, retried with ``-march=native`` alone, then without it, if the
compiler refuses; GCC prefers 256-bit vectors on Intel CPUs with AVX-512, so the loops it
vectorises itself, such as the kernels' transposes, would be half-width there and their stores
would miss store forwarding into the kernels' full-width loads) into a cache directory —
``$NIPFLOW_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/nipflow/native``, else
``~/.cache/nipflow/native`` — under a name that hashes the source, the compiler's version,
the flags and the CPU's identity, so an edited source or header, another compiler or another CPU kind
sharing the home directory gets its own build. A build goes to a temporary file renamed into
place, so concurrent processes never load a half-written library.

``NIPFLOW_NATIVE=0`` turns the kernels off (every caller then runs its PyTorch composition);
any other value, or none, leaves them on. When the compiler is missing or fails, the reason is
logged once per kernel as a warning and the callers fall back the same way.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent
BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno", "-Wno-psabi")
ENABLE_VARIABLE = "NIPFLOW_NATIVE"
CACHE_VARIABLE = "NIPFLOW_NATIVE_CACHE"
COMPILE_TIMEOUT_S = 300

_lock = threading.Lock()
_loaded: dict[tuple[str | None, ...], ctypes.CDLL | None] = {}
_MISSING = object()


def enabled() -> bool:
    """Whether native kernels may be used (``NIPFLOW_NATIVE`` is not ``0``)."""
    return os.environ.get(ENABLE_VARIABLE, "1").strip() != "0"


def cache_dir() -> Path:
    """Where built libraries are kept."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nipflow" / "native"


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags (what ``-march=native`` builds for)."""
    lines = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags", "Features", "CPU part") and line not in lines:
                    lines.append(line)
                if not line.strip() and lines:
                    break  # the first processor describes them all
    except OSError:
        pass
    return platform.machine() + platform.processor() + "".join(lines)


def _compiler_version(cc: str) -> str | None:
    try:
        done = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _build(source: Path, cc: str, version: str) -> Path:
    """The cached library for ``source``, built if it is not there yet."""
    # the source and the headers it may include (nip_core/native/*.h)
    text = b"\0".join([source.read_bytes(), *(h.read_bytes() for h in sorted(source.parent.glob("*.h")))])
    errors = []
    for march in (("-march=native", "-mprefer-vector-width=512"), ("-march=native",), ()):
        flags = BASE_FLAGS + march
        # the compiler by its path too: two commands may report the same version and build differently
        # (a wrapper script that adds flags, as the slow kernel tests and A/B experiments use)
        key = hashlib.sha256(b"\0".join([text, version.encode(), (shutil.which(cc) or cc).encode(),
                                         " ".join(flags).encode(), _cpu_identity().encode()])).hexdigest()[:20]
        target = cache_dir() / f"{source.stem}-{key}.so"
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{source.stem}-", suffix=".so")
        os.close(handle)
        try:
            done = subprocess.run([cc, *flags, str(source), "-o", partial, "-lm"], capture_output=True,
                                  text=True, timeout=COMPILE_TIMEOUT_S)
            if done.returncode == 0:
                os.replace(partial, target)
                return target
            errors.append(f"{cc} {' '.join(flags)}: {done.stderr.strip()[-2000:]}")
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    raise RuntimeError("\n".join(errors))


def load(name: str, declare: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL | None:
    """The library built from ``nip_core/native/{name}.c``, or ``None`` where it cannot be had.

    ``declare`` sets the functions' ``argtypes``/``restype`` once the library is loaded.
    The result is remembered per process (per compiler and cache directory), failures included.
    """
    if not enabled():
        return None
    cc = os.environ.get("CC") or "cc"
    # called on every kernel call: keyed by what cache_dir() reads, without building its path
    # (Path.home() and the Path objects were ~2.5 % of a GI minibatch step)
    remembered = (name, cc, *map(os.environ.get, (CACHE_VARIABLE, "XDG_CACHE_HOME", "HOME")))
    library = _loaded.get(remembered, _MISSING)
    if library is not _MISSING:
        return library
    with _lock:
        if remembered in _loaded:
            return _loaded[remembered]
        library = None
        version = _compiler_version(cc) if shutil.which(cc) else None
        if version is None:
            logger.warning("native kernel %s: no working C compiler %r; running the PyTorch composition "
                           "instead (slower; set CC to a C compiler)", name, cc)
        else:
            try:
                library = ctypes.CDLL(str(_build(SOURCE_DIR / f"{name}.c", cc, version)))
                declare(library)
            except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as error:
                logger.warning("native kernel %s could not be built or loaded; running the PyTorch "
                               "composition instead (slower):\n%s", name, error)
                library = None
        _loaded[remembered] = library
        return library


def check_status(status: int, name: str) -> None:
    """Raise when a kernel's entry point returned non-zero: it could not allocate its work buffers."""
    if status != 0:
        raise MemoryError(f"{name} kernel: could not allocate its work buffers")
