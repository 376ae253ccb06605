"""TensorDict checkpoints across devices: map_location and the CUDA RNG states.

This machine has no CUDA. Checkpoints (safetensors + JSON) hold CPU tensors whatever device
wrote them; an old pickled checkpoint "written on a CUDA host" is made by tagging every
storage ``cuda:0`` while ``torch.save`` writes it (``torch.serialization.location_tag``),
which is exactly what such a file holds; CUDA RNG calls are replaced by fakes.
"""

from __future__ import annotations

import io
import logging

import pytest
import torch

from nip_core.trainers import checkpoint_files, tensordict_checkpoints, tensordict_rl
from nip_core.trainers.checkpoint_files import read_checkpoint
from tests.nip_core.trainers.gi_helpers import make_trainer, params_of, plant_checkpoint, tiny_params

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a CPU-only host")


@pytest.fixture
def cuda_tagged_saves(monkeypatch):
    """Make ``torch.save`` write every storage as if it lived on ``cuda:0``."""
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")


def test_restore_passes_the_trainer_device_as_map_location(tmp_path, monkeypatch):
    hp = tiny_params()
    make_trainer(hp, tmp_path).run_iterations(0, 1)
    trainer = make_trainer(hp, tmp_path)
    # A device other than "cpu" shows that the trainer's own device is passed, not a constant;
    # the recorder then loads onto the CPU, since this host has no such device.
    trainer.settings.device = "cuda:1"
    calls = []
    real_read = checkpoint_files.read_checkpoint

    def recording_read(*args, **kwargs):
        calls.append(kwargs)
        return real_read(*args, **{**kwargs, "map_location": "cpu"})

    monkeypatch.setattr(checkpoint_files, "read_checkpoint", recording_read)
    trainer.restore_checkpoint(1)
    assert [c.get("map_location") for c in calls] == ["cuda:1"]
    assert trainer._memory_iteration == 1


def test_old_pickled_checkpoint_written_on_cuda_resumes_on_a_cpu_host(tmp_path, monkeypatch, cuda_tagged_saves):
    hp = tiny_params()
    monkeypatch.undo()
    straight = make_trainer(hp, tmp_path / "a")
    straight.run_iterations(0, 4)

    first = make_trainer(hp, tmp_path / "b")
    first.run_iterations(0, 2)
    # What an earlier nipflow wrote on a CUDA host: torch.save with cuda-tagged storages.
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    buffer = io.BytesIO()
    torch.save(first.checkpoint_state(), buffer)
    monkeypatch.undo()
    plant_checkpoint(first.run, "iter_000002", buffer.getvalue(), iteration=2)
    data, _ = first.run.load_checkpoint_bytes("iter_000002")
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(io.BytesIO(data), weights_only=False)  # what the trainer did before: fails here

    second = make_trainer(hp, tmp_path / "b")
    second.run_iterations(2, 4)  # restores through map_location="cpu" (the safe pickle load)
    a, b = params_of(straight), params_of(second)
    for key in a:
        assert torch.equal(a[key], b[key]), key  # still an exact resume
    rng = second._base_env(second.train_env).rng.get_state()
    assert rng.device.type == "cpu" and torch.equal(rng, straight._base_env(straight.train_env).rng.get_state())


def test_cpu_trainer_writes_no_cuda_state(tmp_path, monkeypatch):
    hp = tiny_params()
    trainer = make_trainer(hp, tmp_path)
    assert "torch_cuda" not in trainer.checkpoint_state()["rng"]
    # A CUDA-capable host training on the CPU does not save CUDA states either.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("CUDA state read on a CPU run"))
    assert "torch_cuda" not in trainer.checkpoint_state()["rng"]


def test_cuda_device_without_cuda_writes_no_cuda_state(tmp_path):
    trainer = make_trainer(tiny_params(), tmp_path)
    trainer.settings.device = "cuda"
    assert not torch.cuda.is_available()
    assert "torch_cuda" not in trainer.get_rng_states()


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA "available" with two devices whose RNG states are recorded, not set.

    The trainers of these tests ask for ``device="cpu"``: with the default ``"auto"`` they
    would resolve to the (fake) CUDA device and build their environments there.
    """
    saved = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in saved])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: restored.append(list(states)))
    return saved, restored


def test_cuda_rng_states_round_trip_through_the_checkpoint(tmp_path, fake_cuda):
    saved, restored = fake_cuda
    hp = tiny_params()
    writer = make_trainer(hp, tmp_path, device="cpu")
    writer.run_iterations(0, 1)
    writer.settings.device = "cuda"  # the state a CUDA trainer checkpoints, in place of the CPU one
    plant_checkpoint(writer.run, "iter_000001", writer._checkpoint_bytes(), iteration=1)  # (written once)
    data, _ = writer.run.load_checkpoint_bytes("iter_000001")
    assert len(read_checkpoint(data, source="iter_000001")["rng"]["torch_cuda"]) == 2

    reader = make_trainer(hp, tmp_path, device="cpu")
    reader.restore_checkpoint(1)
    assert len(restored) == 1
    assert len(restored[0]) == 2
    for got, want in zip(restored[0], saved):
        assert got.device.type == "cpu" and got.dtype == torch.uint8 and torch.equal(got, want)


def test_cuda_rng_states_are_skipped_without_cuda(tmp_path, fake_cuda, monkeypatch, caplog):
    saved, restored = fake_cuda
    hp = tiny_params()
    writer = make_trainer(hp, tmp_path, device="cpu")
    writer.run_iterations(0, 1)
    writer.settings.device = "cuda"
    plant_checkpoint(writer.run, "iter_000001", writer._checkpoint_bytes(), iteration=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU-only host

    data, _ = writer.run.load_checkpoint_bytes("iter_000001")
    expected_cpu_state = read_checkpoint(data, source="iter_000001")["rng"]["torch"]
    reader = make_trainer(hp, tmp_path, device="cpu")
    assert not torch.equal(torch.get_rng_state(), expected_cpu_state)
    with caplog.at_level(logging.INFO, logger=tensordict_rl.__name__):
        reader.restore_checkpoint(1)
    assert restored == []
    assert any("CUDA RNG states" in r.getMessage() for r in caplog.records)
    assert torch.equal(torch.get_rng_state(), expected_cpu_state)  # the CPU state still is restored


def test_extra_cuda_devices_of_the_writer_are_dropped(tmp_path, fake_cuda, monkeypatch):
    saved, restored = fake_cuda
    trainer = make_trainer(tiny_params(), tmp_path, device="cpu")
    trainer.settings.device = "cuda"
    states = trainer.get_rng_states()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # restored on a one-GPU host
    trainer.set_rng_states(states)
    assert len(restored[0]) == 1 and torch.equal(restored[0][0], saved[0])


def test_to_cpu_keeps_the_structure():
    state = {"generator": torch.ones(3, dtype=torch.uint8), "cycler": {"perm": torch.arange(4), "pos": 2},
             "list": [torch.zeros(1)], "tuple": (1, "x")}
    moved = tensordict_checkpoints._to_cpu(state)
    assert moved["cycler"]["pos"] == 2 and moved["tuple"] == (1, "x") and isinstance(moved["list"], list)
    assert torch.equal(moved["cycler"]["perm"], torch.arange(4))
