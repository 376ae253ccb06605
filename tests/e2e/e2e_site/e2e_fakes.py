"""The fake trainers of ``tests/flows/nipflow_fakes.py`` with execution records for e2e tests.

* ``vanilla_ppo`` -> :class:`TimedRlTrainer`: every ``run_iterations`` (one RL block) sleeps
  ``E2E_BLOCK_SLEEP_S`` seconds (the first block of a run ``E2E_FIRST_BLOCK_SLEEP_S``, if
  set: so that two blocks *would* overlap without the ``gpu`` limit) and then appends ``{"event": "block", "t0", "t1", ...}`` (wall-clock seconds) to
  the run's ``executions.jsonl``.
* ``pure_text_ei`` -> :class:`TracedTextTrainer`: its first stage appends
  ``{"event": "process", ...}`` naming the process that ran the run.

Each record also names the process: pid, ``E2E_WORKER_NAME`` (set in the environment of
the worker that started it), the worker's ``PREFECT_HOME`` and the process's cwd.
"""

from __future__ import annotations

import os
import socket
import time

import nipflow_fakes
from nipflow_fakes import FakeRlTrainer, FakeTextTrainer, record
from nip_core.trainers.registry import TRAINER_REGISTRY


def _process() -> dict:
    return {"worker": os.environ.get("E2E_WORKER_NAME"), "prefect_home": os.environ.get("PREFECT_HOME"),
            "cwd": os.getcwd(), "hostname": socket.gethostname()}


class TimedRlTrainer(FakeRlTrainer):
    def run_iterations(self, start: int, stop: int) -> None:
        t0 = time.time()
        every = os.environ.get("E2E_BLOCK_SLEEP_S", "0")
        time.sleep(float(os.environ.get("E2E_FIRST_BLOCK_SLEEP_S", every) if start == 0 else every))
        super().run_iterations(start, stop)
        record(self.run, event="block", start=start, stop=stop, t0=t0, t1=time.time(), **_process())


class TracedTextTrainer(FakeTextTrainer):
    def run_stage(self, stage: str) -> dict:
        if stage == "sample_rollouts" and self.state.iteration == 0:
            record(self.run, event="process", **_process())
        return super().run_stage(stage)


def install() -> None:
    import torch

    torch.set_num_threads(1)
    nipflow_fakes.install()
    TRAINER_REGISTRY["vanilla_ppo"] = TimedRlTrainer
    TRAINER_REGISTRY["pure_text_ei"] = TracedTextTrainer
