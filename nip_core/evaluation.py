"""Evaluating a finished graph-isomorphism run on a dataset file (``nipflow evaluate``).

:func:`evaluate_run` loads the run's hyper-parameters and its final (newest) checkpoint,
builds the scenario on the file's pairs with the run's hyper-parameters, loads the
checkpointed agents into it and runs the test loop. The scenario is rebuilt for the
file's largest graph: the agents' learned weights do not depend on the node count, and
whatever does (the environment's specs, non-learned buffers of the agents such as
attention masks) comes from the rebuild. A learned tensor whose shape differs is refused,
naming the tensors.

Two modes, both deterministic for a given run, file and device:

``"pairs"`` (default)
    Every pair of the file is evaluated exactly once: one environment per pair, each run
    until its first episode ends; ``n`` is the number of pairs. Episode seeds come from
    the test environment's generator (seed ``seed + 1``, as in training) and sampling from
    the global RNGs seeded with the run's ``seed``.
``"test_loop"``
    The trainer's own test loop (``Trainer.test()``) with the run's batch sizes and
    ``rl.num_test_iterations``, from the global RNG state stored in the checkpoint: on the
    run's own test data this reproduces the run's test statistics exactly. ``n`` is the
    number of finished episodes (pairs may repeat or be left out).

For RL runs ``test_accuracy`` is the fraction of episodes the verifier ended with a
correct decision (``test_mean_decided_accuracy``: a time-out is wrong); the test loop's
``test_mean_accuracy`` is nip's, which scores a timed-out episode by the decision sampled at
its last step (docs/behaviour.md#b15). ``solo_agent`` runs: the solo agents' accuracy on
every pair (``"pairs"``), or on the trainer's own held-out split of the file
(``"test_loop"``); ``test_accuracy`` is the verifier's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from nip_core.errors import NipflowError
from nip_core.runs import RunStore
from nip_core.settings import ExperimentSettings, default_runs_dir, resolve_device

__all__ = ["EVALUATION_MODES", "EvaluationError", "evaluate_run", "format_evaluation", "load_agents_state"]

EVALUATION_MODES = ("pairs", "test_loop")


class EvaluationError(NipflowError):
    """A run or a dataset file cannot be evaluated (names the run or the file)."""


def load_agents_state(agents: nn.Module, saved: Mapping[str, torch.Tensor], *, source: str) -> list[str]:
    """Load checkpointed agent weights into agents built for another node count.

    Every learned parameter must be present with its shape. A *buffer* whose shape
    differs is not loaded: it is derived from the node count and the rebuilt module's own
    value is the right one.

    Parameters
    ----------
    agents : nn.Module
        The freshly built agents.
    saved : mapping
        The checkpoint's ``state_dict`` of the agents.
    source : str
        Named in errors (the checkpoint).

    Returns
    -------
    list[str]
        The buffers kept from the rebuilt module.

    Raises
    ------
    EvaluationError
        If tensors are missing or unexpected, or a learned tensor's shape differs.
    """
    current = agents.state_dict()
    learned = {name for name, _ in agents.named_parameters(remove_duplicate=False)}
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    reshaped, kept, to_load = [], [], {}
    for name, value in saved.items():
        if name not in current:
            continue
        if tuple(value.shape) != tuple(current[name].shape):
            if name in learned:
                reshaped.append(f"{name} {tuple(value.shape)} -> {tuple(current[name].shape)}")
            else:
                kept.append(name)
            continue
        to_load[name] = value
    problems = []
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected}")
    if reshaped:
        problems.append(f"learned tensors whose shape depends on the data: {reshaped}")
    if problems:
        raise EvaluationError(f"{source}: the checkpointed agents do not fit the rebuilt scenario: "
                              + "; ".join(problems))
    agents.load_state_dict(to_load, strict=False)
    return sorted(kept)


def _final_checkpoint(run) -> tuple[str, dict[str, Any]]:
    from nip_core.trainers.tensordict_checkpoints import CHECKPOINT_PATTERN, checkpoint_name

    iterations = sorted(int(m.group(1)) for name in run.list_checkpoints()
                        if (m := CHECKPOINT_PATTERN.match(name)))
    if not iterations:
        raise EvaluationError(f"run {run.run_id!r} has no checkpoint (looked in {run.location}/checkpoints)")
    return checkpoint_name(iterations[-1]), {"iteration": iterations[-1]}


def _eval_params(params, num_pairs: int, mode: str):
    """The run's parameters, with one environment per pair in ``"pairs"`` mode."""
    if mode == "test_loop":
        return params
    from nip_core.parameters import HyperParameters

    data = params.to_dict()
    data["rl"]["frames_per_batch"] = None
    data["rl"]["rollouts_per_iteration"] = num_pairs
    return HyperParameters.from_dict(data, stored=True)  # the run's own parameters, re-shaped


def evaluate_run(run_id: str, dataset_file: str | os.PathLike, runs_dir: str | None = None, *,
                 mode: str = "pairs", device: str = "cpu", transcripts: int = 0) -> dict[str, Any]:
    """Test the final checkpoint of a graph-isomorphism run on a dataset file.

    Parameters
    ----------
    run_id : str
        The run (graph isomorphism, a TensorDict RL trainer or ``solo_agent``).
    dataset_file : path
        A ``data.pt`` in the original library's format or nipflow's (the same layout with
        a ``config`` entry); graphs may be larger than the training data's.
    runs_dir : str, optional
        The run store (default ``$NIPFLOW_RUNS_DIR`` or ``./runs``).
    mode : {"pairs", "test_loop"}
        See the module docstring.
    device : str
        Torch device to compute on (``"auto"``: CUDA when available).
    transcripts : int
        ``"pairs"`` mode of an RL run: the episodes of the first ``transcripts`` isomorphic pairs
        and of the first ``transcripts`` non-isomorphic pairs of each WL score, as
        :func:`~nip_core.scenarios.graph_isomorphism.transcripts.episode_transcripts` gives them,
        under ``transcripts`` in the result.

    Returns
    -------
    dict
        ``run_id``, ``dataset_file``, ``trainer``, ``protocol``, ``mode``, ``checkpoint``,
        ``iteration``, ``num_pairs``, ``max_nodes`` (of the file), ``stats`` (what the test
        loop reports, ``test_``-prefixed, per agent ``{agent}.test_...``), in ``"pairs"``
        mode of RL runs ``accuracy_by_wl_score`` (``{score: [accuracy, count]}``), and
        ``test_accuracy`` and ``n`` (episodes or pairs evaluated).

    Raises
    ------
    EvaluationError
        A bad mode, a run of another scenario or trainer, a run without checkpoint, a
        dataset file that is missing or malformed (naming the file and the problem),
        or weights that do not fit.
    RunNotFoundError, CorruptCheckpointError
        From the run store; ``UnsafeCheckpointError`` (a ``CorruptCheckpointError``) for an
        old pickled checkpoint that cannot be loaded safely (names the file and the command
        that converts it).
    """
    from nip_core.scenarios.graph_isomorphism.build import build_graph_isomorphism
    from nip_core.scenarios.graph_isomorphism.original_format import read_dataset_file
    from nip_core.scenarios.graph_isomorphism.raw_data import GraphIsomorphismDataError
    from nip_core.trainers import get_trainer_class
    from nip_core.trainers.checkpoint_files import load_run_checkpoint, run_checkpoint_source
    from nip_core.trainers.tensordict_rl import TensorDictRlTrainer

    if mode not in EVALUATION_MODES:
        raise EvaluationError(f"unknown evaluation mode {mode!r}; choose one of {list(EVALUATION_MODES)}")
    if transcripts < 0 or (transcripts and mode != "pairs"):
        raise EvaluationError(f"transcripts: {transcripts} pairs per class; transcripts need a count >= 0 and "
                              "mode 'pairs'")
    try:
        device_name = resolve_device(device)  # DeviceUnavailableError: no such CUDA device here
    except ValueError as error:
        raise EvaluationError(f"device: {error}") from None
    store = RunStore(runs_dir or default_runs_dir())
    params = store.load_params(run_id)
    if params.scenario != "graph_isomorphism":
        raise EvaluationError(f"run {run_id!r} is a {params.scenario} run; evaluate supports graph_isomorphism "
                              "runs only")
    cls = get_trainer_class(params.trainer)
    solo = params.trainer == "solo_agent"
    if solo and transcripts:
        raise EvaluationError(f"transcripts: run {run_id!r} is a solo_agent run, whose agents exchange no messages")
    if not solo and not issubclass(cls, TensorDictRlTrainer):
        raise EvaluationError(f"run {run_id!r}: trainer {params.trainer!r} is not a TensorDict trainer; "
                              "evaluate supports vanilla_ppo, spg, reinforce and solo_agent runs")
    run = store.open_run(run_id)
    name, info = _final_checkpoint(run)
    try:
        dataset = read_dataset_file(dataset_file)
    except GraphIsomorphismDataError as error:
        raise EvaluationError(str(error)) from None

    hp = _eval_params(params, len(dataset), mode) if not solo else params
    settings = ExperimentSettings(use_wandb=False, show_progress=False, device=device_name, runs_dir=store.base)
    state, _ = load_run_checkpoint(run, name, map_location=device_name)  # never unpickles the file
    scenario = build_graph_isomorphism(hp, settings, trainer_type=cls.trainer_type, train_dataset=dataset,
                                       test_dataset=dataset)
    trainer = cls(hp, scenario, settings, run=None)
    source = run_checkpoint_source(run, name)
    try:
        load_agents_state(trainer.agents, state["agents"], source=source)
        if solo:
            stats, n, accuracy = _evaluate_solo(trainer, len(dataset), mode)
            extra: dict[str, Any] = {}
        else:
            stats, n, accuracy, extra = _evaluate_rl(trainer, state, dataset, mode, transcripts)
    finally:
        trainer.close()
    return {
        "run_id": run_id, "dataset_file": str(dataset_file), "trainer": params.trainer,
        "protocol": params.interaction_protocol, "mode": mode, "checkpoint": name,
        "iteration": info["iteration"], "num_pairs": len(dataset), "max_nodes": int(dataset.max_nodes),
        "stats": stats, **extra, "test_accuracy": accuracy, "n": n,
    }


def _evaluate_solo(trainer, num_pairs: int, mode: str) -> tuple[dict[str, float], int, float]:
    verifier = trainer.protocol_handler.verifier_names[0]
    if verifier not in trainer.solo_names:
        raise EvaluationError(f"solo_agent run has no trained verifier (solo agents: {trainer.solo_names})")
    if mode == "pairs":
        trainer.test_indices = torch.arange(num_pairs)
    stats = trainer.test()
    return stats, int(trainer.test_indices.numel()), float(stats[f"{verifier}.test_accuracy"])


def _evaluate_rl(trainer, state, dataset, mode: str, transcripts: int = 0):
    from torch.nn.attention import sdpa_kernel
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    from nip_core.environments.episode_stats import episode_stats
    from nip_core.environments.rollouts import collect_batch
    from nip_core.trainers.base import set_global_seed

    # The observation normaliser of the run's test environment (scalar statistics).
    transform = getattr(trainer.test_env, "transform", None)
    if transform is not None and state.get("test_transform") is not None:
        transform.load_state_dict(state["test_transform"])
    if mode == "test_loop":
        trainer.set_rng_states(state["rng"])
        stats = trainer.test()
        if "test_mean_decided_accuracy" not in stats:
            raise EvaluationError(f"no test episode finished in {trainer.hyper_params.rl.num_test_iterations} "
                                  f"test iteration(s) of {trainer.steps_per_env} steps; use mode 'pairs'")
        return stats, int(stats["test_num_episodes"]), float(stats["test_mean_decided_accuracy"]), {}

    hp = trainer.hyper_params
    set_global_seed(hp.seed)
    max_steps = trainer.protocol_handler.max_message_rounds + 1
    greedy = ExplorationType.DETERMINISTIC if hp.rl.test_greedy else ExplorationType.RANDOM
    trainer.agents.eval()
    batches, total = [], 0
    with torch.no_grad(), sdpa_kernel(trainer.attention_backends), set_exploration_type(greedy):
        td = trainer.test_env.reset()
        finished = torch.zeros(td.batch_size[0], dtype=torch.bool, device=td.device)
        while not bool(finished.all()) and total < max_steps:
            batch, td = collect_batch(trainer.test_env, trainer.policy_operator, td, trainer.steps_per_env)
            batches.append(batch)
            total += trainer.steps_per_env
            finished |= batch["next", "done"].reshape(batch.batch_size).any(-1)
    if not bool(finished.all()):
        raise EvaluationError(f"{int((~finished).sum())} of {finished.numel()} episodes did not end within "
                              f"{total} steps")
    batch = torch.cat(batches, dim=1).cpu()
    done = batch["next", "done"].reshape(batch.batch_size)
    first = (done.long().cumsum(1) - done.long()) == 0  # steps up to the first episode's end
    ends = done & first
    masked = batch.clone()
    masked.set(("next", "done"), ends.reshape(masked["next", "done"].shape))
    reward = batch["next", "agents", "reward"]
    masked.set(("next", "agents", "reward"), reward * first[..., None, None].to(reward.dtype))
    stats = episode_stats(masked, trainer.agent_names, trainer.verifier_index, prefix="test_")
    flat_reward = reward.squeeze(-1)[first]  # (steps of first episodes, agents)
    for index, agent in enumerate(trainer.agent_names):
        stats[f"{agent}.test_mean_step_reward"] = float(flat_reward[:, index].mean())
    ids = batch["datapoint_id"][ends]
    if sorted(ids.tolist()) != list(range(len(dataset))):
        raise EvaluationError("internal error: the evaluated episodes do not cover every pair exactly once")
    decision = batch["agents", "decision"][..., trainer.verifier_index][ends]
    correct = (decision == batch["y"][ends]) & ~batch["next", "terminated"].reshape(batch.batch_size)[ends]
    scores = dataset.tensordict["wl_score"][ids]
    by_score = {}
    for score in sorted(set(scores.tolist())):
        selected = scores == score
        by_score[str(score)] = [int(correct[selected].sum()) / int(selected.sum()), int(selected.sum())]
    accuracy = float(stats["test_mean_decided_accuracy"])
    if not math.isclose(accuracy, int(correct.sum()) / len(dataset), abs_tol=1e-9):
        raise EvaluationError("internal error: per-pair accuracy disagrees with the test statistics")
    extra: dict[str, Any] = {"accuracy_by_wl_score": by_score}
    if transcripts:
        from nip_core.scenarios.graph_isomorphism.transcripts import episode_transcripts

        extra["transcripts"] = episode_transcripts(batch, ends, first, trainer.protocol_handler, trainer.agent_names,
                                                   trainer.verifier_index, dataset.tensordict["wl_score"],
                                                   transcripts)
    return stats, int(stats["test_num_episodes"]), accuracy, extra


def format_evaluation(result: Mapping[str, Any]) -> str:
    """A human-readable table of :func:`evaluate_run`'s result; the last line is
    ``test_accuracy=<float> n=<int>``."""
    lines = [
        f"run {result['run_id']} ({result['trainer']}, protocol {result['protocol']}), "
        f"checkpoint {result['checkpoint']}",
        f"dataset {result['dataset_file']}: {result['num_pairs']} pairs, up to {result['max_nodes']} nodes; "
        f"mode {result['mode']}",
        "",
    ]
    stats = result["stats"]
    width = max((len(key) for key in stats), default=0)
    for key in sorted(stats):
        lines.append(f"  {key:<{width}}  {stats[key]:.6g}")
    by_score = result.get("accuracy_by_wl_score")
    if by_score:
        lines.append("")
        lines.append("  accuracy by WL score (-1: isomorphic):")
        for score, (accuracy, count) in by_score.items():
            lines.append(f"    {score:>3}  {accuracy:.4f}  ({count} pairs)")
    if result.get("transcripts"):
        from nip_core.scenarios.graph_isomorphism.transcripts import format_transcript

        lines.append("")
        lines.append("  transcripts (round, agent, graph:node):")
        lines.extend(f"    {format_transcript(t)}" for t in result["transcripts"])
    lines.append(f"test_accuracy={result['test_accuracy']} n={result['n']}")
    return "\n".join(lines)
