"""TensorDict trainers: the TorchRL training loop, resumable by iteration (docs/behaviour.md#b24).

One iteration = collect a batch of ``frames_per_batch`` steps (``num_envs`` parallel
episodes x ``steps_per_env`` steps, auto-reset) → GAE per agent → ``num_epochs`` passes of
minibatches from a replay buffer → loss → optimiser step (``rl.optimizer``, Adam by
default; gradients averaged over ``rl.gradient_accumulation_steps`` minibatches, clipped;
optional lr annealing, per-agent update schedules) → log stats with per-phase timings
(:mod:`nip_core.trainers.timing`). The test loop samples, or takes the most likely
actions with ``rl.test_greedy`` (TorchRL's ``ExplorationType.DETERMINISTIC``).

Resumability (a fix, docs/behaviour.md#b24): :meth:`TensorDictRlTrainer.run_iterations` restores the
latest checkpoint of the run store and checkpoints at the end of the range (and every
``settings.checkpoint_every`` iterations). A checkpoint holds the model, the optimiser,
the loss module's state (e.g. adaptive KL coefficients), the observation normaliser, every
RNG (torch, numpy, python, the environments' generators and data positions) and the
carried-over episode state of the training environment, so a resumed run produces the
same batches and the same parameters as an uninterrupted one.

Preemption (:mod:`nip_core.trainers.preemption`): SIGTERM, SIGUSR1 or Ctrl-C during
:meth:`TensorDictRlTrainer.run_iterations` stop training after the current minibatch
step; the checkpoint of the last finished iteration is written and
``TrainingPreempted`` raised, so a resume is exact.

Checkpoints across devices: :meth:`TensorDictRlTrainer.restore_checkpoint` loads with
``map_location=settings.device``, so a checkpoint written on a CUDA host loads on a
CPU-only one (and the other way round) with the tensors where this trainer computes. RNG
states are brought back to the CPU before they are set (torch accepts only CPU byte
tensors there). On a CUDA device the CUDA generators are saved too (``torch_cuda``); a host
without CUDA skips them with a log line, since it cannot replay CUDA streams anyway.

Other choices, documented:

* Collection uses :func:`nip_core.environments.rollouts.collect_batch` (TorchRL's
  ``step_and_maybe_reset`` loop) instead of ``torchrl.collectors.Collector``, whose
  carried-over episode tensordict is private: saving it is what makes resumes exact.
  Episodes therefore straddle iterations exactly as with the collector.
* Observation normalisation (``rl.normalize_observations``): one scalar mean/std per key
  (``x``, ``message``) from random-action steps of the training environment, applied to
  the training *and* test environments through TorchRL ``ObservationNorm`` transforms
  (the original estimated the test statistics separately).
* A frozen agent (update schedule inactive) keeps its optimiser groups, but its gradients
  are dropped before the step, so Adam leaves its parameters and moments untouched.
* Losses are TorchRL ``LossModule`` subclasses of ``NipLossModule``
  (:mod:`nip_core.trainers.objectives.base`): declared keys (``set_keys``), GAE from
  ``make_value_estimator(ValueEstimators.GAE, ...)``, and a ``backward`` that the minibatch
  loop calls (SPG needs its own). They are not TorchRL's ``ClipPPOLoss`` because the
  per-agent joint distribution (several categorical heads per agent) does not fit it.
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
import random
from abc import abstractmethod
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.envs.utils import ExplorationType, set_exploration_type

from nip_core.agents.operators import PolicyOperator, ValueOperator
from nip_core.environments.episode_stats import episode_stats
from nip_core.environments.rollouts import collect_batch, normalized_env, random_observation_stats
from nip_core.errors import CheckpointNotFoundError
from nip_core.scenarios.registry import build_scenario_instance
from nip_core.settings import ExperimentSettings, resolve_device
from nip_core.trainers.base import Trainer, set_global_seed
from nip_core.trainers.precision import autocast_dtype, precision_context
from nip_core.trainers.preemption import PreemptionGuard, TrainingPreempted
from nip_core.trainers.optim import build_optimizer
from nip_core.trainers.progress import attach_progress_bar
from nip_core.trainers.tensordict_checkpoints import TensorDictCheckpointMixin, _to_cpu, checkpoint_name
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


class TensorDictTrainer(Trainer):
    """A trainer of local torch agents on a TensorDict scenario.

    Parameters
    ----------
    hyper_params, settings, run, hooks, stat_logger
        As :class:`~nip_core.trainers.base.Trainer`.
    scenario_instance
        Ready-made scenario components (tests inject small ones); built from the
        scenario registry when omitted.

    The device is resolved first, before anything is built
    (:func:`~nip_core.settings.resolve_device`): ``settings.device`` of the trainer is the
    device it computes on here (``"auto"`` becomes ``"cuda"`` or ``"cpu"``), and
    ``requested_device`` the device as asked, which is what a process on another host
    (an RL block) must resolve again.

    Raises
    ------
    DeviceUnavailableError
        If ``settings.device`` names a CUDA device this host does not have.
    """

    uses_torch_device = True

    def __init__(self, hyper_params, settings=None, run=None, hooks=None, stat_logger=None,
                 scenario_instance=None):
        settings = settings or ExperimentSettings()
        self.requested_device: str = settings.device
        settings = settings.model_copy(update={"device": resolve_device(settings.device)})
        super().__init__(hyper_params, settings, run=run, hooks=hooks, stat_logger=stat_logger)
        set_global_seed(hyper_params.seed)
        if scenario_instance is None:
            scenario_instance = build_scenario_instance(hyper_params, self.settings,
                                                        trainer_type=self.trainer_type)
        self.scenario = scenario_instance
        self.protocol_handler = scenario_instance.protocol_handler
        self.agents: nn.Module = scenario_instance.extras["combined_agents"].to(self.settings.device)
        self.agent_names = list(self.protocol_handler.agent_names)
        self.verifier_index = self.agent_names.index(self.protocol_handler.verifier_names[0])

    def _computes_on_cuda(self) -> bool:
        return torch.device(self.settings.device).type == "cuda" and torch.cuda.is_available()

    def get_rng_states(self) -> dict[str, Any]:
        """The global RNG states; ``torch_cuda`` (all CUDA devices) only when training on CUDA.

        A CPU trainer writes no CUDA entry at all, so its checkpoints do not depend on
        whether the host happens to have a GPU.
        """
        states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if self._computes_on_cuda():
            states["torch_cuda"] = torch.cuda.get_rng_state_all()
        return states

    def set_rng_states(self, states: dict[str, Any]) -> None:
        """Restore :meth:`get_rng_states`; tensors may sit on any device (moved to the CPU)."""
        torch.set_rng_state(_to_cpu(states["torch"]))
        np.random.set_state(states["numpy"])
        random.setstate(states["python"])
        cuda_states = states.get("torch_cuda")
        if cuda_states is None:
            return
        if torch.cuda.is_available():
            cuda_states = _to_cpu(list(cuda_states))
            count = torch.cuda.device_count()
            if len(cuda_states) > count:
                # Written on a host with more GPUs: the extra devices do not exist here.
                log.info("the checkpoint holds CUDA RNG states of %d devices, this host has %d: "
                         "restoring the first %d", len(cuda_states), count, count)
            torch.cuda.set_rng_state_all(cuda_states[:count])
        else:
            log.info("the checkpoint holds CUDA RNG states but CUDA is not available on this host: "
                     "they are not restored (the CPU RNG states are)")


class TensorDictRlTrainer(TensorDictCheckpointMixin, TensorDictTrainer):
    """The TorchRL loop; subclasses provide the loss (:meth:`_get_loss_module_and_gae`)."""

    trainer_type = "rl"
    # Allowed scaled-dot-product-attention kernels, in order of preference (see module doc).
    attention_backends: list = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    # ``torch.compile`` mode of the loss's forward pass in minibatch steps (``None``: eager).
    # ``"reduce-overhead"`` replays CUDA graphs on a GPU; on a CPU compiling costs minutes
    # for a ~15 % faster step, so eager is the default (see docs/architecture.md).
    compile_mode: str | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        hp = self.hyper_params
        self.use_critic = bool(self.scenario.extras.get("use_critic", True))
        base_train_env = self.scenario.train_environment
        base_test_env = self.scenario.test_environment
        self.message_key = base_train_env.main_message_out_key
        self.steps_per_env = base_train_env.steps_per_env
        self.frames_per_batch = base_train_env.frames_per_batch
        if hp.rl.normalize_observations:
            steps = 10 if self.settings.test_run else hp.rl.num_normalization_steps
            # A few random steps of the (batched) env give plenty of frames; cap the count
            # so that initialisation stays cheap for large batches.
            steps = max(1, min(steps, max(1, 20_000 // base_train_env.num_envs)))
            stats = random_observation_stats(base_train_env, steps)
            self.train_env = normalized_env(base_train_env, stats)
            self.test_env = normalized_env(base_test_env, stats)
        else:
            self.train_env, self.test_env = base_train_env, base_test_env
        self.policy_operator = PolicyOperator(self.agents, self.message_key, in_keys=[])
        self.value_operator = ValueOperator(self.agents, in_keys=[]) if self.use_critic else None
        autocast_dtype(hp.rl.precision)  # refuses an unknown precision, naming rl.precision
        self.loss_module, self.value_estimator = self._get_loss_module_and_gae()
        # Loss buffers (e.g. adaptive KL coefficients) and GAE constants live where the agents do.
        self.loss_module.to(self.settings.device)
        if self.value_estimator is not None:
            self.value_estimator.to(self.settings.device)
        self._compiled_loss = None
        self.agent_groups = self.agents.parameter_groups(hp.rl.lr)
        all_groups = [g for groups in self.agent_groups.values() for g in groups]
        for group in all_groups:
            group["initial_lr"] = group["lr"]
        self.optimizer = build_optimizer(all_groups, hp.rl)
        self.profiler = IterationProfiler(parse_iteration_range(self.settings.profile_iterations), self.run)
        self._preemption: PreemptionGuard | None = None  # set while run_iterations trains
        self._stored_iteration: int | None = None  # newest checkpoint this object wrote or read
        # Start of the episode state carried across iterations (reset once, deterministic).
        set_global_seed(hp.seed)
        self._carried_td = self.train_env.reset()
        self._memory_iteration = 0

    # -- subclass hooks ---------------------------------------------------------------------

    @abstractmethod
    def _get_loss_module_and_gae(self):
        """``(loss_module, value_estimator)``; the estimator may be ``None`` (no critic)."""

    # -- the loop ----------------------------------------------------------------------------

    def train(self) -> None:
        """Train for ``rl.num_iterations`` iterations (resuming), then run the test loop."""
        self.run_iterations(self.state.iteration, self.hyper_params.rl.num_iterations)
        if self.hyper_params.rl.num_test_iterations > 0:
            self.test()

    def run_iterations(self, start: int, stop: int) -> None:
        """Train iterations ``[start, stop)`` from the matching checkpoint.

        Raises
        ------
        CheckpointNotFoundError
            If ``start > 0`` and neither memory nor the run store is at iteration ``start``.
        """
        if self._memory_iteration > start:
            # A failed attempt left memory past ``start`` (e.g. a retried orchestration
            # block): go back to exactly the checkpoint the range starts from.
            if start == 0:
                raise CheckpointNotFoundError(
                    f"{self.run.location if self.run else '<no run>'}", "initial state (build a new trainer "
                    "to restart from iteration 0)")
            self.restore_checkpoint(start)
        elif not self.restore_latest_checkpoint(upto=stop) and start == 0:
            self.maybe_warm_start()
        if self._memory_iteration < start:
            raise CheckpointNotFoundError(
                f"{self.run.location if self.run else '<no run>'}/checkpoints/{checkpoint_name(start)}",
                f"checkpoint for iteration {start}")
        every = self.settings.checkpoint_every
        try:
            with PreemptionGuard() as self._preemption:
                self._train_loop(stop, every)
        finally:
            self._preemption = None
        self.save_checkpoint()

    @attach_progress_bar(lambda self: self.hyper_params.rl.num_iterations, "train")
    def _train_loop(self, stop: int, every: int, iteration_context=None) -> None:
        if iteration_context is not None and iteration_context.count < self._memory_iteration:
            iteration_context.step(self._memory_iteration - iteration_context.count)
        while self._memory_iteration < stop:
            # The state at the start of an iteration is the checkpoint of the last finished
            # one: kept in memory (unless stored already) so that a preemption can write it.
            finished = self._memory_iteration
            keep = (None if self.run is None or self.settings.test_run or self._stored_iteration == finished
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
        with sdpa_kernel(self.attention_backends):
            return self._train_iteration_inner(iteration)

    def _precision(self):
        """The context of the agents' forward passes (bf16 autocast with ``rl.precision=bf16``)."""
        return precision_context(self.hyper_params.rl.precision, self.settings.device)

    def _loss_forward(self, minibatch):
        """The loss module's forward pass, compiled when :attr:`compile_mode` asks for it."""
        if self.compile_mode is None:
            return self.loss_module(minibatch)
        if self._compiled_loss is None:
            self._compiled_loss = torch.compile(self.loss_module, mode=self.compile_mode)
        return self._compiled_loss(minibatch)

    def _train_iteration_inner(self, iteration: int) -> dict[str, float]:
        hp = self.hyper_params
        self.agents.train()
        if hp.rl.anneal_lr and self.optimizer is not None:
            fraction = 1.0 - iteration / max(hp.rl.num_iterations, 1)
            for group in self.optimizer.param_groups:
                group["lr"] = fraction * group["initial_lr"]
        active = {name: hp.agent_params(name).update_schedule.is_active(iteration) for name in self.agent_names}
        timer = PhaseTimer()
        with torch.no_grad():
            with timer.phase("collect"), self._precision():
                batch, self._carried_td = collect_batch(self.train_env, self.policy_operator, self._carried_td,
                                                        self.steps_per_env)
            with timer.phase("gae"):
                self._add_values_and_advantages(batch)
        stats = episode_stats(batch, self.agent_names, self.verifier_index)
        with timer.phase("update"):
            stats.update(self._train_on_batch(batch.reshape(-1), active))
        stats.update(timer.stats)
        return stats

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

    def _train_on_batch(self, flat_batch, active: dict[str, bool]) -> dict[str, float]:
        hp = self.hyper_params
        minibatch_size = min(hp.rl.minibatch_size, flat_batch.numel())
        # A fresh buffer per iteration: no sampler state leaks across iterations, so a
        # resumed run samples exactly the minibatches of an uninterrupted one.
        with _quiet_torchrl():
            buffer = ReplayBuffer(storage=LazyTensorStorage(flat_batch.numel()),
                                  sampler=SamplerWithoutReplacement(drop_last=True), batch_size=minibatch_size)
            buffer.extend(flat_batch)
        num_steps = hp.rl.num_epochs * (flat_batch.numel() // minibatch_size)
        if self.settings.test_run:
            num_steps = 1
        frozen_params = [p for name, groups in self.agent_groups.items() if not active[name]
                         for g in groups for p in g["params"]]
        all_params = [p for g in (self.optimizer.param_groups if self.optimizer else []) for p in g["params"]]
        totals: dict[str, float] = {}
        accumulate = hp.rl.gradient_accumulation_steps
        pending = 0  # minibatches whose gradients wait for the next optimiser step
        for step in range(num_steps):
            if self._preemption is not None and self._preemption.requested:
                raise _StopRequested  # the previous minibatch step is complete; drop the iteration
            minibatch = buffer.sample()
            with self._precision():
                losses = self._loss_forward(minibatch)
            for key, value in losses.items(include_nested=True, leaves_only=True):
                name = ".".join(key) if isinstance(key, tuple) else key
                totals[name] = totals.get(name, 0.0) + float(value.detach().sum())
            if self.optimizer is None or all(not a for a in active.values()):
                continue
            self.loss_module.backward(losses)
            pending += 1
            if pending == accumulate or step == num_steps - 1:
                self._optimizer_step(all_params, frozen_params, pending)
                pending = 0
        return {k: v / max(num_steps, 1) for k, v in totals.items()}

    def _optimizer_step(self, all_params: list, frozen_params: list, accumulated: int) -> None:
        """One step on the mean gradient of the ``accumulated`` minibatches since the last."""
        for p in frozen_params:
            p.grad = None  # the optimiser skips parameters without gradient: the agent is frozen
        if accumulated > 1:
            for p in all_params:
                if p.grad is not None:
                    p.grad.div_(accumulated)
        torch.nn.utils.clip_grad_norm_(all_params, self.hyper_params.rl.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- testing -------------------------------------------------------------------------------

    @attach_progress_bar(lambda self: self.hyper_params.rl.num_test_iterations, "test")
    def test(self, iteration_context=None) -> dict[str, float]:
        """Collect ``rl.num_test_iterations`` batches without training; log ``test_`` stats."""
        self.agents.eval()
        batches = []
        greedy = ExplorationType.DETERMINISTIC if self.hyper_params.rl.test_greedy else ExplorationType.RANDOM
        with torch.no_grad(), sdpa_kernel(self.attention_backends), set_exploration_type(greedy), \
                self._precision():
            td = self.test_env.reset()
            for _ in range(self.hyper_params.rl.num_test_iterations):
                batch, td = collect_batch(self.test_env, self.policy_operator, td, self.steps_per_env)
                batches.append(batch)
                if iteration_context is not None:
                    iteration_context.step()
        self.agents.train()
        stats = episode_stats(torch.cat(batches, dim=1), self.agent_names, self.verifier_index, prefix="test_")
        self.log_stats(stats, self._memory_iteration, kind="test")
        return stats
