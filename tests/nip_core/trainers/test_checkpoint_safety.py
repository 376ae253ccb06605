"""Loading a checkpoint never runs code stored in it (security review, item 6).

An attacker with write access to the run store (e.g. the bucket) can replace a checkpoint
and write a matching sha256 manifest: the manifest proves nothing against them. Each test
puts a pickle whose ``__reduce__`` runs code (it writes a marker file) exactly where one of
the loaders reads its checkpoint, with a valid manifest, and asserts that the load is
refused naming the file (and how to convert a trusted old checkpoint) while the marker
never appears.
"""

from __future__ import annotations

import hashlib
import io
import json

import pytest
import torch

from nip_core.errors import CorruptCheckpointError
from nip_core.runs import RunStore
from nip_core.trainers.solo_agent import SoloAgentTrainer
from tests.nip_core.trainers.gi_helpers import (
    make_trainer, plant_checkpoint, settings_for, tiny_params, tiny_scenario,
)


class Payload:
    """Unpickling this runs ``exec``: it writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('code from the checkpoint ran')",)


def malicious_checkpoint(marker, iteration: int) -> bytes:
    """A checkpoint as ``torch.save`` writes one, with a payload in place of the agents."""
    buffer = io.BytesIO()
    torch.save({"iteration": iteration, "agents": Payload(marker)}, buffer)
    return buffer.getvalue()


def assert_refused(info, marker, path_pattern: str) -> None:
    message = str(info.value)
    assert not marker.exists(), "loading the checkpoint ran the code stored in it"
    assert isinstance(info.value, CorruptCheckpointError)
    import re

    assert re.search(path_pattern, message), message
    assert "convert" in message, message  # says how to convert a checkpoint the user trusts


def test_tensordict_trainer_refuses_a_pickle_that_runs_code(tmp_path):
    marker = tmp_path / "marker"
    trainer = make_trainer(tiny_params(), tmp_path / "runs", run_id="victim")
    # What an attacker with write access produces: data plus a manifest that matches it.
    plant_checkpoint(trainer.run, "iter_000002", malicious_checkpoint(marker, 2), iteration=2)
    with pytest.raises(Exception) as info:
        trainer.restore_checkpoint(2)
    assert_refused(info, marker, r"victim[/\\]checkpoints[/\\]iter_000002\.pt")
    assert trainer._memory_iteration == 0


def test_solo_agent_trainer_refuses_a_pickle_that_runs_code(tmp_path):
    marker = tmp_path / "marker"
    hp = tiny_params("solo_agent", solo_agent=dict(num_epochs=4, batch_size=8))
    settings = settings_for(tmp_path / "runs", run_id="solo")
    run = RunStore(str(tmp_path / "runs")).open_run("solo", hp)
    trainer = SoloAgentTrainer(hp, settings=settings, run=run, scenario_instance=tiny_scenario(hp, settings, "solo_agent"))
    plant_checkpoint(run, "iter_000001", malicious_checkpoint(marker, 1), iteration=1)
    with pytest.raises(Exception) as info:
        trainer.train()
    assert_refused(info, marker, r"solo[/\\]checkpoints[/\\]iter_000001\.pt")


def test_warm_start_refuses_a_pickle_that_runs_code(tmp_path):
    marker = tmp_path / "marker"
    trainer = make_trainer(tiny_params(rl=dict(num_iterations=2)), tmp_path / "runs", run_id="warm")
    data = malicious_checkpoint(marker, 3)
    warm = tmp_path / "runs" / "warm" / "warm_start"
    warm.mkdir(parents=True)
    (warm / "iter_000003.pt").write_bytes(data)
    (warm / "iter_000003.json").write_text(json.dumps({"name": "iter_000003", "iteration": 3,
                                                       "sha256": hashlib.sha256(data).hexdigest()}))
    (warm / "source.json").write_text(json.dumps({"run_id": "first", "checkpoint": "iter_000003"}))
    with pytest.raises(Exception) as info:
        trainer.run_iterations(0, 1)
    assert_refused(info, marker, r"warm[/\\]warm_start[/\\]iter_000003\.pt")
    assert not trainer.run.has_state()


def test_evaluate_refuses_a_pickle_that_runs_code(tmp_path):
    from nip_core.evaluation import evaluate_run
    from tests.nip_core.evaluation_helpers import write_files

    marker = tmp_path / "marker"
    files = write_files(tmp_path / "files")
    run = RunStore(str(tmp_path / "runs")).open_run("gi", tiny_params(rl=dict(num_iterations=2)))
    plant_checkpoint(run, "iter_000002", malicious_checkpoint(marker, 2), iteration=2)
    with pytest.raises(Exception) as info:
        evaluate_run("gi", files["big"], runs_dir=str(tmp_path / "runs"))
    assert_refused(info, marker, r"gi[/\\]checkpoints[/\\]iter_000002\.pt")
