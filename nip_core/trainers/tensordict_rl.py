"""TensorDict trainers: the TorchRL training loop, resumable by iteration (docs/behaviour.md#b24).

One iteration = collect a batch of ``frames_per_batch`` steps (``num_envs`` parallel
episodes x ``steps_per_env`` steps, auto-reset) → GAE per agent → ``num_epochs`` passes of
minibatches from a replay buffer → loss → optimiser step (``rl.optimizer``, Adam by
default; gradients averaged over ``rl.gradient_accumulation_steps`` minibatches, clipped;
optional lr annealing, per-agent update schedules) → log stats with per-phase timings
(:mod:`nip_core.trainers.timing`). The test loop samples, or takes the most likely
actions with ``rl.test_greedy`` (TorchRL's ``ExplorationType.DETERMINISTIC``).

Resumability (a fix, docs/behaviour.md#b24): :meth:`TensorDictRlTrainer.run_iterations`
restores the latest checkpoint of the run store and checkpoints at the end of the range
(and every ``settings.checkpoint_every`` iterations); what a checkpoint holds, and how it
loads across devices, is in :mod:`nip_core.trainers.tensordict_checkpoints`. A resumed
run produces the same batches and parameters as an uninterrupted one.

Preemption (:mod:`nip_core.trainers.preemption`): SIGTERM, SIGUSR1, SIGHUP or Ctrl-C during
:meth:`TensorDictRlTrainer.run_iterations` stop training after the current minibatch
step; the checkpoint of the last finished iteration is written and
``TrainingPreempted`` raised, so a resume is exact.

Other choices, documented:

* Collection (:mod:`nip_core.trainers.collectors`) uses
  :func:`nip_core.environments.rollouts.collect_batch` (TorchRL's ``step_and_maybe_reset``
  loop) instead of ``torchrl.collectors.Collector``, whose carried-over episode
  tensordict is private: saving it is what makes resumes exact. Episodes straddle
  iterations exactly as with the collector. ``rl.collection_shards`` splits the
  episodes into independently seeded shards and ``settings.num_rollout_workers`` runs the
  shards in worker processes without changing what is collected.
* Observation normalisation (``rl.normalize_observations``): one scalar mean/std per key
  (``x``, ``message``) from random-action steps of the training environment, applied to
  the training *and* test environments through TorchRL ``ObservationNorm`` transforms
  (the original estimated the test statistics separately).
* A frozen agent (update schedule inactive) keeps its optimiser groups, but its gradients
  are dropped before the step, so Adam leaves its parameters and moments untouched.
* Losses are TorchRL ``LossModule`` subclasses of ``NipLossModule``
  (:mod:`nip_core.trainers.objectives.base`): declared keys (``set_keys``), GAE from
  ``make_value_estimator(ValueEstimators.GAE, ...)``, and a ``backward`` that the minibatch
  loop calls (SPG needs its own); a loss without ``backward`` is differentiated through the
  sum of its ``loss_*`` entries. They are not TorchRL's ``ClipPPOLoss`` because the
  per-agent joint distribution (several categorical heads per agent) does not fit it.
* ``pretrain_agents`` (:mod:`nip_core.trainers.pretrain`): the bodies are pretrained once,
  before iteration 0, and the result is the iteration-0 checkpoint.
* Attention kernels: ``attention_backends`` (class attribute) lists the allowed SDPA
  kernels, used for collection, training and testing alike, by agents that call SDPA
  (the GI body writes its short-sequence attention out instead, see
  ``docs/architecture.md``); SPG, which needs double backward for its Hessian rows,
  restricts itself to MATH.
* Precision (``rl.precision``, :mod:`nip_core.trainers.precision`): with ``bf16`` the
  agents' forward passes of collection, GAE values, minibatch losses and the test loop run
  under bf16 autocast; GAE, the backward pass and the optimiser step run outside it.
* Devices: the agents, the loss module (its buffers) and GAE are moved to
  ``settings.device``; ``compile_mode`` (class attribute, ``None`` by default) compiles
  the loss's forward pass with ``torch.compile(mode=...)``, e.g. ``"reduce-overhead"``
  for CUDA graphs on a GPU.
"""

from __future__ import annotations

import contextlib
import logging
from abc import abstractmethod
from contextlib import ExitStack
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.envs.utils import ExplorationType, set_exploration_type

from nip_core.agents.operators import PolicyOperator, ValueOperator
from nip_core.environments.episode_stats import episode_stats, loss_stats
from nip_core.environments.rollouts import normalized_env, random_observation_stats
from nip_core.errors import CheckpointNotFoundError, TrainingPreempted
from nip_core.trainers.base import set_global_seed
from nip_core.trainers.collectors import as_collector, make_collector
from nip_core.trainers.precision import precision_context, resolve_precision
from nip_core.trainers.preemption import PreemptionGuard
from nip_core.trainers.optim import ParamGroupFreezer, backward_losses, build_optimizer, optimizer_step
from nip_core.trainers.progress import attach_progress_bar
from nip_core.trainers.tensordict_base import TensorDictTrainer, module_mode
from nip_core.trainers.tensordict_checkpoints import TensorDictCheckpointMixin, checkpoint_name
from nip_core.trainers.timing import IterationProfiler, PhaseTimer, parse_iteration_range

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _quiet_torchrl():
    """Hide torchrl's INFO line about every storage it initialises."""
    logger = logging.getLogger("torchrl")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


class _StopRequested(Exception):
    """A preemption signal arrived: leave the iteration after the current minibatch step."""


class TensorDictRlTrainer(TensorDictCheckpointMixin, TensorDictTrainer):
    """The TorchRL loop; subclasses provide the loss (:meth:`_get_loss_module_and_gae`).

    Extension points (nip's names; each is called by the default loop and may be
    overridden): :meth:`_get_loss_module_and_gae`, :meth:`_get_optimizer_and_param_freezer`,
    :meth:`_get_data_collectors`, :meth:`_get_replay_buffer`, :meth:`_build_train_context`,
    :meth:`_build_test_context`, :meth:`_run_train_loop`, :meth:`_run_test_loop`,
    :meth:`_train_on_replay_buffer` and :meth:`_get_log_stats`. One iteration is
    :meth:`_train_iteration`, which reads top to bottom: collect, GAE, replay buffer, PPO
    update, log statistics.
    """

    trainer_type = "rl"
    # (trainer_kind "tensordict", needs_critic True: from TensorDictTrainer; an actor-only
    # subclass says needs_critic = False.)
    # Allowed scaled-dot-product-attention kernels, in order of preference (see module doc).
    attention_backends: list = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    # ``torch.compile`` mode of the loss's forward pass in minibatch steps (``None``: eager).
    # ``"reduce-overhead"`` replays CUDA graphs on a GPU; on a CPU compiling costs minutes
    # for a ~15 % faster step, so eager is the default (see docs/architecture.md).
    compile_mode: str | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        hp = self.hyper_params
        # nip's combined parts: one module runs them all here, and a value head exists with a critic
        self.use_critic = self.scenario.combined_value_head is not None
        base_train_env, base_test_env = self.scenario.train_environment, self.scenario.test_environment
        self.message_key = base_train_env.main_message_out_key
        self.steps_per_env = base_train_env.steps_per_env
        self.frames_per_batch = base_train_env.frames_per_batch
        self.train_env, self.test_env = base_train_env, base_test_env
        if hp.rl.normalize_observations:
            self._add_normalization_transforms()
        self._build_operators()
        # fp32 or bf16 (what rl.precision=auto picked here; refuses an unknown one), recorded in the run
        self.precision, why = resolve_precision(hp.rl.precision, self.settings.device)
        self.run.update_metadata(precision={"requested": hp.rl.precision, "used": self.precision, "why": why})
        self.loss_module, self.value_estimator = self._get_loss_module_and_gae()
        # Loss buffers (e.g. adaptive KL coefficients) and GAE constants live where the agents do.
        self.loss_module.to(self.settings.device)
        if self.value_estimator is not None:
            self.value_estimator.to(self.settings.device)
        self._compiled_loss = None
        self.optimizer, self.param_group_freezer = self._get_optimizer_and_param_freezer(self.loss_module)
        self.train_collector, self.test_collector = map(as_collector, self._get_data_collectors())
        self.profiler = IterationProfiler(parse_iteration_range(self.settings.profile_iterations), self.run)
        self._preemption: PreemptionGuard | None = None  # set while run_iterations trains
        self._train_stop: int | None = None  # the end of the range run_iterations trains
        # What _train_on_replay_buffer trains on (nip's attributes), set by each iteration.
        self.replay_buffer: ReplayBuffer | None = None
        self.active_agents: dict[str, bool] = {name: True for name in self.agent_names}
        self._stored_iteration: int | None = None  # newest checkpoint this object wrote or read
        self._pretrained = False  # pretrain_agents ran in this object
        # Start of the episode state carried across iterations (reset once, deterministic).
        set_global_seed(hp.seed)
        self._carried_td = self.train_collector.reset()
        self._memory_iteration = 0

    # -- extension points: building -----------------------------------------------------------

    def _add_normalization_transforms(self) -> None:
        """Normalise the observations of ``train_env`` and ``test_env`` (``rl.normalize_observations``).

        nip's hook. The statistics come from ``rl.num_normalization_steps`` random steps of
        the training environment (at most 20,000 frames) and are shared by both.
        """
        steps = 10 if self.settings.test_run else self.hyper_params.rl.num_normalization_steps
        steps = max(1, min(steps, max(1, 20_000 // self.train_env.num_envs)))
        stats = random_observation_stats(self.train_env, steps)
        self.train_env = normalized_env(self.train_env, stats)
        self.test_env = normalized_env(self.test_env, stats)

    def _build_operators(self) -> None:
        """``policy_operator`` over ``scenario_instance.combined_policy_head`` and (with a critic)
        ``value_operator`` over ``combined_value_head`` (nip's hook)."""
        self.policy_operator = PolicyOperator(self.scenario.combined_policy_head, self.message_key, in_keys=[])
        value_head = self.scenario.combined_value_head
        self.value_operator = ValueOperator(value_head, in_keys=[]) if value_head is not None else None

    @abstractmethod
    def _get_loss_module_and_gae(self):
        """``(loss_module, value_estimator)``; the estimator may be ``None`` (no critic).

        The loss is a TorchRL ``LossModule`` whose forward returns a tensordict of
        ``loss_*`` terms; a loss without a ``backward`` method is differentiated through
        the sum of those terms (:meth:`_backward`).
        """

    def _get_optimizer_and_param_freezer(self, loss_module) -> tuple[torch.optim.Optimizer | None,
                                                                      ParamGroupFreezer]:
        """The optimiser (``rl.optimizer``) and the parameter freezer (nip's signature).

        The freezer's collections are the agents' parameter groups (``lr`` and per-part
        factors; the loss module holds the agents): an agent whose update schedule is
        inactive is frozen for the iteration, its gradients dropped before the optimiser
        step (module doc).
        """
        agent_groups = self.agents.parameter_groups(self.hyper_params.rl.lr)
        all_groups = [g for groups in agent_groups.values() for g in groups]
        for group in all_groups:
            group["initial_lr"] = group["lr"]
        optimizer = build_optimizer(all_groups, self.hyper_params.rl)
        return optimizer, ParamGroupFreezer(optimizer, agent_groups if optimizer is not None else {})

    def _get_data_collectors(self) -> tuple[Any, Any]:
        """``(train_collector, test_collector)``, see :mod:`nip_core.trainers.collectors`.

        An override may return TorchRL collectors (``torchrl.collectors.Collector``, nip's
        ``SyncDataCollector``, with ``total_frames=-1``): they are driven as they are, but a
        resumed run does not continue their episodes (:class:`~nip_core.trainers.collectors.TorchRLCollector`).

        The train collector collects ``rl.collection_shards`` shards of the episodes, in
        ``settings.num_rollout_workers`` worker processes when that is positive (the worker
        count never changes results); the test collector always runs in this process.
        """
        train = make_collector(self.train_env, self.policy_operator, self.steps_per_env,
                               num_shards=self.hyper_params.rl.collection_shards,
                               num_workers=self.settings.num_rollout_workers, seed=self.hyper_params.seed,
                               device=self.settings.device, precision=self.precision,
                               attention_backends=self.attention_backends)
        return train, make_collector(self.test_env, self.policy_operator, self.steps_per_env)

    def _get_replay_buffer(self, transform=None) -> ReplayBuffer:
        """A buffer holding exactly one batch, sampled in minibatches without replacement.

        The loop builds a fresh buffer every iteration: no sampler state leaks across
        iterations, so a resumed run samples exactly the minibatches of an uninterrupted one.
        """
        minibatch_size = min(self.hyper_params.rl.minibatch_size, self.frames_per_batch)
        # on the trainer's device: torchrl's storage defaults to the CPU, which would hand a
        # CUDA trainer CPU minibatches
        storage = LazyTensorStorage(self.frames_per_batch, device=self.settings.device)
        with _quiet_torchrl():
            return ReplayBuffer(storage=storage, transform=transform,
                                sampler=SamplerWithoutReplacement(drop_last=True), batch_size=minibatch_size)

    def _build_train_context(self, stack: ExitStack) -> list:
        """Enter the contexts of the training loop on ``stack``; return them.

        The allowed attention kernels and the agents' training mode. Precision (bf16
        autocast) is entered per phase instead (module doc), since the backward pass and
        the optimiser step run outside it.
        """
        contexts = [sdpa_kernel(self.attention_backends), module_mode(self.agents, training=True)]
        for context in contexts:
            stack.enter_context(context)
        return contexts

    def _build_test_context(self, stack: ExitStack) -> list:
        """Enter the contexts of the test loop on ``stack``; return them.

        No gradients, the attention kernels, sampled or greedy actions
        (``rl.test_greedy``), ``rl.precision`` and the agents' evaluation mode.
        """
        greedy = ExplorationType.DETERMINISTIC if self.hyper_params.rl.test_greedy else ExplorationType.RANDOM
        contexts = [torch.no_grad(), sdpa_kernel(self.attention_backends), set_exploration_type(greedy),
                    self._precision(), module_mode(self.agents, training=False)]
        for context in contexts:
            stack.enter_context(context)
        return contexts

    # -- the loop ----------------------------------------------------------------------------

    def train(self) -> None:
        """Train the agents: :meth:`_train_and_test` (resuming from the run's checkpoint)."""
        self._train_and_test()

    def _train_and_test(self) -> None:
        """Train for ``rl.num_iterations`` iterations (resuming), then run the test loop.

        nip's hook. Under Prefect the iterations run in RL blocks, so a class that
        overrides this (or ``train()``) runs as one task instead (``flows/experiment.py``).
        """
        self.run_iterations(self.state.iteration, self.hyper_params.rl.num_iterations)
        if self.hyper_params.rl.num_test_iterations > 0:
            self.test()

    def run_iterations(self, start: int, stop: int) -> None:
        """Train iterations ``[start, stop)`` from the matching checkpoint.

        A run that starts from iteration 0 is warm-started and (``pretrain_agents``)
        pretrained first; the pretrained agents are the iteration-0 checkpoint, so a resume
        does not pretrain again.

        Raises
        ------
        CheckpointNotFoundError
            If ``start > 0`` and neither memory nor the run store is at iteration ``start``.
        """
        if self.rerun_tests:  # nothing to train: test the base run's checkpoint
            return self._adopt_base_run_checkpoint()
        if self._memory_iteration > start:
            # A failed attempt left memory past ``start`` (e.g. a retried orchestration
            # block): go back to exactly the checkpoint the range starts from.
            if start == 0:
                raise CheckpointNotFoundError(
                    f"{self.run.location if self.run else '<no run>'}", "initial state (build a new trainer "
                    "to restart from iteration 0)")
            self.restore_checkpoint(start)
        elif not self.restore_latest_checkpoint(upto=stop) and start == 0:
            self._prepare_iteration_zero()
        if self._memory_iteration < start:
            raise CheckpointNotFoundError(
                f"{self.run.location if self.run else '<no run>'}/checkpoints/{checkpoint_name(start)}",
                f"checkpoint for iteration {start}")
        self._train_stop = stop
        try:
            with PreemptionGuard() as self._preemption, ExitStack() as stack:
                self._build_train_context(stack)
                self._run_train_loop()
        finally:
            self._preemption = None
            self._train_stop = None
        self.save_checkpoint()

    @attach_progress_bar(lambda self: self.hyper_params.rl.num_iterations, "train")
    def _run_train_loop(self, iteration_context=None) -> None:
        """Train (in the train context) until the end of the range :meth:`run_iterations` trains
        (``rl.num_iterations`` when called on its own); checkpoint every ``checkpoint_every``.

        nip's signature: an override decorated with ``attach_progress_bar`` gets its
        ``iteration_context`` and is called with no other argument.
        """
        stop = self.hyper_params.rl.num_iterations if self._train_stop is None else self._train_stop
        every = self.settings.checkpoint_every
        if iteration_context is not None and iteration_context.count < self._memory_iteration:
            iteration_context.step(self._memory_iteration - iteration_context.count)
        while self._memory_iteration < stop:
            # The state at the start of an iteration is the checkpoint of the last finished
            # one: kept in memory (unless stored already) so that a preemption can write it.
            finished = self._memory_iteration
            keep = (None if not self.run.persistent or self._stored_iteration == finished
                    else self._checkpoint_bytes())
            try:
                self.profiler.before(finished)
                stats = self._train_iteration(self._memory_iteration)
                self.profiler.after(finished)
            except _StopRequested:
                self.profiler.close()
                if self._stored_iteration != finished:
                    self._write_checkpoint(finished, keep)
                raise TrainingPreempted(self._preemption.signum, finished) from None
            self._memory_iteration += 1
            self.log_stats(stats, self._memory_iteration - 1)
            if iteration_context is not None:
                iteration_context.step()
            if every and self._memory_iteration % every == 0 and self._memory_iteration < stop:
                self.save_checkpoint()

    def _train_iteration(self, iteration: int) -> dict[str, float]:
        """One iteration: collect, GAE, fill the replay buffer, update, statistics."""
        hp = self.hyper_params
        if hp.rl.anneal_lr and self.optimizer is not None:
            fraction = 1.0 - iteration / max(hp.rl.num_iterations, 1)
            for group in self.optimizer.param_groups:
                group["lr"] = fraction * group["initial_lr"]
        active = {name: hp.agent_params(name).update_schedule.is_active(iteration) for name in self.agent_names}
        timer = PhaseTimer()
        with torch.no_grad():
            with timer.phase("collect"), self._precision():
                batch, self._carried_td = self.train_collector.collect(self._carried_td)
            with timer.phase("gae"):
                self._add_values_and_advantages(batch)
        with timer.phase("update"):
            self.replay_buffer = self._get_replay_buffer()
            with _quiet_torchrl():
                self.replay_buffer.extend(getattr(self.loss_module, "minibatch_source", lambda b: b)(batch).reshape(-1))
            self.active_agents = active
            mean_losses = self._train_on_replay_buffer()
        stats = self._get_log_stats(batch, mean_losses, train=True)
        stats.update(timer.stats)
        return stats

    def _precision(self):
        """The context of the agents' forward passes (bf16 autocast with ``rl.precision=bf16``)."""
        return precision_context(self.precision, self.settings.device)

    def _loss_forward(self, minibatch):
        """The loss module's forward pass, compiled when :attr:`compile_mode` asks for it."""
        if self.compile_mode is None:
            return self.loss_module(minibatch)
        if self._compiled_loss is None:
            self._compiled_loss = torch.compile(self.loss_module, mode=self.compile_mode)
        return self._compiled_loss(minibatch)

    def _add_values_and_advantages(self, batch) -> None:
        if self.value_estimator is None:
            return
        B, T = batch.batch_size
        with self._precision():  # the critic in rl.precision; GAE itself in float32
            values = self.agents.value(batch.reshape(-1))
            last_values = self.agents.value(batch["next"][:, -1])
        values = values.reshape(B, T, *values.shape[1:])
        # The observation after step t is the one of step t+1 unless the episode ended at
        # t; every end is terminal (no bootstrap), so only the last step needs the critic.
        next_values = torch.empty_like(values)
        next_values[:, :-1] = values[:, 1:]
        next_values[:, -1] = last_values
        batch.set(("agents", "value"), values)
        batch.set(("next", "agents", "value"), next_values)
        self.value_estimator(batch)

    def _train_on_replay_buffer(self) -> TensorDictBase:
        """The PPO update: ``rl.num_epochs`` passes of minibatches from ``self.replay_buffer``.

        nip's signature. Each minibatch: loss forward (``rl.precision``), backward, and every
        ``rl.gradient_accumulation_steps`` minibatches (and after the last) one optimiser
        step on the mean gradient. Agents that ``self.active_agents`` (this iteration's
        update schedules) leaves out are frozen. Returns the mean of the loss module's
        output over the minibatches (per-agent entries under ``agents``), as nip does.
        """
        hp, replay_buffer, active = self.hyper_params, self.replay_buffer, self.active_agents
        size = len(replay_buffer)
        num_steps = hp.rl.num_epochs * (size // min(hp.rl.minibatch_size, size))
        if self.settings.test_run:
            num_steps = 1
        freezer = self.param_group_freezer
        for name, is_active in active.items():
            if name in freezer.param_group_collections:
                (freezer.unfreeze if is_active else freezer.freeze)(name)
        frozen_params = freezer.frozen_params()
        all_params = [p for g in (self.optimizer.param_groups if self.optimizer else []) for p in g["params"]]
        totals = None
        accumulate = hp.rl.gradient_accumulation_steps
        pending = 0  # minibatches whose gradients wait for the next optimiser step
        for step in range(num_steps):
            if self._preemption is not None and self._preemption.requested:
                raise _StopRequested  # the previous minibatch step is complete; drop the iteration
            minibatch = replay_buffer.sample()
            with self._precision():
                losses = self._loss_forward(minibatch)
            detached = losses.detach().float()
            totals = detached.clone() if totals is None else totals.apply(torch.add, detached)
            if self.optimizer is None or all(not a for a in active.values()):
                continue
            self._backward(losses)
            pending += 1
            if pending == accumulate or step == num_steps - 1:
                self._optimizer_step(all_params, frozen_params, pending)
                pending = 0
        return totals.apply(lambda v: v / max(num_steps, 1)) if totals is not None else TensorDict({}, [])

    def _backward(self, losses) -> None:
        """The loss module's ``backward``; without one, backpropagate the sum of its ``loss_*`` terms."""
        backward_losses(self.loss_module, losses)

    def _optimizer_step(self, all_params: list, frozen_params: list, accumulated: int) -> None:
        """One step on the mean gradient of the ``accumulated`` minibatches since the last."""
        optimizer_step(self.optimizer, all_params, frozen_params, accumulated, self.hyper_params.rl.max_grad_norm)

    def _get_log_stats(self, rollouts, mean_loss_vals: TensorDictBase | None = None, *,
                       train: bool = True) -> dict[str, float]:
        """Episode statistics of ``rollouts`` (prefix ``test_`` unless ``train``) and the mean losses.

        The losses as nip logs them (docs/behaviour.md#b15): ``{prefix}{key}`` for each entry
        and ``{prefix}{agent}.{key}`` for each per-agent one; ``loss_critic_unscaled`` is
        ``loss_critic`` divided by the critic coefficient.
        """
        prefix = "" if train else "test_"
        stats = episode_stats(rollouts, self.agent_names, self.verifier_index, prefix=prefix)
        if mean_loss_vals is not None:
            stats.update(loss_stats(mean_loss_vals, self.agent_names, prefix,
                                    getattr(self.loss_module, "critic_coef", None)))
        return stats

    # -- testing -------------------------------------------------------------------------------

    def test(self) -> dict[str, float]:
        """Collect ``rl.num_test_iterations`` batches without training; log ``test_`` stats."""
        with ExitStack() as stack:
            self._build_test_context(stack)
            stats = self._run_test_loop()
        self.log_stats(stats, self._memory_iteration, kind="test")
        return stats

    @attach_progress_bar(lambda self: self.hyper_params.rl.num_test_iterations, "test")
    def _run_test_loop(self, iteration_context=None) -> dict[str, float]:
        """The test batches (in the test context), from a fresh reset; returns their statistics."""
        batches = []
        td = self.test_collector.reset()
        for _ in range(self.hyper_params.rl.num_test_iterations):
            batch, td = self.test_collector.collect(td)
            batches.append(batch)
            if iteration_context is not None:
                iteration_context.step()
        return self._get_log_stats(torch.cat(batches, dim=1), train=False)

    def close(self) -> None:
        """Stop the collectors' worker processes, then close the logger."""
        for collector in (self.train_collector, self.test_collector):
            collector.shutdown()
        super().close()
