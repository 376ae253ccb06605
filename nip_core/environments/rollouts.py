"""Collecting batches of steps from a ``TensorDictEnvironment``, and observation normalisation.

The trainers collect with :func:`collect_batch` rather than TorchRL's ``Collector``: the
collector keeps the carried-over episode tensordict (the state of episodes that straddle
two batches) private, and a resumable trainer must save exactly that tensordict in its
checkpoint for a resumed run to see the same next batch. The loop is TorchRL's own
``step_and_maybe_reset`` (auto-reset of finished episodes), so the batch layout is the
collector's: ``(num_envs, steps)`` with a ``next`` sub-tensordict.
"""

from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDictBase
from torchrl.envs import Compose, EnvBase, ObservationNorm, TransformedEnv

NORMALIZED_KEYS = ("x", "message")


def collect_batch(env: EnvBase, policy: Callable[[TensorDictBase], TensorDictBase], td: TensorDictBase,
                  steps: int) -> tuple[TensorDictBase, TensorDictBase]:
    """Run ``steps`` steps of ``policy`` in ``env`` from ``td``.

    Returns
    -------
    batch
        ``(num_envs, steps)`` tensordict of the steps (actions, ``next`` observations,
        rewards, done flags).
    td
        The state to continue from (finished episodes already reset).
    """
    frames = []
    for _ in range(steps):
        policy(td)
        step_td, td = env.step_and_maybe_reset(td)
        frames.append(step_td.clone())
    return torch.stack(frames, dim=1).contiguous(), td


def random_observation_stats(env: EnvBase, num_steps: int, keys=NORMALIZED_KEYS) -> dict[str, tuple[float, float]]:
    """Scalar ``(mean, std)`` of each key over ``num_steps`` steps of uniformly random actions."""
    td = env.reset()
    values: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for _ in range(num_steps):
        td = env.rand_action(td)
        step_td, td = env.step_and_maybe_reset(td)
        for k in keys:
            values[k].append(step_td["next", k].reshape(-1))
    stats = {}
    for k in keys:
        flat = torch.cat(values[k])
        stats[k] = (float(flat.mean()), max(float(flat.std()), 1e-6))
    return stats


def normalized_env(env: EnvBase, stats: dict[str, tuple[float, float]]) -> TransformedEnv:
    """``env`` with an ``ObservationNorm`` per key (``(value - mean) / std``)."""
    transforms = [ObservationNorm(loc=torch.tensor(mean), scale=torch.tensor(std), in_keys=[k],
                                  standard_normal=True) for k, (mean, std) in stats.items()]
    return TransformedEnv(env, Compose(*transforms))
