"""Data collectors of the TensorDict trainers: in this process, or in worker processes.

:func:`make_collector` builds what ``TensorDictRlTrainer._get_data_collectors`` returns.
Both kinds have the same small interface: ``reset()`` (the initial episode state),
``collect(td)`` (one batch of ``steps`` steps from the carried-over state ``td``; returns
the batch and the state to continue from), ``state_dict()``/``load_state_dict()`` (what a
checkpoint needs beyond the trainer's own state) and ``shutdown()``.

Collection in worker processes (``settings.num_rollout_workers = W > 0``,
:class:`WorkerCollector`): the ``num_envs`` parallel episodes are split into ``W``
contiguous shards of ``num_envs / W`` episodes (``W`` must divide ``num_envs``), and
worker ``k`` (a spawned process) steps shard ``k`` with its own copy of the environment
and the policy. Each iteration the trainer's process sends every worker the current
policy weights, the shard's carried-over episode state and its random-number states, and
receives the shard's batch, episode state and advanced random-number states; the shards
are concatenated along the environment dim. Workers keep no state between iterations, so
checkpoints stay exact and a resumed run collects exactly what an uninterrupted one does.

What is identical, for a given seed:

* ``W = 1``: the worker steps the trainer's own environment state with the trainer's own
  torch RNG state (sent and taken back every iteration), on as many threads as the
  trainer's process has, so collection, and hence training, is bit-identical to
  collection in this process (``W = 0``).
* ``W >= 2``: shard ``k`` has its own environment seed and policy-sampling generator,
  both derived from ``(seed, k)``; the batch is then identical whatever the scheduling of
  the processes and identical to collecting the shards one after the other with
  :func:`collect_shard` in one process, but it is a different (equally valid) sample from
  the one of ``W <= 1``: like ``num_envs``, the shard count changes the random streams.
  (TorchRL's ``MultiSyncDataCollector`` is not used: its workers own the carried-over
  episode state and the generators, which a checkpoint then cannot hold.)

Worker processes compute on the CPU: a CUDA trainer with ``num_rollout_workers > 0`` is
refused (naming the setting).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchrl.envs import TransformedEnv

from nip_core.environments.rollouts import collect_batch
from nip_core.trainers.precision import precision_context


class InProcessCollector:
    """Collects with :func:`~nip_core.environments.rollouts.collect_batch` in this process."""

    def __init__(self, env, policy, steps: int):
        self.env, self.policy, self.steps = env, policy, steps

    def reset(self) -> TensorDictBase:
        return self.env.reset()

    def collect(self, td: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        return collect_batch(self.env, self.policy, td, self.steps)

    def state_dict(self) -> dict[str, Any] | None:
        """Nothing beyond the trainer's state (environment RNG and carried-over episodes)."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        pass

    def shutdown(self) -> None:
        pass


def make_collector(env, policy, steps: int, *, num_workers: int = 0, seed: int = 0, device: str = "cpu",
                   precision: str = "fp32", attention_backends=None):
    """An :class:`InProcessCollector` (``num_workers == 0``) or a :class:`WorkerCollector`."""
    if num_workers == 0:
        return InProcessCollector(env, policy, steps)
    return WorkerCollector(env, policy, steps, num_workers=num_workers, seed=seed, device=device,
                           precision=precision, attention_backends=attention_backends)


def _base_env(env):
    return env.base_env if isinstance(env, TransformedEnv) else env


def shard_seed(seed: int, shard: int) -> int:
    """The seed of shard ``shard``'s environment and sampling generator (``W >= 2``)."""
    return int(np.random.SeedSequence([seed, shard]).generate_state(1, dtype=np.uint64)[0] % 2**63)


def make_shard_env(env, num_envs: int, seed: int):
    """An environment like ``env`` (same class, data, protocol and transforms) with ``num_envs``
    parallel episodes, seeded with ``seed``."""
    base = _base_env(env)
    rl = base.hyper_params.rl.model_copy(update={"frames_per_batch": num_envs * base.steps_per_env})
    hyper_params = base.hyper_params.model_copy(update={"rl": rl})
    shard = type(base)(hyper_params, base.dataset, base.protocol_handler, seed=seed, device=base.device)
    if isinstance(env, TransformedEnv):
        return TransformedEnv(shard, env.transform.clone())
    return shard


def collect_shard(env, policy, request: dict[str, Any]) -> dict[str, Any]:
    """Collect one shard's batch as a worker does (also usable in one process).

    ``request``: ``state_dict`` (the policy's weights), ``td`` (the shard's carried-over
    episode state), ``env_rng`` and ``torch_rng`` (RNG states), ``steps``, ``precision``
    and ``attention_backends`` (``SDPBackend`` members or their names). Returns ``batch``, ``td``, ``env_rng`` and ``torch_rng``
    after the batch.
    """
    policy.load_state_dict(request["state_dict"])
    _base_env(env).set_rng_state(request["env_rng"])
    torch.set_rng_state(request["torch_rng"])
    # SDPA kernels travel by name (the enum does not pickle).
    backends = [getattr(SDPBackend, b) if isinstance(b, str) else b for b in request["attention_backends"] or []]
    with torch.no_grad(), precision_context(request["precision"], "cpu"), \
            (sdpa_kernel(backends) if backends else contextlib.nullcontext()):
        batch, td = collect_batch(env, policy, request["td"], request["steps"])
    return {"batch": batch, "td": td, "env_rng": _base_env(env).get_rng_state(), "torch_rng": torch.get_rng_state()}


def _worker_main(conn, payload: bytes, num_threads: int) -> None:
    """Worker process: hold a shard's environment and policy; answer collect requests."""
    torch.set_num_threads(num_threads)
    env, policy = torch.load(io.BytesIO(payload), weights_only=False)
    while True:
        request = conn.recv()
        if request is None:
            conn.close()
            return
        try:
            conn.send(collect_shard(env, policy, request))
        except Exception as error:  # handed to the trainer's process, which raises it
            conn.send(error)


class WorkerCollector:
    """Collection in ``num_workers`` spawned processes, one shard of the episodes each (module doc).

    Raises
    ------
    ValueError
        If ``num_workers`` does not divide the number of parallel episodes, or the
        trainer computes on a CUDA device (both naming ``settings.num_rollout_workers``).
    """

    def __init__(self, env, policy, steps: int, *, num_workers: int, seed: int, device: str, precision: str,
                 attention_backends=None):
        num_envs = _base_env(env).num_envs
        if num_envs % num_workers != 0:
            raise ValueError(f"settings.num_rollout_workers ({num_workers}) must divide the number of parallel "
                             f"environments ({num_envs}, from rl.frames_per_batch / steps per environment)")
        if torch.device(device).type != "cpu":
            raise ValueError(f"settings.num_rollout_workers ({num_workers}) needs device 'cpu' (worker processes "
                             f"collect on the CPU), got device {device!r}")
        self.env, self.policy, self.steps = env, policy, steps
        self.num_workers = num_workers
        self.precision = precision
        self.attention_backends = [b.name for b in attention_backends or []]
        if num_workers == 1:
            self.shard_envs = [env]  # the trainer's own environment and global RNG (module doc)
            self.torch_rngs = None
        else:
            seeds = [shard_seed(seed, k) for k in range(num_workers)]
            self.shard_envs = [make_shard_env(env, num_envs // num_workers, s) for s in seeds]
            self.torch_rngs = [torch.Generator().manual_seed(s).get_state() for s in seeds]
        self._workers: list[tuple[Any, Any]] | None = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        threads = max(1, torch.get_num_threads() // self.num_workers)
        self._workers = []
        for shard_env in self.shard_envs:
            buffer = io.BytesIO()
            torch.save((shard_env, self.policy), buffer)
            parent, child = context.Pipe()
            process = context.Process(target=_worker_main, args=(child, buffer.getvalue(), threads), daemon=True)
            process.start()
            child.close()
            self._workers.append((process, parent))

    def reset(self) -> TensorDictBase:
        if self.num_workers == 1:
            return self.env.reset()
        return torch.cat([shard_env.reset() for shard_env in self.shard_envs], dim=0)

    def collect(self, td: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        if self._workers is None:
            self._start()
        size = td.batch_size[0] // self.num_workers
        state_dict = {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}
        for k, (_, conn) in enumerate(self._workers):
            torch_rng = torch.get_rng_state() if self.torch_rngs is None else self.torch_rngs[k]
            conn.send({"state_dict": state_dict, "td": td[k * size:(k + 1) * size],
                       "env_rng": _base_env(self.shard_envs[k]).get_rng_state(), "torch_rng": torch_rng,
                       "steps": self.steps, "precision": self.precision,
                       "attention_backends": self.attention_backends})
        results = []
        for k, (process, conn) in enumerate(self._workers):
            try:
                result = conn.recv()
            except EOFError:
                raise RuntimeError(f"rollout worker {k} (pid {process.pid}) died, exit code {process.exitcode}") \
                    from None
            if isinstance(result, Exception):
                raise RuntimeError(f"rollout worker {k} failed: {result!r}") from result
            _base_env(self.shard_envs[k]).set_rng_state(result["env_rng"])
            if self.torch_rngs is None:
                torch.set_rng_state(result["torch_rng"])
            else:
                self.torch_rngs[k] = result["torch_rng"]
            results.append(result)
        batch = torch.cat([r["batch"] for r in results], dim=0)
        return batch, torch.cat([r["td"] for r in results], dim=0)

    def state_dict(self) -> dict[str, Any] | None:
        """The shards' environment and sampling RNG states (``W >= 2``; ``None`` for ``W = 1``)."""
        if self.torch_rngs is None:
            return None
        return {"env_rng": [_base_env(e).get_rng_state() for e in self.shard_envs],
                "torch_rng": [s.clone() for s in self.torch_rngs]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None or self.torch_rngs is None:
            return
        for shard_env, env_rng in zip(self.shard_envs, state["env_rng"]):
            _base_env(shard_env).set_rng_state(env_rng)
        self.torch_rngs = list(state["torch_rng"])

    def shutdown(self) -> None:
        """Stop the worker processes (started again by the next :meth:`collect`)."""
        workers, self._workers = self._workers, None
        for process, conn in workers or []:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            conn.close()
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
