"""Data collectors of the TensorDict trainers: shards of the episodes, in this process or in workers.

:func:`make_collector` builds what ``TensorDictRlTrainer._get_data_collectors`` returns.
Both kinds have the same small interface: ``reset()`` (the initial episode state),
``collect(td)`` (one batch of ``steps`` steps from the carried-over state ``td``; returns
the batch and the state to continue from), ``state_dict()``/``load_state_dict()`` (what a
checkpoint needs beyond the trainer's own state) and ``shutdown()``.

Two separate knobs:

* ``rl.collection_shards = S`` (a hyper-parameter, part of the experiment) decides *what*
  is collected. ``S = 1``: one stream, the trainer's own environment stepped with the
  trainer's global torch RNG. ``S >= 2``: the ``num_envs`` parallel episodes are split
  into ``S`` contiguous shards of ``num_envs / S`` episodes (``S`` must divide
  ``num_envs``); shard ``k`` has its own environment (:func:`make_shard_env`) and its own
  torch RNG state, both seeded with :func:`shard_seed` ``(seed, k)``. Like
  ``frames_per_batch``, ``S`` changes the sample (a different, equally valid one).
* ``settings.num_rollout_workers = W`` (a setting) decides only *where* the shards are
  collected, and never changes results. ``W = 0``: in this process, the shards one after
  the other (:class:`ShardedCollector` with :func:`collect_shard`). ``W >= 1``: ``W``
  spawned worker processes (``W`` must divide ``S``); worker ``j`` holds copies of the
  environments of shards ``[j S/W, (j+1) S/W)`` and of the policy and collects those shards
  one after the other. Each iteration the trainer's process sends every worker the current
  policy weights and, per shard, the carried-over episode state and the RNG states, and
  receives per shard the batch, the episode state and the advanced RNG states; the shards
  are concatenated along the environment dim. Workers keep no state between iterations.

So for given hyper-parameters the batches, the training and the checkpoints are
bit-identical for ``W = 0`` and every divisor ``W`` of ``S``, and a run may be resumed with
a different ``W``. What makes it so:

* a shard is collected with its own RNG state whatever process runs it: the global torch
  RNG is saved, set to the shard's state for the shard's steps (the policy's action
  sampling, and any noise or dropout of the agents, draw from the global RNG), and
  restored afterwards (:func:`collect_shard`), so the trainer's own RNG is not advanced by
  sharded collection; with ``S = 1`` the one stream *is* the trainer's RNG (sent to the
  worker and taken back with ``W = 1``);
* a worker computes with as many intra-op threads as the trainer's process (CPU kernels
  may round differently with other thread counts); on a machine with few cores keep
  ``W * torch.get_num_threads()`` within the core count;
* checkpoints hold the shards' environment and torch RNG states whenever ``S >= 2``
  (:meth:`ShardedCollector.state_dict`), whatever ``W``.

TorchRL's ``MultiSyncDataCollector`` is not used: its workers own the carried-over episode
state and the generators, which a checkpoint then cannot hold. Worker processes compute on
the CPU: a CUDA trainer with ``num_rollout_workers > 0`` is refused (naming the setting);
sharded collection in this process (``W = 0``) works on any device (on CUDA each shard also
has its own CUDA RNG state).
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
        """Accept only ``None`` (a checkpoint of sharded collection cannot continue as one stream)."""
        if state is not None:
            raise ValueError(f"the checkpoint was collected with {len(state['torch_rng'])} shards, but "
                             f"rl.collection_shards is 1")

    def shutdown(self) -> None:
        pass


class TorchRLCollector:
    """A TorchRL collector (e.g. ``torchrl.collectors.Collector``, nip's ``SyncDataCollector``)
    returned by a trainer's ``_get_data_collectors``, driven through this module's interface.

    Each :meth:`collect` is the collector's next batch; the collector carries its own
    episodes across batches, so the trainer's carried-over episode state is passed through
    untouched. Its environment state is not in nipflow's checkpoints: a run resumed from a
    checkpoint starts fresh episodes (the batches differ from an uninterrupted run's), as
    in nip. A collector that stops (``total_frames`` reached) ends training with an error.
    """

    def __init__(self, collector):
        self.collector = collector
        self._batches = iter(collector)

    def reset(self) -> TensorDictBase:
        from tensordict import TensorDict

        return TensorDict({}, batch_size=[])  # the collector carries its own episodes

    def collect(self, td):
        try:
            batch = next(self._batches)
        except StopIteration:
            raise RuntimeError("the TorchRL collector of _get_data_collectors stopped: set its total_frames "
                               "to -1 (or to at least the frames of every iteration)") from None
        return batch, td

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            raise ValueError("the checkpoint was collected with rl.collection_shards shards; the trainer's "
                             "_get_data_collectors now returns a TorchRL collector, which cannot continue it")

    def shutdown(self) -> None:
        self.collector.shutdown()


def as_collector(collector):
    """``collector``, or a TorchRL collector wrapped in :class:`TorchRLCollector`."""
    from torchrl.collectors import BaseCollector

    return TorchRLCollector(collector) if isinstance(collector, BaseCollector) else collector


def make_collector(env, policy, steps: int, *, num_shards: int = 1, num_workers: int = 0, seed: int = 0,
                   device: str = "cpu", precision: str = "fp32", attention_backends=None):
    """An :class:`InProcessCollector` (one shard, no workers) or a :class:`ShardedCollector`.

    Raises
    ------
    ValueError
        If ``num_shards`` does not divide the number of parallel episodes (naming
        ``rl.collection_shards``), ``num_workers`` does not divide ``num_shards`` (naming
        ``settings.num_rollout_workers`` and ``rl.collection_shards``), or worker processes
        are asked for a trainer on a CUDA device.
    """
    num_envs = _base_env(env).num_envs
    if num_shards < 1 or num_envs % num_shards != 0:
        raise ValueError(f"rl.collection_shards ({num_shards}) must divide the number of parallel "
                         f"environments ({num_envs}, from rl.frames_per_batch / steps per environment)")
    if num_workers < 0 or (num_workers > 0 and num_shards % num_workers != 0):
        raise ValueError(f"settings.num_rollout_workers ({num_workers}) must be 0 or divide "
                         f"rl.collection_shards ({num_shards}): workers only distribute the shards")
    if num_workers > 0 and torch.device(device).type != "cpu":
        raise ValueError(f"settings.num_rollout_workers ({num_workers}) needs device 'cpu' (worker processes "
                         f"collect on the CPU), got device {device!r}")
    if num_shards == 1 and num_workers == 0:
        return InProcessCollector(env, policy, steps)
    return ShardedCollector(env, policy, steps, num_shards=num_shards, num_workers=num_workers, seed=seed,
                            device=device, precision=precision, attention_backends=attention_backends)


def _base_env(env):
    return env.base_env if isinstance(env, TransformedEnv) else env


def shard_seed(seed: int, shard: int) -> int:
    """The seed of shard ``shard``'s environment and sampling generator (``rl.collection_shards >= 2``)."""
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


def collect_shard(env, policy, td: TensorDictBase, steps: int, torch_rng: torch.Tensor | None,
                  cuda_rng: tuple[int, torch.Tensor] | None = None) -> tuple[TensorDictBase, TensorDictBase, Any]:
    """Collect one shard's batch with the shard's own torch RNG state.

    ``torch_rng`` is the shard's CPU RNG state (``None``: draw from, and advance, the
    global RNG: the single stream of ``rl.collection_shards = 1``); ``cuda_rng``
    ``(device_index, state)`` its CUDA RNG state when the policy samples on a GPU. The
    global RNG states are restored afterwards. Runs in the caller's contexts (gradient
    mode, precision, attention kernels, module mode). Returns the batch, the episode state
    to continue from and the shard's advanced RNG states ``(torch_rng, cuda_rng)``.
    """
    if torch_rng is None:
        batch, td = collect_batch(env, policy, td, steps)
        return batch, td, (None, None)
    devices = [cuda_rng[0]] if cuda_rng is not None else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(torch_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng[1], cuda_rng[0])
        batch, td = collect_batch(env, policy, td, steps)
        torch_rng = torch.get_rng_state()
        if cuda_rng is not None:
            cuda_rng = (cuda_rng[0], torch.cuda.get_rng_state(cuda_rng[0]))
    return batch, td, (torch_rng, cuda_rng)


def _collect_in_worker(envs: list, policy, request: dict[str, Any]) -> list[dict[str, Any]]:
    """A worker's answer to one request: its shards collected one after the other.

    ``request``: ``state_dict`` (the policy's weights), ``steps``, ``precision``,
    ``attention_backends`` (``SDPBackend`` names) and ``shards``, one ``{td, env_rng,
    torch_rng}`` per environment in ``envs``; ``torch_rng`` ``None`` means the trainer's
    global RNG state ``global_rng`` (one shard). Returns per shard ``batch``, ``td``,
    ``env_rng`` and ``torch_rng`` after the batch.
    """
    policy.load_state_dict(request["state_dict"])
    backends = [getattr(SDPBackend, b) for b in request["attention_backends"]]
    results = []
    with torch.no_grad(), precision_context(request["precision"], "cpu"), \
            (sdpa_kernel(backends) if backends else contextlib.nullcontext()):
        for env, shard in zip(envs, request["shards"], strict=True):
            _base_env(env).set_rng_state(shard["env_rng"])
            if shard["torch_rng"] is None:
                torch.set_rng_state(request["global_rng"])
            batch, td, (torch_rng, _) = collect_shard(env, policy, shard["td"], request["steps"],
                                                      shard["torch_rng"])
            results.append({"batch": batch, "td": td, "env_rng": _base_env(env).get_rng_state(),
                            "torch_rng": torch.get_rng_state() if torch_rng is None else torch_rng})
    return results


def _worker_main(conn, payload: bytes, num_threads: int) -> None:
    """Worker process: hold some shards' environments and the policy; answer collect requests."""
    torch.set_num_threads(num_threads)
    envs, policy = torch.load(io.BytesIO(payload), weights_only=False)
    while True:
        request = conn.recv()
        if request is None:
            conn.close()
            return
        try:
            conn.send(_collect_in_worker(envs, policy, request))
        except Exception as error:  # handed to the trainer's process, which raises it
            conn.send(error)


class ShardedCollector:
    """Collection of ``num_shards`` shards, here or in ``num_workers`` processes (module doc)."""

    def __init__(self, env, policy, steps: int, *, num_shards: int, num_workers: int, seed: int, device: str,
                 precision: str, attention_backends=None):
        num_envs = _base_env(env).num_envs
        self.env, self.policy, self.steps = env, policy, steps
        self.num_shards, self.num_workers = num_shards, num_workers
        self.precision = precision
        self.attention_backends = [b.name for b in attention_backends or []]
        # The CUDA device whose RNG the policy samples from (sharded collection in this process).
        dev = torch.device(device)
        self._cuda_index = (dev.index if dev.index is not None else torch.cuda.current_device()) \
            if dev.type == "cuda" and torch.cuda.is_available() else None
        self.cuda_rngs: list[torch.Tensor] | None = None
        if num_shards == 1:
            self.shard_envs = [env]  # the trainer's own environment and global RNG (module doc)
            self.torch_rngs = None
        else:
            seeds = [shard_seed(seed, k) for k in range(num_shards)]
            self.shard_envs = [make_shard_env(env, num_envs // num_shards, s) for s in seeds]
            self.torch_rngs = [torch.Generator().manual_seed(s).get_state() for s in seeds]
            if self._cuda_index is not None:
                self.cuda_rngs = [self._seeded_cuda_state(s) for s in seeds]
        self._workers: list[tuple[Any, Any]] | None = None

    def _seeded_cuda_state(self, seed: int) -> torch.Tensor:
        with torch.random.fork_rng(devices=[self._cuda_index]), torch.cuda.device(self._cuda_index):
            torch.cuda.manual_seed(seed)
            return torch.cuda.get_rng_state(self._cuda_index)

    def _shards_of_worker(self, j: int) -> range:
        per_worker = self.num_shards // self.num_workers
        return range(j * per_worker, (j + 1) * per_worker)

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        threads = torch.get_num_threads()  # as in this process: identical rounding (module doc)
        self._workers = []
        for j in range(self.num_workers):
            buffer = io.BytesIO()
            torch.save(([self.shard_envs[k] for k in self._shards_of_worker(j)], self.policy), buffer)
            parent, child = context.Pipe()
            process = context.Process(target=_worker_main, args=(child, buffer.getvalue(), threads), daemon=True)
            process.start()
            child.close()
            self._workers.append((process, parent))

    def reset(self) -> TensorDictBase:
        if self.num_shards == 1:
            return self.env.reset()
        return torch.cat([shard_env.reset() for shard_env in self.shard_envs], dim=0)

    def collect(self, td: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        size = td.batch_size[0] // self.num_shards
        tds = [td[k * size:(k + 1) * size] for k in range(self.num_shards)]
        if self.num_workers == 0:
            batches, out_tds = [], []
            for k, (shard_env, shard_td) in enumerate(zip(self.shard_envs, tds)):
                cuda_rng = (self._cuda_index, self.cuda_rngs[k]) if self.cuda_rngs is not None else None
                batch, shard_td, (torch_rng, cuda_rng) = collect_shard(
                    shard_env, self.policy, shard_td, self.steps,
                    None if self.torch_rngs is None else self.torch_rngs[k], cuda_rng)
                if self.torch_rngs is not None:
                    self.torch_rngs[k] = torch_rng
                if cuda_rng is not None:
                    self.cuda_rngs[k] = cuda_rng[1]
                batches.append(batch)
                out_tds.append(shard_td)
            return torch.cat(batches, dim=0), torch.cat(out_tds, dim=0)
        return self._collect_in_workers(tds)

    def _collect_in_workers(self, tds: list[TensorDictBase]) -> tuple[TensorDictBase, TensorDictBase]:
        if self._workers is None:
            self._start()
        state_dict = {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}
        for j, (_, conn) in enumerate(self._workers):
            shards = [{"td": tds[k], "env_rng": _base_env(self.shard_envs[k]).get_rng_state(),
                       "torch_rng": None if self.torch_rngs is None else self.torch_rngs[k]}
                      for k in self._shards_of_worker(j)]
            conn.send({"state_dict": state_dict, "shards": shards, "steps": self.steps,
                       "precision": self.precision, "attention_backends": self.attention_backends,
                       "global_rng": torch.get_rng_state() if self.torch_rngs is None else None})
        results = []
        for j, (process, conn) in enumerate(self._workers):
            try:
                answer = conn.recv()
            except EOFError:
                raise RuntimeError(f"rollout worker {j} (pid {process.pid}) died, exit code {process.exitcode}") \
                    from None
            if isinstance(answer, Exception):
                raise RuntimeError(f"rollout worker {j} failed: {answer!r}") from answer
            for k, result in zip(self._shards_of_worker(j), answer, strict=True):
                _base_env(self.shard_envs[k]).set_rng_state(result["env_rng"])
                if self.torch_rngs is None:
                    torch.set_rng_state(result["torch_rng"])
                else:
                    self.torch_rngs[k] = result["torch_rng"]
                results.append(result)
        return torch.cat([r["batch"] for r in results], dim=0), torch.cat([r["td"] for r in results], dim=0)

    def state_dict(self) -> dict[str, Any] | None:
        """The shards' environment and torch RNG states (``None`` with one shard: the trainer's own)."""
        if self.torch_rngs is None:
            return None
        state = {"env_rng": [_base_env(e).get_rng_state() for e in self.shard_envs],
                 "torch_rng": [s.clone() for s in self.torch_rngs]}
        if self.cuda_rngs is not None:
            state["torch_cuda_rng"] = [s.clone() for s in self.cuda_rngs]
        return state

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`.

        Raises
        ------
        ValueError
            If ``state`` holds a different number of shards (naming ``rl.collection_shards``).
        """
        if self.torch_rngs is None and state is None:
            return
        saved = 1 if state is None else len(state["torch_rng"])
        if self.torch_rngs is None or saved != self.num_shards:
            raise ValueError(f"the checkpoint was collected with {saved} shard(s), but rl.collection_shards is "
                             f"{self.num_shards}")
        for shard_env, env_rng in zip(self.shard_envs, state["env_rng"], strict=True):
            _base_env(shard_env).set_rng_state(env_rng)
        self.torch_rngs = list(state["torch_rng"])
        if self.cuda_rngs is not None and state.get("torch_cuda_rng") is not None:
            self.cuda_rngs = list(state["torch_cuda_rng"])

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
