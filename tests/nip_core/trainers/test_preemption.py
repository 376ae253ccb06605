"""Preemption: a signal mid-iteration checkpoints the last finished iteration; resuming is exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nip_core.errors import TrainingPreempted
from nip_core.trainers.preemption import PREEMPTED_EXIT_CODE, PreemptionGuard
from tests.nip_core.trainers.gi_helpers import TINY, make_trainer, params_of, tiny_params

REPO = Path(__file__).resolve().parents[3]


def signal_at_optimizer_step(trainer, step_number: int, signum: int) -> list[int]:
    """Send ``signum`` to this process during the ``step_number``-th optimizer step."""
    calls: list[int] = []
    inner = trainer.optimizer.step

    def step(*args, **kwargs):
        calls.append(1)
        if len(calls) == step_number:
            os.kill(os.getpid(), signum)  # handled in the main thread before the step returns
        return inner(*args, **kwargs)

    trainer.optimizer.step = step
    return calls


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP])
def test_signal_mid_iteration_checkpoints_the_last_finished_one_and_the_resume_is_exact(tmp_path, signum):
    hp = tiny_params()
    straight = make_trainer(hp, tmp_path / "a", checkpoint_every=0)
    straight.run_iterations(0, 5)

    first = make_trainer(hp, tmp_path / "b", checkpoint_every=0)
    steps_per_iteration = hp.rl.num_epochs * (hp.rl.frames_per_batch // min(hp.rl.minibatch_size, hp.rl.frames_per_batch))
    calls = signal_at_optimizer_step(first, 2 * steps_per_iteration + 1, signum)  # first step of iteration 2
    with pytest.raises(TrainingPreempted) as info:
        first.run_iterations(0, 5)
    assert info.value.iteration == 2 and info.value.signum == signum
    assert len(calls) == 2 * steps_per_iteration + 1  # stopped right after the step it was in
    assert first.run.list_checkpoints() == ["iter_000002"] and first.run.load_state(first.State).iteration == 2
    assert signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler)  # handlers restored

    second = make_trainer(hp, tmp_path / "b", checkpoint_every=0)  # the resumed process
    second.run_iterations(second.state.iteration, 5)
    a, b = params_of(straight), params_of(second)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_signal_before_the_first_step_of_a_range_keeps_the_stored_checkpoint(tmp_path):
    hp = tiny_params()
    trainer = make_trainer(hp, tmp_path, checkpoint_every=0)
    trainer.run_iterations(0, 2)
    stored = trainer.run.load_checkpoint_bytes("iter_000002")[0]
    signal_at_optimizer_step(trainer, 1, signal.SIGTERM)
    with pytest.raises(TrainingPreempted) as info:
        trainer.run_iterations(2, 4)
    assert info.value.iteration == 2 and trainer.run.load_checkpoint_bytes("iter_000002")[0] == stored


def test_a_hang_up_ignored_before_training_stays_ignored():
    # under nohup SIGHUP is ignored: a closed terminal must not stop the training
    original = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with PreemptionGuard() as guard:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == guard._handle
            os.kill(os.getpid(), signal.SIGHUP)
            assert not guard.requested
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, original)


@pytest.mark.slow
def test_nipflow_exits_75_on_sigterm_within_30_s_with_a_resumable_checkpoint(tmp_path):
    params = {"d_representation": 2, "agents": {"_default": TINY},
              "rl": {"frames_per_batch": 16, "num_iterations": 200, "num_epochs": 1, "minibatch_size": 8,
                     "num_test_iterations": 1, "num_normalization_steps": 3}}
    params_file = tmp_path / "p.json"
    params_file.write_text(json.dumps(params))
    runs = tmp_path / "runs"
    env = {**os.environ, "NIPFLOW_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    command = [str(Path(sys.executable).parent / "nipflow"), "run", "graph_isomorphism", "vanilla_ppo", "--dataset",
               "test", "--run-id", "pre", "--runs-dir", str(runs), "--params", str(params_file), "--no-wandb",
               "--progress", "off", "--checkpoint-every", "0", "--direct"]
    proc = subprocess.Popen(command, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    metrics = runs / "pre" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:] if proc.poll() else ""
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    assert time.monotonic() - sent < 30
    stderr = proc.stderr.read()
    assert rc == PREEMPTED_EXIT_CODE, stderr[-2000:]
    state = json.loads((runs / "pre" / "state.json").read_text())
    assert state["iteration"] >= 3 and "preempted by SIGTERM" in stderr
    assert (runs / "pre" / "checkpoints" / f"iter_{state['iteration']:06d}.pt").exists()
