"""Per-iteration statistics of a batch of environment steps (docs/behaviour.md#b15)."""

from __future__ import annotations

from tensordict import TensorDictBase


def episode_stats(batch: TensorDictBase, agent_names: list[str], verifier_index: int,
                  prefix: str = "") -> dict[str, float]:
    """Rewards, accuracy, decision rate and episode length of a ``(num_envs, steps)`` batch.

    * ``{agent}.{prefix}mean_step_reward``: mean reward per step;
    * ``{agent}.{prefix}mean_episode_reward``: summed reward / number of finished episodes;
    * ``{prefix}mean_accuracy``: fraction of finished episodes where the verifier decided
      and was right (time-outs count as wrong);
    * ``{prefix}decision_rate``: fraction of finished episodes ended by a decision;
    * ``{prefix}mean_episode_length``: rounds of finished episodes.
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
        if num_done:
            stats[f"{name}.{prefix}mean_episode_reward"] = float(reward[..., index].sum()) / num_done
    if num_done:
        decided = done & ~terminated
        stats[f"{prefix}mean_accuracy"] = float((decided & (decision == y)).sum()) / num_done
        stats[f"{prefix}decision_rate"] = float(decided.sum()) / num_done
        stats[f"{prefix}mean_episode_length"] = float(batch["next", "round"][done].float().mean())
    stats[f"{prefix}num_episodes"] = float(num_done)
    return stats
