"""Supervised training of the agents' bodies with solo heads; ``pretrain_agents``.

The solo-agent trainer (:mod:`nip_core.trainers.solo_agent`) and the pretraining stage of
the RL trainers share the functions here: every non-random agent's body and solo head
(``CombinedAgents.solo_head``, built by ``build_combined_agents`` when the trainer is
``solo_agent`` or ``pretrain_agents`` is on) classify ``y`` of a datapoint alone, with an
empty message history in round 0, trained with cross-entropy.

``pretrain_agents`` (as in nip, whose RL trainers run the solo-agent trainer on the
bodies before RL): :func:`pretrain_agents` trains the bodies and solo heads of an RL
trainer's agents for ``solo_agent.num_epochs`` epochs (``solo_agent.batch_size``,
``solo_agent.learning_rate``, ``solo_agent.body_lr_factor_override``) on the training
part of the train dataset (split by ``test_size`` with a generator seeded by ``seed``,
as the solo-agent trainer does), then RL starts from the pretrained bodies. Choices,
documented:

* nip's bodies never trained (docs/behaviour.md#b29, the optimiser missed them); here
  they do, which is the point of pretraining.
* An agent with separate policy and value bodies (``rl.use_shared_body=False``) has its
  policy body pretrained; the value body then starts as a copy of it.
* The global RNG streams are left as they were before pretraining (it runs on forked
  streams), so RL's random draws do not depend on how long pretraining ran.
* nip cached pretrained bodies across runs (``model_cache/solo_agents``); here the result
  is part of the run's iteration-0 checkpoint instead (``TensorDictRlTrainer``
  pretrains once, when iteration 0 starts, and a resume loads that checkpoint).
* A warm-started run is not pretrained: its agents are already trained.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import Tensor, nn

from nip_core.environments.tensordict_env import gather_datapoints


def split_train_test(length: int, test_size: float, seed: int) -> tuple[Tensor, Tensor, torch.Generator]:
    """``(train_indices, test_indices, generator)``: a ``test_size`` split seeded by ``seed``.

    The generator (seeded, advanced by the split) then orders the epochs.
    """
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(length, generator=generator)
    n_test = max(1, int(round(length * test_size)))
    return perm[n_test:], perm[:n_test], generator


def solo_names(agents: nn.Module) -> list[str]:
    """The agents with a solo head, in agent order."""
    return [n for n in agents.agent_names if n in agents.solo_head]


def solo_optimizers(agents: nn.Module, hyper_params) -> dict[str, torch.optim.Adam]:
    """One Adam per solo agent over its body and solo head (``solo_agent.*`` learning rates)."""
    solo = hyper_params.solo_agent
    groups = agents.parameter_groups(solo.learning_rate, solo=True, override_body_factor=solo.body_lr_factor_override)
    return {name: torch.optim.Adam(groups[name], eps=1e-5) for name in solo_names(agents) if groups.get(name)}


def solo_inputs(agents: nn.Module, dataset, indices: Tensor) -> tuple[TensorDict, Tensor]:
    """The round-0 observation of the datapoints ``indices`` (no messages) and their labels."""
    data = gather_datapoints(dataset, indices)
    B = indices.numel()
    N, C, M, R = agents.max_nodes, agents.num_channels, agents.message_size, agents.max_rounds
    td = TensorDict({
        "x": torch.zeros(B, R, C, M, 2, N), "message": torch.zeros(B, C, M, 2, N),
        "round": torch.zeros(B, dtype=torch.long), "adjacency": data["adjacency"],
        "node_mask": data["node_mask"],
    }, batch_size=(B,))
    device = next(agents.parameters()).device
    return td.to(device), data["y"].reshape(B).long().to(device)


def solo_loss_and_accuracy(agents: nn.Module, dataset, indices: Tensor) -> tuple[Tensor, Tensor]:
    """Per solo agent ``(A_solo,)`` mean cross-entropy and accuracy on ``indices``."""
    td, y = solo_inputs(agents, dataset, indices)
    logits = agents.solo_logits(td)  # (B, A_solo, 2)
    target = y[:, None].expand(-1, logits.shape[1])
    per_agent = F.cross_entropy(logits.reshape(-1, 2), target.reshape(-1), reduction="none")
    loss = per_agent.reshape(target.shape).mean(0)
    accuracy = (logits.argmax(-1) == target).float().mean(0)
    return loss, accuracy


def train_solo_epoch(agents: nn.Module, dataset, order: Tensor, batch_size: int,
                     optimizers: dict[str, torch.optim.Optimizer]) -> tuple[Tensor, Tensor]:
    """One pass over ``order`` in minibatches; the per-agent mean loss and accuracy."""
    losses, accuracies = [], []
    for start in range(0, order.numel(), batch_size):
        loss, accuracy = solo_loss_and_accuracy(agents, dataset, order[start:start + batch_size])
        for optimizer in optimizers.values():
            optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        for optimizer in optimizers.values():
            optimizer.step()
        losses.append(loss.detach())
        accuracies.append(accuracy)
    return torch.stack(losses).mean(0), torch.stack(accuracies).mean(0)


def pretrain_agents(trainer) -> dict[str, float]:
    """Pretrain ``trainer.agents``' bodies with their solo heads (module doc); return the statistics.

    Returns ``pretrain_{agent}.train_loss`` / ``train_accuracy`` (last epoch) and
    ``pretrain_{agent}.test_accuracy`` (held-out part) for every solo agent.

    Raises
    ------
    ValueError
        If the agents have no solo heads (the scenario did not build them for
        ``pretrain_agents``).
    """
    hp = trainer.hyper_params
    agents = trainer.agents
    names = solo_names(agents)
    if not names:
        raise ValueError("pretrain_agents: the scenario built no solo heads to pretrain the agents' bodies with")
    dataset = trainer.scenario.train_dataset
    train_indices, test_indices, generator = split_train_test(len(dataset), hp.test_size, hp.seed)
    optimizers = solo_optimizers(agents, hp)
    was_training = agents.training
    stats: dict[str, float] = {}
    devices = [torch.device(trainer.settings.device)] if torch.device(trainer.settings.device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        agents.train()
        mean_loss = mean_accuracy = None
        for _ in range(hp.solo_agent.num_epochs):
            order = train_indices[torch.randperm(train_indices.numel(), generator=generator)]
            mean_loss, mean_accuracy = train_solo_epoch(agents, dataset, order, hp.solo_agent.batch_size, optimizers)
        agents.eval()
        with torch.no_grad():
            _, test_accuracy = solo_loss_and_accuracy(agents, dataset, test_indices)
    agents.train(was_training)
    for optimizer in optimizers.values():
        optimizer.zero_grad(set_to_none=True)  # RL's first backward must not add to them
    with torch.no_grad():
        for name in names:
            if name in agents.value_body:  # a separate critic body starts from the pretrained one
                agents.value_body[name].load_state_dict(agents.policy_body[name].state_dict())
    for i, name in enumerate(names):
        if mean_loss is not None:
            stats[f"pretrain_{name}.train_loss"] = float(mean_loss[i])
            stats[f"pretrain_{name}.train_accuracy"] = float(mean_accuracy[i])
        stats[f"pretrain_{name}.test_accuracy"] = float(test_accuracy[i])
    trainer.logger.info("pretrained the bodies of %s for %d epochs", ", ".join(names), hp.solo_agent.num_epochs)
    return stats
