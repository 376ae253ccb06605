"""Helpers of the TensorDict trainer tests: tiny GI experiments on in-memory datasets."""

from __future__ import annotations

from torchrl.objectives.value import GAE

from nip_core.parameters import HyperParameters
from nip_core.parameters.agents import GraphIsomorphismAgentParameters
from nip_core.scenarios.graph_isomorphism.build import build_graph_isomorphism
from nip_core.settings import ExperimentSettings
from nip_core.trainers.objectives.common import AGENT_KEYS
from tests.nip_core.environments.standins import RandomGraphDataset

TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump()


#: the heads solo training never builds (refused for solo_agent: nip_core/parameters/field_use.py)
_NOT_SOLO = ("d_node_selector", "num_node_selector_layers", "d_value", "num_value_layers")
TINY_SOLO = {k: v for k, v in TINY.items() if k not in _NOT_SOLO}


def tiny_params(trainer="vanilla_ppo", agents=None, **overrides) -> HyperParameters:
    """Tiny widths; for solo_agent without the RL loop's fields and the heads it never builds."""
    rl = {} if trainer == "solo_agent" else dict(frames_per_batch=32, num_iterations=6, minibatch_size=16,
                                                 num_epochs=2, num_test_iterations=1, num_normalization_steps=5)
    rl.update(overrides.pop("rl", {}))
    return HyperParameters(scenario="graph_isomorphism", trainer=trainer, dataset="test", d_representation=4,
                           agents=agents or {"_default": TINY_SOLO if trainer == "solo_agent" else TINY}, rl=rl,
                           nip_protocol=dict(max_message_rounds=4), **overrides)


def settings_for(tmp_path, **kw) -> ExperimentSettings:
    return ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path), data_dir=str(tmp_path / "data"),
                              show_progress=False, **kw)


def tiny_scenario(hp, settings, trainer_type="rl", n=24):
    return build_graph_isomorphism(hp, settings, trainer_type=trainer_type,
                                   train_dataset=RandomGraphDataset(n=n, max_nodes=6, min_nodes=4, seed=0),
                                   test_dataset=RandomGraphDataset(n=n, max_nodes=6, min_nodes=4, seed=1))


def make_trainer(hp, tmp_path, run_id="r", **settings_kw):
    """A vanilla_ppo trainer on the tiny scenario with its run in ``tmp_path``."""
    from nip_core.runs import RunStore
    from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer

    settings = settings_for(tmp_path, run_id=run_id, **settings_kw)
    run = RunStore(str(tmp_path)).open_run(run_id, hp)
    return VanillaPpoTrainer(hp, settings=settings, run=run, scenario_instance=tiny_scenario(hp, settings))


def params_of(trainer):
    """A detached copy of the trainer's agent weights."""
    return {k: v.detach().clone() for k, v in trainer.agents.state_dict().items()}


def plant_checkpoint(run, name: str, data: bytes, **info) -> None:
    """Put ``data`` in place of ``run``'s checkpoint ``name``, as a file an older nipflow left there.

    Those versions stored ``checkpoints/<name>.pt`` and a manifest without a ``data`` field
    and replaced both on every save; today's run store writes each once, so a test that
    stands in an older version's (or a tampered) file writes it here, past the run store.
    """
    import hashlib
    import json

    run.storage.write_bytes(f"checkpoints/{name}.pt", data)
    manifest = {"name": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                "params_hash": run.params_hash, "saved_at": "2026-01-01T00:00:00+00:00", **info}
    run.storage.write_bytes(f"checkpoints/{name}.json", json.dumps(manifest, sort_keys=True).encode())


def train_config(params_file, tmp_path, run_id: str, overrides=()):
    """Train a config file's run in-process; ``(hp, train accuracies, test rows)``.

    The train accuracies are ``mean_decided_accuracy`` per iteration (a time-out is wrong,
    docs/behaviour.md#b15); the test rows are the metrics rows of kind ``test``.
    """
    from nip_core.experiment import make_params
    from nip_core.trainers import build_trainer

    hp = make_params(params_file=params_file, overrides=list(overrides))
    trainer = build_trainer(hp, settings_for(tmp_path, run_id=run_id))
    try:
        trainer.train()
        rows = trainer.run.read_metrics()
    finally:
        trainer.close()
    train = [r["mean_decided_accuracy"] for r in rows
             if r.get("kind", "train") == "train" and "mean_decided_accuracy" in r]
    return hp, train, [r for r in rows if r.get("kind") == "test"]


def per_agent_gae(hyper_params) -> GAE:
    """A plain TorchRL GAE on the per-agent keys (values supplied, no value net): what the
    trainers built by hand before their loss modules made it (``make_value_estimator``)."""
    gae = GAE(gamma=hyper_params.rl.gamma, lmbda=hyper_params.rl.lmbda, value_network=None)
    gae.set_keys(**AGENT_KEYS)
    return gae
