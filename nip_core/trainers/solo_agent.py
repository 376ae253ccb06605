"""``solo_agent``: supervised classification of ``y`` by each agent alone (docs/behaviour.md#b29).

Every non-random agent's body + solo head is trained with cross-entropy on the datapoints
(no interaction: empty message history, round 0). The train file is split into train and
test parts by ``test_size`` with a generator seeded by ``seed``.

Fix (docs/behaviour.md#b29): the original never put body parameters into the optimiser (only the solo
head trained); here the optimiser holds the body groups (at the body/GNN lr factors, or
the plain lr with ``solo_agent.body_lr_factor_override``) and the head.

Checkpoints (``checkpoints/iter_{epoch:06d}``, every ``settings.checkpoint_every`` epochs
and at the end) hold the agents, the optimisers, the epoch-order generator and the global
RNGs: a resumed run continues bit-identically, a warm start loads another run's final
agents (fresh optimisers), and running a finished run again reports the test metrics of
its stored model instead of freshly initialised weights.
"""

from __future__ import annotations

import io
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from nip_core.environments.tensordict_env import gather_datapoints
from nip_core.trainers.progress import attach_progress_bar
from nip_core.trainers.registry import register_trainer
from nip_core.trainers.tensordict_checkpoints import CHECKPOINT_PATTERN, _to_cpu, checkpoint_name
from nip_core.trainers.tensordict_rl import TensorDictTrainer


@register_trainer("solo_agent")
class SoloAgentTrainer(TensorDictTrainer):
    """Supervised training of each agent's body and solo head."""

    trainer_kind = "solo"
    needs_critic = False
    trainer_type = "solo_agent"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        hp = self.hyper_params
        self.solo_names = [n for n in self.agent_names if n in self.agents.solo_head]
        groups = self.agents.parameter_groups(hp.solo_agent.learning_rate, solo=True,
                                              override_body_factor=hp.solo_agent.body_lr_factor_override)
        self.optimizers = {name: torch.optim.Adam(groups[name], eps=1e-5) for name in self.solo_names
                           if groups.get(name)}
        dataset = self.scenario.train_dataset
        n = len(dataset)
        generator = torch.Generator().manual_seed(hp.seed)
        perm = torch.randperm(n, generator=generator)
        n_test = max(1, int(round(n * hp.test_size)))
        self.train_indices, self.test_indices = perm[n_test:], perm[:n_test]
        self.generator = generator

    def _inputs(self, indices: torch.Tensor) -> tuple[TensorDict, torch.Tensor]:
        data = gather_datapoints(self.scenario.train_dataset, indices)
        B = indices.numel()
        N = self.agents.max_nodes
        C, M, R = self.agents.num_channels, self.agents.message_size, self.agents.max_rounds
        td = TensorDict({
            "x": torch.zeros(B, R, C, M, 2, N), "message": torch.zeros(B, C, M, 2, N),
            "round": torch.zeros(B, dtype=torch.long), "adjacency": data["adjacency"],
            "node_mask": data["node_mask"],
        }, batch_size=(B,))
        return td, data["y"].reshape(B).long()

    def _loss_and_accuracy(self, indices: torch.Tensor):
        td, y = self._inputs(indices)
        logits = self.agents.solo_logits(td)  # (B, A_solo, 2)
        target = y[:, None].expand(-1, logits.shape[1])
        per_agent = F.cross_entropy(logits.reshape(-1, 2), target.reshape(-1), reduction="none")
        loss = per_agent.reshape(target.shape).mean(0)
        accuracy = (logits.argmax(-1) == target).float().mean(0)
        return loss, accuracy

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint_state(self, epoch: int) -> dict[str, Any]:
        return {"iteration": epoch, "agents": self.agents.state_dict(),
                "optimizers": {n: o.state_dict() for n, o in self.optimizers.items()},
                "generator": self.generator.get_state(), "rng": self.get_rng_states()}

    def save_checkpoint(self, epoch: int) -> None:
        """Store the checkpoint of ``epoch`` finished epochs and move the state there."""
        self.state.iteration = epoch
        if self.run is None or self.settings.test_run:
            return
        buffer = io.BytesIO()
        torch.save(self.checkpoint_state(epoch), buffer)
        self.run.save_checkpoint_bytes(checkpoint_name(epoch), buffer.getvalue(), iteration=epoch)
        self.save_state()

    def restore_latest_checkpoint(self) -> int:
        """Load the newest checkpoint (if any); return its epoch (0 without one)."""
        if self.run is None or self.settings.test_run:
            return 0
        epochs = [int(m.group(1)) for n in self.run.list_checkpoints() if (m := CHECKPOINT_PATTERN.match(n))]
        epochs = [e for e in epochs if e <= self.hyper_params.solo_agent.num_epochs]
        if not epochs:
            return 0
        data, _ = self.run.load_checkpoint_bytes(checkpoint_name(max(epochs)))
        state = torch.load(io.BytesIO(data), weights_only=False, map_location=self.settings.device)
        self.agents.load_state_dict(state["agents"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.generator.set_state(_to_cpu(state["generator"]))
        self.set_rng_states(state["rng"])
        self.state.iteration = int(state["iteration"])
        return self.state.iteration

    def _maybe_warm_start(self) -> None:
        if self.run is None or self.settings.test_run or self.run.has_state():
            return
        from nip_core.trainers.warm_start import load_warm_start_agents

        load_warm_start_agents(self.run, self.agents)

    # -- training --------------------------------------------------------------------------

    def train(self) -> None:
        """Train the remaining epochs (resuming from the newest checkpoint), then test."""
        if self.restore_latest_checkpoint() == 0:
            self.state.iteration = 0  # no stored weights: whatever the state says, start over
            self._maybe_warm_start()
        self._train_epochs()
        self.save_checkpoint(self.hyper_params.solo_agent.num_epochs)
        self.test()

    @attach_progress_bar(lambda self: self.hyper_params.solo_agent.num_epochs, "solo")
    def _train_epochs(self, iteration_context=None) -> None:
        batch_size = self.hyper_params.solo_agent.batch_size
        self.agents.train()
        for epoch in range(self.state.iteration, self.hyper_params.solo_agent.num_epochs):
            order = self.train_indices[torch.randperm(self.train_indices.numel(), generator=self.generator)]
            losses, accuracies = [], []
            for start in range(0, order.numel(), batch_size):
                loss, accuracy = self._loss_and_accuracy(order[start:start + batch_size])
                for optimizer in self.optimizers.values():
                    optimizer.zero_grad(set_to_none=True)
                loss.sum().backward()
                for optimizer in self.optimizers.values():
                    optimizer.step()
                losses.append(loss.detach())
                accuracies.append(accuracy)
            mean_loss, mean_acc = torch.stack(losses).mean(0), torch.stack(accuracies).mean(0)
            stats = {}
            for i, name in enumerate(self.solo_names):
                stats[f"{name}.train_loss"] = float(mean_loss[i])
                stats[f"{name}.train_accuracy"] = float(mean_acc[i])
            self.log_stats(stats, epoch)
            every = self.settings.checkpoint_every
            if every and (epoch + 1) % every == 0 and epoch + 1 < self.hyper_params.solo_agent.num_epochs:
                self.save_checkpoint(epoch + 1)
            if iteration_context is not None:
                iteration_context.step()

    def test(self) -> dict[str, float]:
        """Loss and accuracy of every agent on the held-out part; logged with kind ``test``."""
        self.agents.eval()
        with torch.no_grad():
            loss, accuracy = self._loss_and_accuracy(self.test_indices)
        self.agents.train()
        stats = {}
        for i, name in enumerate(self.solo_names):
            stats[f"{name}.test_loss"] = float(loss[i])
            stats[f"{name}.test_accuracy"] = float(accuracy[i])
        self.log_stats(stats, self.hyper_params.solo_agent.num_epochs, kind="test")
        return stats
