"""``pure_text_ei``: expert iteration — SFT on the rollouts that pass the selection (docs/behaviour.md#b34).

Verifiers: a proportion ``p_i`` (annealed, see :meth:`guess_replacement_proportion`) of the
rollouts, chosen with an rng seeded from sha256 of (seed, iteration, agent) (fixed, docs/behaviour.md#b22:
the original used Python's salted ``hash``), become examples whose last verifier message
is the correct decision; the rest go through the selection. Other agents: selection on all
rollouts. Selection is ``threshold`` (episode reward >= ``reward_threshold``) or
``weighted_sampling``.
"""

from __future__ import annotations

import numpy as np

from nip_core.environments.nested_array_dict import NestedArrayDict
from nip_core.trainers.pure_text_base import PureTextRlTrainer
from nip_core.trainers.pure_text_rollouts import stable_seed
from nip_core.trainers.pure_text_stats import episode_rewards
from nip_core.trainers.registry import register_trainer


def guess_replacement_proportion(p0: float, annealing: str, rate: float, iteration: int) -> float:
    """``p0`` annealed: none -> p0; linear -> max(p0 - i*rate, 0); exponential -> p0 (1-rate)^i."""
    if annealing == "linear":
        return max(p0 - iteration * rate, 0.0)
    if annealing == "exponential":
        return p0 * (1 - rate) ** iteration
    return p0


def select_rollouts(rewards: np.ndarray, method: str, params, rng: np.random.Generator) -> list[int]:
    """Indices of the rollouts kept for an agent with episode ``rewards``."""
    n = len(rewards)
    if n == 0:
        return []
    if method == "threshold":
        return [int(i) for i in np.nonzero(rewards >= params.reward_threshold)[0]]
    shifted = rewards - rewards.min() if params.weighting_minimum is None \
        else np.clip(rewards - params.weighting_minimum, 0, None)
    total = shifted.sum()
    w = shifted / total if total > 0 else np.full(n, 1.0 / n)
    w = w + params.weighting_epsilon / n
    w = w / w.sum()
    size = int(round(n * params.weighting_sample_size_factor))
    if not params.weighting_use_replacement:
        size = min(size, int((w > 0).sum()))
    return [int(i) for i in rng.choice(n, size=size, replace=params.weighting_use_replacement, p=w)]


@register_trainer("pure_text_ei")
class PureTextEiTrainer(PureTextRlTrainer):
    """Expert iteration on text rollouts."""

    trainer_name = "pure_text_ei"
    trainer_kind = "pure_text"
    needs_critic = False

    def guess_replacement_proportion(self, iteration: int) -> float:
        t = self.hyper_params.text_rl
        return guess_replacement_proportion(t.verifier_guess_replacement_proportion,
                                            t.verifier_guess_replacement_annealing,
                                            t.verifier_guess_replacement_annealing_rate, iteration)

    def agent_fine_tune_examples(self, agent: str, rollouts: list[NestedArrayDict]) -> list[dict]:
        """The SFT examples of ``agent`` from ``rollouts``."""
        i = self.state.iteration
        hp = self.hyper_params
        idx = self.agent_names.index(agent)
        rng = np.random.default_rng(stable_seed(hp.seed, i, agent))
        order = list(range(len(rollouts)))
        replaced: list[int] = []
        if agent == "verifier":
            order = [int(k) for k in rng.permutation(len(rollouts))]
            n_replace = int(self.guess_replacement_proportion(i) * len(rollouts))
            replaced, order = order[:n_replace], order[n_replace:]
        rewards = np.array([episode_rewards(rollouts[k])[idx] for k in order])
        chosen = [order[j] for j in select_rollouts(rewards, hp.pure_text_ei.rollout_selection_method,
                                                     hp.pure_text_ei, rng)]
        return (self.sft_examples(agent, [rollouts[k] for k in chosen])
                + self.sft_examples(agent, [rollouts[k] for k in replaced], replace_guess=True))
