"""Per-iteration statistics, transcripts and fine-tune examples of pure-text rollouts."""

from __future__ import annotations

from typing import Any

import numpy as np

from nip_core.environments.nested_array_dict import NestedArrayDict
from nip_core.scenarios.code_validation.text_protocols import build_chat_messages
from nip_core.trainers.pure_text_rollouts import history_of


class NoAssistantMessageError(ValueError):
    """A rollout in which the agent never spoke (it gives no fine-tune example)."""


def last_index(rollout: NestedArrayDict) -> int:
    """Index of the last real (non-padding) timestep."""
    real = np.nonzero(~rollout["padding"].astype(bool))[0]
    return int(real[-1]) if len(real) else 0


def verifier_decision(rollout: NestedArrayDict, verifier_index: int) -> int:
    t = last_index(rollout)
    if bool(rollout["next.terminated"][t]):
        return 2
    return int(rollout["agents.decision"][t, verifier_index])


def episode_rewards(rollout: NestedArrayDict) -> np.ndarray:
    return rollout["next.agents.reward"].sum(axis=0)


def rollout_stats(rollouts: list[NestedArrayDict], agent_names: list[str], verifier_index: int,
                  prefix: str = "") -> dict[str, float]:
    """The statistics of nip's pure-text ``_get_log_stats``, computed as nip computes them.

    Per agent: ``mean``/``std_episode_reward`` (reward summed over the rounds; std with
    ddof 0), ``retry_proportion`` and ``token_limit_proportion`` (the mean retry count and
    token-limit flag over every channel of the timesteps whose ``done`` is false: padding
    after a termination included, as nip's pure-text ``done`` excludes termination).
    Overall, from each rollout's last timestep: ``mean``/``std_episode_length`` (messages on
    channel 0), ``mean``/``std_accuracy`` (a terminated episode decided ``2``: wrong),
    ``worst_datapoint_accuracy``, per class ``mean``/``std_{0,1}_accuracy``,
    ``mean``/``std_decision``, ``precision`` = TP/(TP+FP) and ``recall`` = TP/(TP+FN) (a
    time-out is neither). A statistic nip would log as NaN (no rollout of a class, no
    positive decision) is left out. See docs/behaviour.md#b15.

    nipflow adds ``valid_decision_rate``: the share of rollouts in which the verifier
    accepted or rejected (the rest ran out of rounds, or its replies stayed invalid).
    """
    stats: dict[str, float] = {}
    if not rollouts:
        return stats
    rewards = np.stack([episode_rewards(r) for r in rollouts])
    running = np.concatenate([~r["done"].astype(bool) for r in rollouts])
    for i, agent in enumerate(agent_names):
        stats[f"{agent}.{prefix}mean_episode_reward"] = float(rewards[:, i].mean())
        stats[f"{agent}.{prefix}std_episode_reward"] = float(rewards[:, i].std())
        retries = np.concatenate([r["agents.retry_count"][:, i] for r in rollouts])[running]
        limited = np.concatenate([r["agents.token_limit"][:, i] for r in rollouts])[running]
        stats[f"{agent}.{prefix}retry_proportion"] = float(retries.mean())
        stats[f"{agent}.{prefix}token_limit_proportion"] = float(limited.astype(float).mean())
    lengths = np.array([int((r["next.message_history"][-1][:, 0] != None).sum())  # noqa: E711
                        for r in rollouts])
    stats[f"{prefix}mean_episode_length"] = float(lengths.mean())
    stats[f"{prefix}std_episode_length"] = float(lengths.std())
    decisions = np.array([verifier_decision(r, verifier_index) for r in rollouts])
    y = np.array([int(r["y"][0]) for r in rollouts])
    correct = decisions == y
    stats[f"{prefix}valid_decision_rate"] = float((decisions != 2).mean())
    stats[f"{prefix}mean_accuracy"] = float(correct.mean())
    stats[f"{prefix}std_accuracy"] = float(correct.std())
    datapoints = np.array([int(r["datapoint_id"][0]) for r in rollouts])
    stats[f"{prefix}worst_datapoint_accuracy"] = float(min(correct[datapoints == d].mean()
                                                          for d in np.unique(datapoints)))
    for label in (0, 1):
        if (y == label).any():
            stats[f"{prefix}mean_{label}_accuracy"] = float(correct[y == label].mean())
            stats[f"{prefix}std_{label}_accuracy"] = float(correct[y == label].std())
    stats[f"{prefix}mean_decision"] = float(decisions.mean())
    stats[f"{prefix}std_decision"] = float(decisions.std())
    tp = int(((decisions == 1) & (y == 1)).sum())
    fp = int(((decisions == 1) & (y == 0)).sum())
    fn = int(((decisions == 0) & (y == 1)).sum())
    if tp + fp:
        stats[f"{prefix}precision"] = tp / (tp + fp)
    if tp + fn:
        stats[f"{prefix}recall"] = tp / (tp + fn)
    return stats


def accuracy_by_kind(rollouts: list[NestedArrayDict], verifier_index: int, kinds: list[str | None],
                     prefix: str = "") -> dict[str, float]:
    """``{prefix}accuracy_by_kind.<kind>``: the verifier's accuracy over the rollouts of each kind.

    ``kinds[k]`` is the kind of ``rollouts[k]``'s datapoint (code validation: the mutation
    that made the solution buggy, or ``correct``); rollouts of kind None are left out.
    ``{prefix}count_by_kind.<kind>`` says how many rollouts each accuracy is over.
    """
    if len(kinds) != len(rollouts):
        raise ValueError(f"{len(kinds)} kinds for {len(rollouts)} rollouts")
    correct: dict[str, list[bool]] = {}
    for rollout, kind in zip(rollouts, kinds):
        if kind is not None:
            correct.setdefault(kind, []).append(verifier_decision(rollout, verifier_index) == int(rollout["y"][0]))
    stats: dict[str, float] = {}
    for kind in sorted(correct):
        stats[f"{prefix}accuracy_by_kind.{kind}"] = float(np.mean(correct[kind]))
        stats[f"{prefix}count_by_kind.{kind}"] = float(len(correct[kind]))
    return stats


def raw_transcript(rollout: NestedArrayDict, agent_names: list[str]) -> dict[str, Any]:
    """``{transcript: [{agent: raw}], y, question, solution, prover_stance, reward}``."""
    t = last_index(rollout)
    raw = rollout["next.raw_message_history"][t]
    rounds = []
    for r in range(raw.shape[0]):
        said = {a: raw[r, i] for i, a in enumerate(agent_names) if raw[r, i] is not None}
        if not said:
            break
        rounds.append(said)
    rewards = episode_rewards(rollout)
    return {"transcript": rounds, "y": int(rollout["y"][0]), "question": str(rollout["question"][0]),
            "solution": str(rollout["solution"][0]), "prover_stance": int(rollout["prover_stance"][0]),
            "reward": {a: float(rewards[i]) for i, a in enumerate(agent_names)}}


def fine_tune_messages(handler: Any, protocol: str, agent: str, rollout: NestedArrayDict,
                       max_response_words: int, replace_guess: bool = False) -> list[dict[str, str]]:
    """The chat example of ``agent`` from the whole rollout, ending on its own last reply.

    Raises
    ------
    NoAssistantMessageError
        If the agent said nothing in the rollout.
    """
    t = last_index(rollout)
    hist = history_of(rollout[t], prefix="next.")
    messages = build_chat_messages(handler, protocol, agent, hist, max_response_words=max_response_words)
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    if not messages:
        raise NoAssistantMessageError(f"agent {agent} never replied in the rollout of datapoint "
                                      f"{int(rollout['datapoint_id'][0])}")
    if replace_guess:
        label = int(rollout["y"][0])
        messages[-1] = {"role": "assistant", "content": "Decision: accept" if label == 1 else "Decision: reject"}
    return messages
