"""Per-phase timers and the optional torch profiler of the TensorDict training loop.

Every iteration's metrics carry ``time_collect_s``, ``time_gae_s`` and ``time_update_s``
(wall seconds of the three phases), so a slow run shows where its time goes without a
profiler. ``settings.profile_iterations = "A:B"`` additionally records iterations
``A … B-1`` with ``torch.profiler`` and writes a Chrome trace to the run store
(``profiles/iter_A-B.json``; open it in chrome://tracing or Perfetto).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


class PhaseTimer:
    """Adds the wall time of ``with timer.phase(name):`` blocks to ``stats['time_<name>_s']``."""

    def __init__(self) -> None:
        self.stats: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            key = f"time_{name}_s"
            self.stats[key] = self.stats.get(key, 0.0) + time.perf_counter() - start


def parse_iteration_range(value: str | None) -> tuple[int, int] | None:
    """``"A:B"`` → ``(A, B)`` with ``0 <= A < B``; None for None. Raises ValueError naming the setting."""
    if value is None:
        return None
    try:
        first, last = (int(x) for x in value.split(":"))
    except ValueError:
        raise ValueError(f"settings.profile_iterations: expected 'START:STOP' (iterations), got {value!r}") from None
    if not 0 <= first < last:
        raise ValueError(f"settings.profile_iterations: need 0 <= START < STOP, got {value!r}")
    return first, last


class IterationProfiler:
    """Profiles the iterations of ``window`` and stores one Chrome trace in the run store."""

    def __init__(self, window: tuple[int, int] | None, run: Any) -> None:
        self.window = window
        self.run = run
        self._profiler: torch.profiler.profile | None = None

    def before(self, iteration: int) -> None:
        if self.window is not None and iteration == self.window[0] and self._profiler is None:
            self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                                    + ([torch.profiler.ProfilerActivity.CUDA]
                                                       if torch.cuda.is_available() else []),
                                                    record_shapes=True)
            self._profiler.__enter__()

    def after(self, iteration: int) -> None:
        if self._profiler is not None and iteration + 1 >= self.window[1]:
            self.close()

    def close(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        profiler.__exit__(None, None, None)
        if not self.run.persistent:  # a NullRun has no storage
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            profiler.export_chrome_trace(str(path))
            # created once: the first trace of a window stands (a driver that lost the lease,
            # or a resumed run profiling the window again, never replaces it)
            self.run.storage.create_exclusive(f"profiles/iter_{self.window[0]}-{self.window[1]}.json",
                                              path.read_bytes())
