"""Checkpoints of the TensorDict RL trainers: what they hold, writing, finding and loading.

A checkpoint holds the model, the optimiser, the loss module's state (e.g. adaptive KL
coefficients), the observation normaliser, every RNG (torch, numpy, python, the
environments' generators and data positions) and the carried-over episode state of the
training environment, so that a run resumed from it produces the same batches and the
same parameters as an uninterrupted one (with ``rl.collection_shards >= 2`` also the
environment and torch RNG states of the collection shards, ``collector``, whatever
``settings.num_rollout_workers``: a run may be resumed with a different worker count).

The file format (safetensors for the tensors, JSON for the rest: loading never unpickles
anything) is :mod:`nip_core.trainers.checkpoint_format`; pickled checkpoints of earlier
versions are read by :mod:`nip_core.trainers.checkpoint_legacy`.

Across devices: a checkpoint holds CPU tensors whatever device wrote it, and
:meth:`TensorDictCheckpointMixin.restore_checkpoint` loads with
``map_location=settings.device``, so a checkpoint written on a CUDA host loads on a
CPU-only one (and the other way round) with the tensors where the trainer computes. RNG
states are brought back to the CPU before they are set (torch accepts only CPU byte
tensors there). On a CUDA device the CUDA generators are saved too (``torch_cuda``); a host
without CUDA skips them with a log line, since it cannot replay CUDA streams anyway.

Iteration 0 of a run is a checkpoint too: the warm-start agents or the pretrained ones
(``pretrain_agents``), made once (:meth:`TensorDictCheckpointMixin._prepare_iteration_zero`).

Rerun-tests mode (``base_run.base_run_type = "rerun_tests"``; nip's
``load_and_set_state_from_checkpoint(from_base_run=True)``): instead of training, the run
takes the base run's newest checkpoint as its own (same iteration, same bytes of state) and
tests it with its own test settings (:meth:`TensorDictCheckpointMixin._adopt_base_run_checkpoint`).
"""

from __future__ import annotations

import logging
import random
import re
from typing import Any

import numpy as np
import torch

from nip_core.errors import CheckpointNotFoundError
from nip_core.trainers.checkpoint_files import load_run_checkpoint, save_run_checkpoint
from nip_core.trainers.checkpoint_format import encode_checkpoint

# The RNG messages are the RL trainer's (they were logged there before this module existed).
log = logging.getLogger("nip_core.trainers.tensordict_rl")

CHECKPOINT_PATTERN = re.compile(r"^iter_(\d{6,})$")


def latest_checkpoint_iteration(run: Any, upto: int | None = None) -> int | None:
    """The newest checkpointed iteration of ``run`` (at most ``upto`` when given)."""
    iterations = [int(m.group(1)) for n in run.list_checkpoints() if (m := CHECKPOINT_PATTERN.match(n))]
    if upto is not None:
        iterations = [i for i in iterations if i <= upto]
    return max(iterations) if iterations else None


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor inside (dicts, lists, tuples) moved to the CPU.

    RNG states must be CPU byte tensors (``torch.set_rng_state``,
    ``torch.Generator.set_state``), but a checkpoint loaded with a CUDA ``map_location``
    puts every stored tensor on the GPU.
    """
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


class RngStatesMixin:
    """The global RNG states of a trainer computing on ``settings.device``."""

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


class TensorDictCheckpointMixin:
    """Checkpointing of :class:`~nip_core.trainers.tensordict_rl.TensorDictRlTrainer`."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to continue training exactly from the current iteration."""
        return {
            "iteration": self._memory_iteration,
            "agents": self.agents.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "loss_module": self.loss_module.state_dict(),
            "train_transform": self._transform_state(self.train_env),
            "test_transform": self._transform_state(self.test_env),
            "rng": self.get_rng_states(),
            "train_env_rng": self._base_env(self.train_env).get_rng_state(),
            "test_env_rng": self._base_env(self.test_env).get_rng_state(),
            "carried_td": self._carried_td.clone(),
            **({"collector": collector_state} if (collector_state := self.train_collector.state_dict()) is not None
               else {}),
        }

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.agents.load_state_dict(state["agents"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.loss_module.load_state_dict(state["loss_module"])
        self._load_transform_state(self.train_env, state["train_transform"])
        self._load_transform_state(self.test_env, state["test_transform"])
        self.set_rng_states(state["rng"])
        # The environments' generators and data positions are CPU objects whatever
        # ``map_location`` put their saved tensors on.
        self._base_env(self.train_env).set_rng_state(_to_cpu(state["train_env_rng"]))
        self._base_env(self.test_env).set_rng_state(_to_cpu(state["test_env_rng"]))
        self._carried_td = state["carried_td"]
        # Collection in several shards (nip_core.trainers.collectors): their RNGs.
        self.train_collector.load_state_dict(_to_cpu(state.get("collector")))
        self._memory_iteration = int(state["iteration"])

    @staticmethod
    def _base_env(env):
        return getattr(env, "base_env", env)

    @staticmethod
    def _transform_state(env):
        transform = getattr(env, "transform", None)
        return transform.state_dict() if transform is not None else None

    @staticmethod
    def _load_transform_state(env, state) -> None:
        transform = getattr(env, "transform", None)
        if transform is not None and state is not None:
            transform.load_state_dict(state)

    def _checkpoint_bytes(self) -> bytes:
        return encode_checkpoint(self.checkpoint_state())

    def save_checkpoint(self) -> None:
        """Write ``iter_{n:06d}`` to the run store and the trainer state (no-op without a run)."""
        self._write_checkpoint(self._memory_iteration, None)

    def _write_checkpoint(self, iteration: int, data: bytes | None) -> None:
        """Store the checkpoint of ``iteration`` (``data``: its bytes, default the current state)."""
        if not self.run.persistent:  # a NullRun: not even serialised
            return
        name = checkpoint_name(iteration)
        data_rel = save_run_checkpoint(self.run, name, data if data is not None else self._checkpoint_bytes(),
                                       iteration=iteration, metadata=self._get_metadata())
        self._stored_iteration = iteration
        self.state.iteration = iteration
        self.save_state()
        self.log_run_artifact("checkpoint", "checkpoint", [data_rel, f"checkpoints/{name}.json"])

    def latest_checkpoint_iteration(self, upto: int | None = None) -> int | None:
        """The newest checkpointed iteration (at most ``upto`` when given)."""
        return latest_checkpoint_iteration(self.run, upto)

    def restore_checkpoint(self, iteration: int) -> None:
        """Load the checkpoint of exactly ``iteration``; raises if it is missing or corrupt.

        Tensors are mapped onto this trainer's device, whichever device wrote them. Nothing
        in the file is unpickled (:func:`~nip_core.trainers.checkpoint_format.read_checkpoint`);
        an old pickled checkpoint that is not safe to load raises ``UnsafeCheckpointError``.
        """
        state, _ = load_run_checkpoint(self.run, checkpoint_name(iteration), map_location=self.settings.device)
        self.load_checkpoint_state(state)
        self._stored_iteration = iteration

    def restore_latest_checkpoint(self, upto: int | None = None) -> bool:
        """Load the newest checkpoint (at most ``upto``) if it is ahead of memory.

        The run's newest checkpoint is loaded through nip's hooks
        (:meth:`load_and_set_state_from_checkpoint` -> :meth:`_load_state_dict_from_active_run_checkpoint`),
        so that overriding them changes how a run resumes, as in nip.
        """
        latest = self.latest_checkpoint_iteration(upto)
        if latest is None or latest <= self._memory_iteration:
            return False
        if latest == self.latest_checkpoint_iteration():  # the run's newest: nip's resume hooks load it
            self.load_and_set_state_from_checkpoint()
            self._stored_iteration = self._memory_iteration
        else:
            self.restore_checkpoint(latest)
        return True

    # -- nip's loading hooks, and rerun-tests mode ---------------------------------------------

    def _load_state_dict_from_active_run_checkpoint(self) -> dict[str, Any]:
        """The state of this run's newest checkpoint (nip's hook).

        Raises
        ------
        CheckpointNotFoundError
            If the run has no checkpoint.
        """
        return self._checkpoint_state_of(self.run, "latest", "this run")

    def _load_state_dict_from_base_run_checkpoint(self, version: str | int = "latest") -> dict[str, Any]:
        """The state of a checkpoint of the base run ``base_run.run_id`` (nip's hook).

        ``version``: ``"latest"`` (its newest checkpoint) or an iteration number. nip names
        W&B artifact versions here; a run store keeps one checkpoint per saved iteration.

        Raises
        ------
        CheckpointNotFoundError
            If no base run is named, or it has no such checkpoint.
        """
        from nip_core.runs import RunStore

        run_id = self.hyper_params.base_run.run_id
        if not run_id:
            raise CheckpointNotFoundError("base_run.run_id", "base-run checkpoint (base_run.run_id is not set)")
        return self._checkpoint_state_of(RunStore(self.settings.runs_dir).open_run(run_id), version,
                                         f"base run '{run_id}'")

    def _checkpoint_state_of(self, run: Any, version: str | int, whose: str) -> dict[str, Any]:
        iteration = latest_checkpoint_iteration(run) if version == "latest" else int(version)
        if iteration is None:
            raise CheckpointNotFoundError(run.location, f"checkpoint of {whose} (it has none)")
        state, _ = load_run_checkpoint(run, checkpoint_name(iteration), map_location=self.settings.device)
        return state

    def load_and_set_state_from_checkpoint(self, from_base_run: bool = False, version: str | int = "latest") -> None:
        """Load a checkpoint of this run or (``from_base_run``) of the base run into the trainer (nip's name).

        Raises
        ------
        ValueError
            If ``version`` is not ``"latest"`` for this run (as in nip).
        CheckpointNotFoundError
            If there is no such checkpoint.
        """
        if not from_base_run and version != "latest":
            raise ValueError(f"version: only 'latest' for the active run's checkpoint, got {version!r}")
        state = (self._load_state_dict_from_base_run_checkpoint(version) if from_base_run
                 else self._load_state_dict_from_active_run_checkpoint())
        self.load_checkpoint_state(state)

    @property
    def rerun_tests(self) -> bool:
        """Whether this run tests the base run's checkpoint instead of training (``rerun_tests``)."""
        return self.hyper_params.base_run.base_run_type == "rerun_tests"

    def _adopt_base_run_checkpoint(self) -> None:
        """Rerun-tests mode: hold the base run's newest checkpoint, stored as this run's own.

        Once per run: a resumed rerun (or another block's trainer) loads the adopted copy.
        Nothing is trained; the test loop then tests it.
        """
        if self._stored_iteration is not None:
            return
        if self.restore_latest_checkpoint():
            return
        self.load_and_set_state_from_checkpoint(from_base_run=True)
        log.info("rerun_tests: testing base run '%s' at iteration %d", self.hyper_params.base_run.run_id,
                 self._memory_iteration)
        self._write_checkpoint(self._memory_iteration, None)

    def maybe_warm_start(self) -> bool:
        """Load the warm-start agents of a run that has no state yet (see :mod:`.warm_start`).

        Only the agents' weights are loaded: the run still starts at iteration 0 with a
        fresh optimiser, its own loss-module state, normaliser statistics and RNG streams
        (the reasons are in :mod:`nip_core.trainers.warm_start`). Called by
        :meth:`run_iterations` before the first iteration; at most once per trainer object.

        Raises
        ------
        CorruptCheckpointError
            If the warm-start checkpoint fails its sha256 manifest (names the file).
        WarmStartError
            If its weights do not fit this run's agents (names the tensors).
        """
        if (not self.run.persistent or self._memory_iteration != 0
                or getattr(self, "_warm_start_checked", False) or self.run.has_state()):
            return False
        from nip_core.trainers.warm_start import load_warm_start_agents

        record = load_warm_start_agents(self.run, self.agents)  # logs and records metadata.warm_started
        self._warm_start_checked = True
        return record is not None

    def _prepare_iteration_zero(self) -> None:
        """Warm start, then ``pretrain_agents``; a stored pretrained iteration 0 is loaded instead."""
        if not self.hyper_params.pretrain_agents:
            self.maybe_warm_start()
            return
        if self._stored_iteration == 0 or self._pretrained:
            return  # this object pretrained (or loaded the pretrained agents) already
        if self.latest_checkpoint_iteration(upto=0) == 0:
            self.restore_checkpoint(0)  # pretrained by an earlier attempt: never pretrain twice
            return
        if self.maybe_warm_start():
            log.info("pretrain_agents: the agents were warm-started, so they are not pretrained")
        else:
            self._pretrain_agents()
            self._pretrained = True
        self.save_checkpoint()

    def _pretrain_agents(self) -> None:
        """Pretrain the agents' bodies in isolation (``pretrain_agents``; nip's hook) and log
        the statistics as the ``pretrain`` kind. The result is checkpointed as iteration 0."""
        from nip_core.trainers.pretrain import pretrain_agents

        self.log_stats(pretrain_agents(self), 0, kind="pretrain")
