"""The checkpoint format (safetensors + JSON) and old pickled checkpoints (loaded safely or converted)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections import OrderedDict

import numpy as np
import pytest
import safetensors.torch
import torch
from tensordict import TensorDict

from nip_core.errors import CorruptCheckpointError
from nip_core.runs import RunStore
from nip_core.trainers.checkpoint_files import load_run_checkpoint, read_checkpoint
from nip_core.trainers.checkpoint_format import (
    MANIFEST_FORMAT,
    UnsafeCheckpointError,
    decode_checkpoint,
    encode_checkpoint,
    is_checkpoint_format,
)
from nip_core.trainers.checkpoint_legacy import convert_pickled_checkpoint, is_pickled, main
from nip_core.trainers.solo_agent import SoloAgentTrainer
from nip_core.trainers.warm_start import prepare_warm_start
from tests.run_files import trainer_owned
from tests.nip_core.trainers.gi_helpers import (
    make_trainer, params_of, plant_checkpoint, settings_for, tiny_params, tiny_scenario,
)


def assert_same(a, b, path=""):
    """``a`` and ``b`` are equal with the same types all the way down (tensors exactly)."""
    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device) and torch.equal(a, b), path
    elif isinstance(a, TensorDict):
        assert (a.batch_size, a.device, list(a.keys())) == (b.batch_size, b.device, list(b.keys())), path
        for key in a.keys():
            assert_same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), f"{path}: module metadata"
        for key in a:
            assert_same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), path
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} vs {b!r}"


def pickled(state) -> bytes:
    """What nipflow wrote before this format: ``torch.save`` of the state."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def test_trainer_checkpoint_is_safetensors_plus_json_and_round_trips_exactly(tmp_path):
    trainer = make_trainer(tiny_params(), tmp_path)
    trainer.run_iterations(0, 2)
    path = tmp_path / "r" / "checkpoints" / "iter_000002.pt"
    data = path.read_bytes()
    assert is_checkpoint_format(data) and not is_pickled(data)
    manifest = json.loads((tmp_path / "r" / "checkpoints" / "iter_000002.json").read_text())
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest() and manifest["size"] == len(data)
    assert manifest["format"] == MANIFEST_FORMAT and manifest["iteration"] == 2

    # Plain safetensors: the weights are readable by any safetensors reader, by name.
    tensors = safetensors.torch.load(data)
    for key, value in trainer.agents.state_dict().items():
        assert torch.equal(tensors[f"agents/{key}"], value), key
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    assert json.loads(header["__metadata__"]["nipflow-checkpoint"])["version"] == 1

    state = trainer.checkpoint_state()
    assert_same(decode_checkpoint(data, source=str(path)), state)  # every type and value back
    assert encode_checkpoint(state) == data  # equal states, equal bytes
    assert isinstance(state["rng"]["numpy"][1], np.ndarray) and isinstance(state["carried_td"], TensorDict)


def test_values_of_every_supported_type_round_trip():
    shared = torch.arange(6.0).reshape(2, 3)
    module_state = OrderedDict(w=torch.ones(2, dtype=torch.bfloat16))
    module_state._metadata = OrderedDict({"": {"version": 2}})
    state = {
        1: ("a", None, True, -0.0, float("nan"), float("inf"), 2 ** 80),
        "shared": [shared, shared, shared.t()],  # a tensor held twice, and a view of it
        "module": module_state,
        "numpy": (np.arange(5, dtype=np.uint32), np.float64(0.25), np.zeros((0, 3), dtype=np.float32)),
        "torch": (torch.Size([2, 3]), torch.device("cpu"), torch.int16, torch.empty(0, 4), torch.tensor(True)),
        "param": torch.nn.Parameter(torch.ones(2)),
        "td": TensorDict({"x": torch.ones(4, 2), "nested": TensorDict({"y": torch.zeros(4, 1)}, [4])}, [4]),
        "named": TensorDict({"x": torch.ones(4, 2)}, [4, 2], names=["env", None]),
    }
    back = decode_checkpoint(encode_checkpoint(state), source="mem")
    assert_same(back, state)
    assert back["shared"][0] is back["shared"][1]  # stored once, one object again
    assert back["param"].requires_grad and isinstance(back["param"], torch.nn.Parameter)
    assert back["named"].names == ["env", None]


def test_a_state_with_another_type_is_refused_when_written_naming_where():
    with pytest.raises(TypeError, match=r"at optimizer/hooks/0: a builtins\.object cannot be stored"):
        encode_checkpoint({"optimizer": {"hooks": [object()]}})


def crafted(state_json: str, tensors=None, version: str = "1") -> bytes:
    return safetensors.torch.save(tensors or {}, metadata={
        "nipflow-checkpoint": f'{{"version": {version}, "state": {state_json}}}'})


@pytest.mark.parametrize("data, reason", [
    (crafted('{"pickle": "gASV..."}'), r"unknown tag \['pickle'\]"),
    (crafted('{"tensor": "agents/w"}'), "missing tensor 'agents/w'"),
    (crafted('{"dict": []}', {"extra": torch.ones(1)}), r"tensors that the state does not reference: \['extra'\]"),
    (crafted('{"ndarray": {"dtype": "|O", "shape": [1], "data": [1]}}'), "numpy dtype '|O' is not allowed"),
    (crafted('{"float": NaN}'), "NaN is not valid JSON"),
    (crafted('[]', version="2"), "nipflow-checkpoint version 2; this nipflow reads version 1"),
    (b"\x00" * 64, "neither a nipflow-checkpoint safetensors file nor a pickled checkpoint"),
])
def test_a_crafted_or_damaged_file_is_refused_as_corrupt_naming_it(data, reason):
    with pytest.raises(CorruptCheckpointError, match=rf"runs/x/checkpoints/iter_000001\.pt: .*{reason}"):
        read_checkpoint(data, source="runs/x/checkpoints/iter_000001.pt")


def test_map_location_puts_every_tensor_there():
    state = {"w": torch.ones(2), "td": TensorDict({"x": torch.ones(3)}, [3], device="cpu")}
    back = decode_checkpoint(encode_checkpoint(state), source="mem", map_location="meta")
    assert back["w"].device.type == "meta" and back["td"].device.type == "meta"
    assert back["td"]["x"].device.type == "meta"


# -- old pickled checkpoints ------------------------------------------------------------------


def test_old_pickled_checkpoint_resumes_bit_identically_with_a_warning_naming_it(tmp_path, caplog):
    hp = tiny_params(rl=dict(num_iterations=4))
    straight = make_trainer(hp, tmp_path / "a")
    straight.run_iterations(0, 4)

    first = make_trainer(hp, tmp_path / "b")
    first.run_iterations(0, 2)
    state, _ = load_run_checkpoint(first.run, "iter_000002")
    # The checkpoint as the previous nipflow wrote it (torch.save of the same state).
    plant_checkpoint(first.run, "iter_000002", pickled(state), iteration=2)
    resumed = make_trainer(hp, tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="nip_core.trainers.checkpoint_legacy"):
        resumed.run_iterations(2, 4)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(tmp_path / "b" / "r" / "checkpoints" / "iter_000002.pt") in w and "weights_only=True" in w
               for w in warnings), warnings
    a, b = params_of(straight), params_of(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The run goes on in the new format, and its final checkpoint holds the straight run's state.
    final = (tmp_path / "b" / "r" / "checkpoints" / "iter_000004.pt").read_bytes()
    assert is_checkpoint_format(final)
    straight_final = (tmp_path / "a" / "r" / "checkpoints" / "iter_000004.pt").read_bytes()
    assert_same(*(trainer_owned(read_checkpoint(data, source="test")) for data in (final, straight_final)))


def test_a_checkpoint_restores_the_global_python_and_numpy_rng_states_it_holds(tmp_path, monkeypatch):
    # what trainer_owned leaves out of the comparison above is still restored on resume
    import random

    trainer = make_trainer(tiny_params(), tmp_path)
    states = trainer.get_rng_states()
    restored = {}
    monkeypatch.setattr(random, "setstate", lambda s: restored.setdefault("python", s))
    monkeypatch.setattr(np.random, "set_state", lambda s: restored.setdefault("numpy", s))
    trainer.set_rng_states(states)
    assert restored["python"] is states["python"] and restored["numpy"] is states["numpy"]
    trainer.close()


def test_old_pickled_solo_checkpoint_resumes_bit_identically(tmp_path):
    def solo(root):
        hp = tiny_params("solo_agent", solo_agent=dict(num_epochs=3, batch_size=8))
        settings = settings_for(root, run_id="solo", checkpoint_every=1)
        run = RunStore(str(root)).open_run("solo", hp)
        return SoloAgentTrainer(hp, tiny_scenario(hp, settings, "solo_agent"), settings, run=run)

    straight = solo(tmp_path / "a")
    straight.train()
    first = solo(tmp_path / "b")
    first.train()
    for suffix in (".pt", ".json"):  # back to epoch 2's checkpoint, in the old format
        (tmp_path / "b" / "solo" / "checkpoints" / f"iter_000003{suffix}").unlink()
    state, _ = load_run_checkpoint(first.run, "iter_000002")
    plant_checkpoint(first.run, "iter_000002", pickled(state), iteration=2)
    resumed = solo(tmp_path / "b")
    assert resumed.restore_latest_checkpoint() == 2  # numpy's RNG state: allowlisted
    resumed.train()
    assert all(torch.equal(v, straight.agents.state_dict()[k]) for k, v in resumed.agents.state_dict().items())


def test_warm_start_from_an_old_pickled_checkpoint(tmp_path):
    hp = tiny_params(rl=dict(num_iterations=2))
    first = make_trainer(hp, tmp_path, run_id="first")
    first.run_iterations(0, 2)
    state, _ = load_run_checkpoint(first.run, "iter_000002")
    plant_checkpoint(first.run, "iter_000002", pickled(state), iteration=2)
    second = make_trainer(tiny_params(seed=3, rl=dict(num_iterations=1)), tmp_path, run_id="second")
    prepare_warm_start(second.run, first.run)
    assert second.maybe_warm_start()
    assert all(torch.equal(v, state["agents"][k]) for k, v in second.agents.state_dict().items())


def test_a_pickle_outside_the_allowlist_is_refused_then_converted_once_when_trusted(tmp_path, capsys):
    hp = tiny_params(rl=dict(num_iterations=4))
    straight = make_trainer(hp, tmp_path / "a")
    straight.run_iterations(0, 4)
    first = make_trainer(hp, tmp_path / "b")
    first.run_iterations(0, 2)
    state, _ = load_run_checkpoint(first.run, "iter_000002")
    state["iteration"] = np.int64(2)  # a numpy scalar: its pickle needs a global outside the allowlist
    plant_checkpoint(first.run, "iter_000002", pickled(state), iteration=2)
    path = tmp_path / "b" / "r" / "checkpoints" / "iter_000002.pt"
    old_sha = hashlib.sha256(path.read_bytes()).hexdigest()

    resumed = make_trainer(hp, tmp_path / "b")
    with pytest.raises(UnsafeCheckpointError) as info:
        resumed.run_iterations(2, 4)
    message = str(info.value)
    assert f"refusing to load checkpoint {path}" in message and "numpy._core.multiarray.scalar" in message
    assert f"python -m nip_core.trainers.checkpoint_legacy --trust {path}" in message
    with pytest.raises(UnsafeCheckpointError):
        convert_pickled_checkpoint(str(path))  # not trusted: nothing is unpickled
    with pytest.raises(SystemExit):
        main([str(path)])  # --trust is required
    assert hashlib.sha256(path.read_bytes()).hexdigest() == old_sha  # untouched so far

    assert main(["--trust", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: converted"
    data = path.read_bytes()
    manifest = json.loads(path.with_suffix(".json").read_text())
    assert is_checkpoint_format(data) and manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["format"] == MANIFEST_FORMAT and manifest["converted_from"]["sha256"] == old_sha
    assert manifest["iteration"] == 2 and manifest["params_hash"] == first.run.params_hash
    assert main(["--trust", str(path)]) == 0 and "already in the safetensors format" in capsys.readouterr().out

    resumed = make_trainer(hp, tmp_path / "b")
    resumed.run_iterations(2, 4)  # the store verifies the new sha256; an exact resume
    a, b = params_of(straight), params_of(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_converting_refuses_a_file_that_does_not_match_its_manifest(tmp_path):
    trainer = make_trainer(tiny_params(), tmp_path)
    plant_checkpoint(trainer.run, "iter_000001", pickled({"iteration": 1}), iteration=1)
    path = tmp_path / "r" / "checkpoints" / "iter_000001.pt"
    path.write_bytes(pickled({"iteration": 2}))
    with pytest.raises(CorruptCheckpointError, match="sha256 does not match its manifest"):
        convert_pickled_checkpoint(str(path), trust=True)
