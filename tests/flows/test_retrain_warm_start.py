"""Scheduled retraining warm-starts a real (tiny) GI vanilla_ppo run from the last finished one."""

from __future__ import annotations

import torch

from nip_core.parameters.agents import GraphIsomorphismAgentParameters
from nip_core.trainers.checkpoint_files import read_checkpoint

TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump()
ITERATIONS = 2


def _parameters(tmp_path, run_id=None):
    from flows.parameters import ExperimentParameters

    rl = dict(frames_per_batch=16, num_iterations=ITERATIONS, num_epochs=1, minibatch_size=8,
              num_test_iterations=1, num_normalization_steps=3)
    return ExperimentParameters(
        scenario="graph_isomorphism", trainer="vanilla_ppo", protocol="nip", dataset="test", run_id=run_id,
        params={"d_representation": 2, "agents": {"_default": TINY}, "rl": rl},
        runs_dir=str(tmp_path / "runs"), block_size=1, settings_overrides={"data_dir": str(tmp_path / "data")})


def _capture_first_iteration_weights(monkeypatch):
    """{run_id: agents' weights when the run's iteration 0 begins} (blocks run in this process)."""
    from nip_core.trainers.tensordict_rl import TensorDictRlTrainer

    seen: dict[str, dict[str, torch.Tensor]] = {}
    inner = TensorDictRlTrainer._train_iteration

    def capture(self, iteration):
        if iteration == 0 and self.run.run_id not in seen:
            seen[self.run.run_id] = {k: v.detach().clone() for k, v in self.agents.state_dict().items()}
        return inner(self, iteration)

    monkeypatch.setattr(TensorDictRlTrainer, "_train_iteration", capture)
    return seen


def test_scheduled_retraining_starts_from_the_previous_run_final_weights(prefect_server, tmp_path, monkeypatch):
    from flows.experiment import train_experiment
    from flows.retrain import scheduled_retraining
    from nip_core.runs import RunStore

    torch.set_num_threads(1)
    initial = _capture_first_iteration_weights(monkeypatch)

    first = train_experiment(**_parameters(tmp_path, run_id="first").flow_parameters(), return_state=True)
    assert first.is_completed(), first.message
    store = RunStore(str(tmp_path / "runs"))
    final_name = f"iter_{ITERATIONS:06d}"
    data, manifest = store.open_run("first").load_checkpoint_bytes(final_name)
    first_final = read_checkpoint(data, source=final_name)["agents"]  # safetensors + JSON, never unpickled

    retrained = scheduled_retraining(**_parameters(tmp_path).flow_parameters(), return_state=True)
    assert retrained.is_completed(), retrained.message
    result = retrained.result()
    new_id = result["run_id"]
    assert new_id != "first" and result["iteration"] == ITERATIONS

    meta = store.open_run(new_id).metadata()
    assert meta["warm_start_from"]["run_id"] == "first" and meta["warm_start_from"]["checkpoint"] == final_name
    assert (meta["warm_started"]["run_id"], meta["warm_started"]["checkpoint"]) == ("first", final_name)
    assert meta["warm_started"]["sha256"] == manifest["sha256"]
    assert meta["completed_by_flow"] and meta["experiment"] == store.open_run("first").metadata()["experiment"]

    assert set(initial) == {"first", new_id}
    for key, value in first_final.items():
        assert torch.equal(initial[new_id][key], value), key
    # and that is not what a fresh run starts from (same parameters, same seed)
    assert any(not torch.equal(initial["first"][k], first_final[k]) for k in first_final)
    # only the final checkpoint of the first run (one per block: iter 1 and 2) was copied;
    # the new run trained on from there with its own checkpoints
    assert store.open_run("first").list_checkpoints() == ["iter_000001", final_name]
    assert sorted(p.name for p in (tmp_path / "runs" / new_id / "warm_start").iterdir()) == [
        f"{final_name}.json", f"{final_name}.pt", "source.json"]
    assert store.open_run(new_id).list_checkpoints() == ["iter_000001", final_name]
