"""Per-iteration statistics of a batch of environment steps (docs/behaviour.md#b15).

The names that nip uses mean what they mean in nip (its ``_get_log_stats`` of the
TensorDict trainers): statistics of *finished* episodes — an episode that ends with a
``done`` step inside the batch (a decision or a time-out); steps of an episode still
running at the end of the batch are left out. nipflow's own statistics carry names nip
does not use.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


def _grouped_means(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` (n,) or (n, k) per distinct value of ``groups`` (n,), groups in sorted order."""
    _, inverse = torch.unique(groups, return_inverse=True)
    count = torch.bincount(inverse).to(values.dtype)
    sums = torch.zeros((len(count), *values.shape[1:]), dtype=values.dtype).index_add_(0, inverse, values)
    return sums / (count if values.dim() == 1 else count[:, None])


def episode_stats(batch: TensorDictBase, agent_names: list[str], verifier_index: int,
                  prefix: str = "") -> dict[str, float]:
    """Rewards, accuracy, decision rate and episode length of a ``(num_envs, steps)`` batch.

    As nip computes them:

    * ``{agent}.{prefix}mean_step_reward``: mean reward over all steps of the batch;
    * ``{agent}.{prefix}mean_episode_reward``: mean over finished episodes of the reward
      summed over the episode's steps in the batch;
    * ``{agent}.{prefix}worst_episode_reward``: the least, over datapoints, of the mean
      episode reward of the datapoint's finished episodes;
    * ``{prefix}mean_accuracy`` / ``std_accuracy`` (unbiased): whether the verifier's
      decision sampled at an episode's last step equals the label, over finished episodes.
      An episode that times out is scored by the decision sampled at its last step although
      the protocol ignored it there (a ``continue`` is wrong; a guess it was not allowed to
      make counts as made);
    * ``{prefix}mean_datapoint_accuracy`` / ``std_datapoint_accuracy`` /
      ``worst_datapoint_accuracy``: the accuracy per datapoint, then its mean, unbiased std
      and least value over the datapoints;
    * ``{prefix}mean_episode_length``: rounds of the finished episodes (last round + 1).

    nipflow's own:

    * ``{prefix}mean_decided_accuracy``: the fraction of finished episodes that the
      verifier ended with a correct decision (a time-out is wrong, whatever was sampled);
    * ``{prefix}decision_rate``: the fraction of finished episodes ended by a decision;
    * ``{prefix}num_episodes``: the number of finished episodes.

    Statistics of finished episodes are left out when none finished.
    """
    reward = batch["next", "agents", "reward"].squeeze(-1)  # (B, T, A)
    done = batch["next", "done"].squeeze(-1)  # (B, T)
    terminated = batch["next", "terminated"].squeeze(-1)
    decision = batch["agents", "decision"][..., verifier_index]
    y = batch["y"]
    num_done = int(done.sum())
    stats: dict[str, float] = {}
    for index, name in enumerate(agent_names):
        stats[f"{name}.{prefix}mean_step_reward"] = float(reward[..., index].mean())
    stats[f"{prefix}num_episodes"] = float(num_done)
    if not num_done:
        return stats

    # The steps of finished episodes: those at or before the last done of their row. Each
    # gets its episode's key (row, number of dones before it); keys sort like done.nonzero().
    rows, steps = done.shape
    finished = done.flip(-1).long().cumsum(-1).flip(-1) > 0
    episode = done.long().cumsum(-1) - done.long()
    key = (torch.arange(rows, device=done.device)[:, None] * (steps + 1) + episode)[finished]
    _, inverse = torch.unique(key, return_inverse=True)
    episode_reward = torch.zeros((num_done, reward.shape[-1]), dtype=torch.float64).index_add_(
        0, inverse.cpu(), reward[finished].double().cpu())
    datapoint = batch["datapoint_id"][done].cpu()
    worst_reward = _grouped_means(episode_reward, datapoint).min(0).values
    for index, name in enumerate(agent_names):
        stats[f"{name}.{prefix}mean_episode_reward"] = float(episode_reward[:, index].mean())
        stats[f"{name}.{prefix}worst_episode_reward"] = float(worst_reward[index])

    correct = (decision[done] == y[done]).double().cpu()
    stats[f"{prefix}mean_accuracy"] = float(correct.mean())
    stats[f"{prefix}std_accuracy"] = float(correct.std())
    per_datapoint = _grouped_means(correct, datapoint)
    stats[f"{prefix}mean_datapoint_accuracy"] = float(per_datapoint.mean())
    stats[f"{prefix}std_datapoint_accuracy"] = float(per_datapoint.std())
    stats[f"{prefix}worst_datapoint_accuracy"] = float(per_datapoint.min())

    decided = done & ~terminated
    stats[f"{prefix}mean_decided_accuracy"] = float((decided & (decision == y)).sum()) / num_done
    stats[f"{prefix}decision_rate"] = float(decided.sum()) / num_done
    stats[f"{prefix}mean_episode_length"] = float((batch["round"][done] + 1).double().mean())
    return stats


def loss_stats(mean_loss_vals: TensorDictBase, agent_names: list[str], prefix: str = "",
               critic_coef: float | None = None) -> dict[str, float]:
    """The mean losses of an iteration as nip logs them.

    ``{prefix}{key}`` for each entry (an entry with several values, such as SPG's
    ``loss_matrix``, is summed), ``{prefix}{agent}.{key}`` for each per-agent entry under
    ``agents`` (its value for that agent), and ``{prefix}loss_critic_unscaled``: the
    ``loss_critic`` divided by ``critic_coef`` when the loss module has one.
    """
    stats: dict[str, float] = {}
    for key, value in mean_loss_vals.items(include_nested=True, leaves_only=True):
        if isinstance(key, tuple) and key[0] == "agents":
            name = ".".join(key[1:])
            for index, agent in enumerate(agent_names):
                stats[f"{prefix}{agent}.{name}"] = float(value[..., index].float().mean())
        else:
            stats[f"{prefix}{'.'.join(key) if isinstance(key, tuple) else key}"] = float(value.float().sum())
    if critic_coef and "loss_critic" in mean_loss_vals.keys():
        stats[f"{prefix}loss_critic_unscaled"] = float(mean_loss_vals["loss_critic"]) / critic_coef
    return stats
