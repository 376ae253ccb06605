"""benchmarks/gi_ppo.py's ``paper_params`` is the grid of nip's ``scripts/ppo_gi.py``, field by field.

The grid below is transcribed from nip's ``scripts/ppo_gi.py`` (``param_grid``, one value per
field; the seed list's first entry), with where each field lives in nipflow's parameters. A
field the grid sets must have the grid's value: the benchmark's speed figures are only
comparable with the paper's workload if it is that workload.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from gi_ppo import paper_params  # noqa: E402

BOTH = ("agents.prover", "agents.verifier")
ACTOR_CRITIC_1 = {"actor": 1.0, "critic": 1.0}

# nip grid key -> (nipflow paths, the grid's value)
NIP_PPO_GI_GRID = {
    "trainer": (["trainer"], "vanilla_ppo"),
    "interaction_protocol": (["interaction_protocol"], "nip"),
    "dataset_name": (["dataset"], "eru10000"),
    "num_iterations": (["rl.num_iterations"], 5000),
    "num_epochs": (["rl.num_epochs"], 10),
    "minibatch_size": (["rl.minibatch_size"], 256),
    "frames_per_batch": (["rl.frames_per_batch"], 2048),
    "gamma": (["rl.gamma"], 0.95),
    "lmbda": (["rl.lmbda"], 0.95),
    "ppo_loss_type": (["ppo.loss_type"], "clip"),
    "clip_epsilon": (["ppo.clip_epsilon"], 0.2),
    "kl_target": (["ppo.kl_target"], 0.01),
    "kl_beta": (["ppo.kl_beta"], 1.0),
    "kl_decrement": (["ppo.kl_decrement"], 0.5),
    "kl_increment": (["ppo.kl_increment"], 2.0),
    "critic_coef": (["ppo.critic_coef"], 1.0),
    "loss_critic_type": (["rl.loss_critic_type"], "smooth_l1"),
    "clip_value": (["rl.clip_value"], False),
    "entropy_eps": (["ppo.entropy_eps"], 0.001),
    "lr": (["rl.lr"], 0.0003),
    "anneal_lr": (["rl.anneal_lr"], False),
    "max_grad_norm": (["rl.max_grad_norm"], 0.5),
    "body_lr_factor": ([f"{a}.body_lr_factor" for a in BOTH], ACTOR_CRITIC_1),
    "gnn_lr_factor": ([f"{a}.gnn_lr_factor" for a in BOTH], ACTOR_CRITIC_1),
    "use_dual_gnn": ([f"{a}.use_dual_gnn" for a in BOTH], False),
    "use_orthogonal_initialisation": ([f"{a}.use_orthogonal_initialisation" for a in BOTH], True),
    "prover_num_layers": (["agents.prover.num_gnn_layers"], 5),
    "prover_num_value_layers": (["agents.prover.num_value_layers"], 2),
    "prover_dim_value_layers": (["agents.prover.d_value"], 16),
    "prover_lr_factor": (["agents.prover.agent_lr_factor"], ACTOR_CRITIC_1),
    "prover_manual_architecture": (["agents.prover.use_manual_architecture"], False),
    "verifier_num_layers": (["agents.verifier.num_gnn_layers"], 2),
    "verifier_num_value_layers": (["agents.verifier.num_value_layers"], 2),
    "verifier_dim_value_layers": (["agents.verifier.d_value"], 16),
    "verifier_lr_factor": (["agents.verifier.agent_lr_factor"], ACTOR_CRITIC_1),
    "verifier_manual_architecture": (["agents.verifier.use_manual_architecture"], False),
    "num_transformer_layers": ([f"{a}.num_transformer_layers" for a in BOTH], 1),
    "num_transformer_heads": ([f"{a}.num_heads" for a in BOTH], 4),
    "include_round_in_decider": ([f"{a}.include_round_in_decider" for a in BOTH], True),
    "d_representation": (["d_representation"], 16),
    "use_batch_norm": ([f"{a}.use_batch_norm" for a in BOTH], False),
    "random_prover": (["agents.prover.kind"], "graph_isomorphism"),  # False: a GNN prover, not a random one
    "use_shared_body": (["rl.use_shared_body"], False),
    "pretrain_agents": (["pretrain_agents"], False),
    "activation_function": ([f"{a}.activation_function" for a in BOTH], "tanh"),
    "spg_variant": (["spg.variant"], "spg"),
    "stackelberg_sequence": (["spg.stackelberg_sequence"], None),
    "ihvp_variant": (["spg.ihvp_variant"], "nystrom"),
    "ihvp_num_iterations": (["spg.ihvp_num_iterations"], 5),
    "ihvp_rank": (["spg.ihvp_rank"], 5),
    "ihvp_rho": (["spg.ihvp_rho"], 0.1),
    "shared_reward": (["protocol_common.shared_reward"], False),
    "verifier_terminated_penalty": (["protocol_common.verifier_terminated_penalty"], -1.0),
    "verifier_no_guess_reward": (["protocol_common.verifier_no_guess_reward"], 0.05),
    "normalize_advantage": (["ppo.normalize_advantage"], True),
    "normalize_observations": (["rl.normalize_observations"], True),
    "include_linear_message": (["include_linear_message_space"], False),
    "message_size": (["message_size"], 1),
    "min_message_rounds": (["nip_protocol.min_message_rounds"], 3),
    "max_message_rounds": (["nip_protocol.max_message_rounds"], 8),
    "verifier_first": (["protocol_common.verifier_first"], True),
    "debate_sequential": (["debate_protocol.sequential"], False),
    "debate_prover0_first": (["debate_protocol.prover0_first"], True),
    "update_spec": ([f"{a}.update_schedule.kind" for a in BOTH], "constant"),  # None: constant schedules
    "max_train_size": (["dataset_options.max_train_size"], None),
    "seed": (["seed"], 8144),  # the grid's first seed
}


def _at(tree: dict, path: str):
    for part in path.split("."):
        tree = tree[part]
    return tree


@pytest.mark.parametrize("field", sorted(NIP_PPO_GI_GRID))
def test_paper_params_has_the_grid_value_of(field):
    """The grid's value, or, in a field vanilla_ppo never reads, a value refused (so no effect)."""
    from nip_core.parameters import HyperParameters, ParameterError
    from nip_core.parameters.field_use import reads

    paths, expected = NIP_PPO_GI_GRID[field]
    params = paper_params()
    dumped = params.model_dump()
    for path in paths:
        generic = ".".join(["agents", "*", *path.split(".")[2:]]) if path.startswith("agents.") else path
        if reads(params.trainer, generic):
            assert _at(dumped, path) == expected, f"{field} -> {path}"
            continue
        data = params.to_dict()
        node = data
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = expected
        if _at(params.model_dump(), path) != expected:  # the grid's value differs from nipflow's default
            with pytest.raises(ParameterError, match=f"the vanilla_ppo trainer does not read {generic}"):
                HyperParameters.from_dict(data)


def test_the_grid_fields_vanilla_ppo_never_reads_are_the_spg_ones():
    from nip_core.parameters.field_use import reads

    unread = sorted(field for field, (paths, _) in NIP_PPO_GI_GRID.items()
                    if not all(reads("vanilla_ppo", p if not p.startswith("agents.") else
                                     ".".join(["agents", "*", *p.split(".")[2:]])) for p in paths))
    assert unread == ["ihvp_num_iterations", "ihvp_rank", "ihvp_rho", "ihvp_variant", "spg_variant",
                      "stackelberg_sequence"]
