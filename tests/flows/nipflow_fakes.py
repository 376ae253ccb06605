"""Small real ``Trainer`` subclasses for the flow tests.

They implement the pure-text stage API and ``run_iterations`` with cheap arithmetic and
record every execution in the run store (``executions.jsonl``), so tests can count what
actually ran across processes. Behaviour switches come from environment variables so a
subprocess can be steered:

* ``FAKE_SLEEP_AT=<iteration>:<stage>`` / ``FAKE_SLEEP_S``: sleep inside that stage (to be killed);
* ``FAKE_JOB_S``: fine-tune jobs finish this many seconds after creation;
* ``FAKE_FAIL_JOB=1``: fine-tune jobs end ``failed``;
* ``FAKE_JOB_GATE=1``: a job succeeds once ``fine_tune/release-<iteration>`` exists;
* ``FAKE_FAULT_START=<start>``: the first ``run_iterations`` from that start raises midway.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from nip_core.errors import FineTuneJobFailed
from nip_core.trainers import Trainer, TrainerState
from nip_core.trainers.registry import TRAINER_REGISTRY

NEXT = {"sample_rollouts": "log_stats", "log_stats": "test_during_training",
        "test_during_training": "create_fine_tune_jobs", "create_fine_tune_jobs": "await_fine_tune_jobs"}


class FineTuneJobsPending(RuntimeError):
    pass


def record(run: Any, **event: Any) -> None:
    run.storage.append_line("executions.jsonl", json.dumps({**event, "pid": os.getpid()}, sort_keys=True))


def executions(run_dir) -> list[dict[str, Any]]:
    path = os.path.join(str(run_dir), "executions.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class FakeTextState(TrainerState):
    train_loop_stage: str = "sample_rollouts"
    value: float = 0.0


class FakeTextTrainer(Trainer):
    """Pure-text stage machine over ``rl.num_iterations`` iterations, one job per iteration."""

    State = FakeTextState

    def next_stage(self) -> tuple[int, str]:
        return self.state.iteration, self.state.train_loop_stage

    def _job_path(self, iteration: int) -> str:
        return f"fine_tune/job-{iteration}.json"

    def poll_fine_tune_jobs(self) -> dict[str, str]:
        it = self.state.iteration
        if not self.run.exists(self._job_path(it)):
            return {}
        job = self.run.read_json(self._job_path(it))
        if os.environ.get("FAKE_FAIL_JOB") == "1":
            return {"verifier": "failed"}
        if os.environ.get("FAKE_JOB_GATE") == "1":  # the test releases the job
            return {"verifier": "succeeded" if self.run.exists(f"fine_tune/release-{it}") else "running"}
        return {"verifier": "succeeded" if time.time() >= job["ready_at"] else "running"}

    def run_await_stage(self, block: bool) -> dict:
        while True:
            statuses = self.poll_fine_tune_jobs()
            if any(s in ("failed", "cancelled") for s in statuses.values()):
                raise FineTuneJobFailed(f"job-{self.state.iteration}", "verifier", "failed", "'boom'")
            if all(s == "succeeded" for s in statuses.values()):
                return {}
            if not block:
                raise FineTuneJobsPending(str(statuses))
            time.sleep(0.05)

    def run_stage(self, stage: str) -> dict:
        it, current = self.next_stage()
        if stage != current:
            raise RuntimeError(f"stage order: asked {stage}, state at {current}")
        record(self.run, event="start", iteration=it, stage=stage)
        if os.environ.get("FAKE_SLEEP_AT") == f"{it}:{stage}":
            time.sleep(float(os.environ.get("FAKE_SLEEP_S", "60")))
        summary: dict[str, Any] = {"iteration": it, "stage": stage}
        if stage == "sample_rollouts":
            self.state.value = self.state.value * 2 + it + 1
        elif stage == "log_stats":
            self.log_stats({"value": self.state.value}, it)
            summary["metrics"] = {"value": self.state.value}
        elif stage == "create_fine_tune_jobs":
            if not self.run.exists(self._job_path(it)):  # idempotent per (iteration, group)
                self.run.write_json(self._job_path(it), {
                    "id": f"job-{it}", "ready_at": time.time() + float(os.environ.get("FAKE_JOB_S", "0"))})
            summary["jobs"] = {"verifier": f"job-{it}"}
        elif stage == "await_fine_tune_jobs":
            self.run_await_stage(block=True)
        elif stage == "test":
            self.log_stats({"accuracy": self.state.value / 100}, it, kind="test")
        if stage == "await_fine_tune_jobs":
            nxt = (it + 1, "sample_rollouts") if it + 1 < self.hyper_params.rl.num_iterations else (it + 1, "test")
        elif stage == "test":
            nxt = (it, "done")
        else:
            nxt = (it, NEXT[stage])
        self.state.iteration, self.state.train_loop_stage = nxt
        self.save_state()
        record(self.run, event="end", iteration=it, stage=stage)
        self.hooks.on_stage_end(stage, it)
        summary["next_iteration"], summary["next_stage"] = nxt
        return summary

    def train(self) -> None:
        while self.next_stage()[1] != "done":
            self.run_stage(self.next_stage()[1])


class FakeRlTrainer(Trainer):
    """``run_iterations`` with a checkpoint per range, like ``TensorDictRlTrainer``."""

    def _restore(self) -> float:
        names = sorted(n for n in self.run.list_checkpoints() if n.startswith("upto_"))
        if not names:
            self.state.iteration = 0
            return 1.0
        data, manifest = self.run.load_checkpoint_bytes(names[-1])  # checkpoints are written once
        self.state.iteration = manifest["iteration"]
        return json.loads(data)["w"]

    def run_iterations(self, start: int, stop: int) -> None:
        w = self._restore()
        if self.state.iteration != start:
            raise RuntimeError(f"checkpoint at iteration {self.state.iteration}, block starts at {start}")
        record(self.run, event="start", start=start, stop=stop)
        marker = f"fault-{start}.done"
        for i in range(start, stop):
            w = round(w * 0.5 + i, 10)  # deterministic "training"
            self.state.agents = {"w": w}
            if os.environ.get("FAKE_FAULT_START") == str(start) and not self.run.exists(marker):
                self.run.write_json(marker, {"at": i})
                raise RuntimeError(f"injected fault at iteration {i}")
            self.log_stats({"w": w}, i)
        self.run.save_checkpoint_bytes(f"upto_{stop:06d}", json.dumps({"w": w}).encode(), iteration=stop)
        self.state.iteration = stop
        self.save_state()
        record(self.run, event="end", start=start, stop=stop)

    def train(self) -> None:
        self.run_iterations(0, self.hyper_params.rl.num_iterations)


def install() -> dict[str, Any]:
    """Register the fakes as ``pure_text_ei`` and ``vanilla_ppo``; return what they replaced."""
    import nip_core.trainers.catalogue  # noqa: F401  (built-ins first, then override)

    previous = {name: TRAINER_REGISTRY.get(name) for name in ("pure_text_ei", "vanilla_ppo")}
    TRAINER_REGISTRY["pure_text_ei"] = FakeTextTrainer
    TRAINER_REGISTRY["vanilla_ppo"] = FakeRlTrainer
    return previous


def uninstall(previous: dict[str, Any]) -> None:
    for name, cls in previous.items():
        if cls is None:
            TRAINER_REGISTRY.pop(name, None)
        else:
            TRAINER_REGISTRY[name] = cls
