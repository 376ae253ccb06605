"""``solo_agent``: supervised classification of ``y`` by each agent alone (docs/behaviour.md#b29).

Every non-random agent's body + solo head is trained with cross-entropy on the datapoints
(no interaction: empty message history, round 0; the functions are shared with
``pretrain_agents``, :mod:`nip_core.trainers.pretrain`). The train file is split into train and
test parts by ``test_size`` with a generator seeded by ``seed``.

Fix (docs/behaviour.md#b29): the original never put body parameters into the optimiser (only the solo
head trained); here the optimiser holds the body groups (at the body/GNN lr factors, or
the plain lr with ``solo_agent.body_lr_factor_override``) and the head.

Checkpoints (``checkpoints/iter_{epoch:06d}``, every ``settings.checkpoint_every`` epochs
and at the end) hold the agents, the optimisers, the epoch-order generator and the global
RNGs: a resumed run continues bit-identically, a warm start loads another run's final
agents (fresh optimisers), and running a finished run again reports the test metrics of
its stored model instead of freshly initialised weights. The file format (safetensors + JSON,
never unpickled) is :mod:`nip_core.trainers.checkpoint_format`.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch

from nip_core.trainers.checkpoint_files import load_run_checkpoint, save_run_checkpoint
from nip_core.trainers.pretrain import (
    solo_loss_and_accuracy,
    solo_names,
    solo_optimizers,
    split_train_test,
    train_solo_epoch,
)
from nip_core.trainers.progress import attach_progress_bar
from nip_core.trainers.registry import register_trainer
from nip_core.trainers.tensordict_checkpoints import CHECKPOINT_PATTERN, _to_cpu, checkpoint_name
from nip_core.trainers.tensordict_base import TensorDictTrainer


@register_trainer("solo_agent")
class SoloAgentTrainer(TensorDictTrainer):
    """Supervised training of each agent's body and solo head."""

    trainer_type = "solo_agent"  # so: trainer_kind "solo", no critic (TensorDictTrainer.__init_subclass__)

    def __init__(self, hyper_params, *args, **kwargs):
        # rl.optimizer, rl.precision and the rest of rl.* are refused by the parameters (field_use.READERS)
        super().__init__(hyper_params, *args, **kwargs)
        hp = self.hyper_params
        self.solo_names = solo_names(self.agents)
        self.optimizers = solo_optimizers(self.agents, hp)
        self.train_indices, self.test_indices, self.generator = split_train_test(
            len(self.scenario.train_dataset), hp.test_size, hp.seed)

    def _loss_and_accuracy(self, indices: torch.Tensor):
        return solo_loss_and_accuracy(self.agents, self.scenario.train_dataset, indices)

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint_state(self, epoch: int) -> dict[str, Any]:
        return {"iteration": epoch, "agents": self.agents.state_dict(),
                "optimizers": {n: o.state_dict() for n, o in self.optimizers.items()},
                "generator": self.generator.get_state(), "rng": self.get_rng_states()}

    def save_checkpoint(self, epoch: int) -> None:
        """Store the checkpoint of ``epoch`` finished epochs and move the state there."""
        self.state.iteration = epoch
        if not self.run.persistent:  # a NullRun: not even serialised
            return
        save_run_checkpoint(self.run, checkpoint_name(epoch), self.checkpoint_state(epoch), iteration=epoch)
        self.save_state()

    def restore_latest_checkpoint(self) -> int:
        """Load the newest checkpoint (if any); return its epoch (0 without one)."""
        epochs = [int(m.group(1)) for n in self.run.list_checkpoints() if (m := CHECKPOINT_PATTERN.match(n))]
        epochs = [e for e in epochs if e <= self.hyper_params.solo_agent.num_epochs]
        if not epochs:
            return 0
        state, _ = load_run_checkpoint(self.run, checkpoint_name(max(epochs)), map_location=self.settings.device)
        self.agents.load_state_dict(state["agents"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.generator.set_state(_to_cpu(state["generator"]))
        self.set_rng_states(state["rng"])
        self.state.iteration = int(state["iteration"])
        return self.state.iteration

    def _maybe_warm_start(self) -> None:
        if not self.run.persistent or self.run.has_state():
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
        with ExitStack() as stack:
            self._build_train_context(stack)
            for epoch in range(self.state.iteration, self.hyper_params.solo_agent.num_epochs):
                self._train_epoch(epoch, batch_size)
                if iteration_context is not None:
                    iteration_context.step()

    def _train_epoch(self, epoch: int, batch_size: int) -> None:
        """One pass over the train split in a fresh seeded order; logs and checkpoints."""
        order = self.train_indices[torch.randperm(self.train_indices.numel(), generator=self.generator)]
        mean_loss, mean_acc = train_solo_epoch(self.agents, self.scenario.train_dataset, order, batch_size,
                                               self.optimizers)
        stats = {}
        for i, name in enumerate(self.solo_names):
            stats[f"{name}.train_loss"] = float(mean_loss[i])
            stats[f"{name}.train_accuracy"] = float(mean_acc[i])
        self.log_stats(stats, epoch)
        every = self.settings.checkpoint_every
        if every and (epoch + 1) % every == 0 and epoch + 1 < self.hyper_params.solo_agent.num_epochs:
            self.save_checkpoint(epoch + 1)

    def test(self) -> dict[str, float]:
        """Loss and accuracy of every agent on the held-out part; logged with kind ``test``."""
        with ExitStack() as stack:
            self._build_test_context(stack)
            loss, accuracy = self._loss_and_accuracy(self.test_indices)
        stats = {}
        for i, name in enumerate(self.solo_names):
            stats[f"{name}.test_loss"] = float(loss[i])
            stats[f"{name}.test_accuracy"] = float(accuracy[i])
        self.log_stats(stats, self.hyper_params.solo_agent.num_epochs, kind="test")
        return stats
