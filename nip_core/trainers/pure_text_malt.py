"""``pure_text_malt``: MALT (Motwani et al. 2024) — DPO on response trees (docs/behaviour.md#b35).

Sampling. Iteration ``i`` takes the same datapoints and episode seeds as ``pure_text_ei``
(``rollouts_per_iteration`` datapoints from :func:`datapoint_indices`), but each datapoint
gives a response **tree** instead of one rollout: from the reset state (the root), at every
round each unfinished node gets ``k = pure_text_malt.num_responses_per_timestep`` children,
each child being one full environment step (every active agent replies); a finished node
gets one padding child. Every root-to-leaf path (depth ``max_rounds``) is one rollout, laid
out exactly as an EI rollout, so a tree gives at most ``k ** max_rounds`` rollouts. Children
differ because every API call of a child gets its seed re-derived with :func:`stable_seed`
from the seed the actor would use (env seed, datapoint, round, agent, retry) and the
child's node id. The API calls of all the trees of a level run in one thread pool of
``settings.max_concurrent_requests`` workers.

Node ids use heap numbering: the root is 0 and the children of node ``n`` are
``n*k + 1 .. n*k + k`` (a padding child is ``n*k + 1``), so ids are unique within a tree.
(The original offset ids by ``datapoint_id * (k*num_agents)**(max_rounds+1)`` to make them
global; that collides when a datapoint appears twice in an iteration or when rollouts of
several iterations are combined, so trees are keyed by ``(malt.iteration, malt.tree)``
instead.) Extra per-timestep fields, all computed from the rollouts
(:func:`annotate_trees`) and saved with them, so that a resumed run needs nothing else:

* ``malt.iteration``, ``malt.tree`` (position of the tree in its iteration),
  ``malt.node_id`` (the node this timestep leads to), ``malt.parent_id`` (the node the
  timestep was sampled at: its *decision point*);
* ``agents.expected_reward`` / ``agents.is_positive_example`` (rounds, agents) of the node;
* ``agents.decision_has_pair``, ``agents.decision_positive_child``,
  ``agents.decision_negative_child`` (rounds, agents): about the decision point (the
  timestep's pre-step state, shared by its siblings): whether the siblings hold a positive
  and a negative example for the agent, and the node ids of the pair sampled (-1 if none).
  Storing this on the children rather than on the node (as the original did) lets the
  root be a decision point too: the original never trained on round-0 replies.

Expected reward (deliberate deviation, documented): ``E(n) = r(n) + mean_{c} E(c)`` over
the children of ``n`` (``E = r`` for a leaf), i.e. each child, an independent sample of
the current policy from the same state, weighs the same. The original summed the rewards
of all descendants plus the node's own reward once and divided by the number of leaves,
which over-weighs subtrees that ran longer and under-counts a node's own reward.
``is_positive_example = E >= protocol.reward_mid_point_estimate(agent)``. The pair of a
decision point is drawn with an rng seeded by ``stable_seed(seed, env seed, iteration,
tree, decision point, agent)`` (sha256, never Python's ``hash``).

Fine-tuning. For each group member, a decision point gives one DPO example when the agent
has a pair there, is active in that round and gave two different replies in the sampled
children (the same reply twice, the later steps having made the difference, teaches DPO
nothing and is skipped): the
prompt the agent saw, the preferred reply (positive child), the non-preferred reply
(negative child).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from nip_core.environments.nested_array_dict import NestedArrayDict, stack_nested_array_dicts
from nip_core.trainers.pure_text_base import PureTextRlTrainer
from nip_core.trainers.pure_text_rollouts import TextActor, datapoint_indices, stable_seed
from nip_core.trainers.registry import register_trainer

ROOT_ID = 0
NO_NODE = -1

# -- the tree arithmetic (pure functions, unit-tested on hand-made trees) ----------------------


def child_ids(node_id: int, k: int) -> list[int]:
    """Heap numbering: the ``k`` children of ``node_id`` (the first one is the padding child)."""
    return [node_id * k + j + 1 for j in range(k)]


def expected_rewards(parent: dict[int, int], reward: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """``E(n) = r(n) + mean over children c of E(c)`` for every node (not the root).

    Parameters
    ----------
    parent
        Node id -> parent id (the root, ``0``, is not a key).
    reward
        Node id -> the step reward of each agent, shape (agents,).
    """
    children: dict[int, list[int]] = defaultdict(list)
    for n, p in parent.items():
        children[p].append(n)
    out: dict[int, np.ndarray] = {}

    def visit(n: int) -> np.ndarray:  # depth <= max_rounds, recursion is fine
        if n not in out:
            below = [visit(c) for c in children.get(n, [])]
            own = np.asarray(reward[n], dtype=np.float64)
            out[n] = own + (np.mean(below, axis=0) if below else 0.0)
        return out[n]

    for n in parent:
        visit(n)
    return out


def positive_labels(expected: dict[int, np.ndarray], thresholds: np.ndarray) -> dict[int, np.ndarray]:
    """``E(n) >= threshold`` per agent."""
    return {n: np.asarray(e) >= thresholds for n, e in expected.items()}


@dataclass
class DecisionPair:
    """For one decision point: per agent, whether there is a pair, and the sampled child ids."""

    has_pair: np.ndarray  # (agents,) bool
    positive: np.ndarray  # (agents,) int, -1 = none
    negative: np.ndarray  # (agents,) int, -1 = none


def sample_pairs(parent: dict[int, int], positive: dict[int, np.ndarray],
                 rng_for: Callable[[int, int], np.random.Generator]) -> dict[int, DecisionPair]:
    """Per decision point (every node with children, the root included) the sampled pairs.

    ``rng_for(decision_point, agent_index)`` gives the generator used to draw one positive
    and one negative child (uniformly, children in id order) where both kinds exist.
    """
    children: dict[int, list[int]] = defaultdict(list)
    for n, p in parent.items():
        children[p].append(n)
    out = {}
    for p, kids in children.items():
        kids = sorted(kids)
        a = len(positive[kids[0]])
        has = np.zeros(a, dtype=bool)
        pos = np.full(a, NO_NODE, dtype=np.int64)
        neg = np.full(a, NO_NODE, dtype=np.int64)
        for i in range(a):
            good = [c for c in kids if positive[c][i]]
            bad = [c for c in kids if not positive[c][i]]
            if good and bad:
                rng = rng_for(p, i)
                has[i] = True
                pos[i] = good[int(rng.integers(len(good)))]
                neg[i] = bad[int(rng.integers(len(bad)))]
        out[p] = DecisionPair(has, pos, neg)
    return out


# -- reading trees back from rollouts ---------------------------------------------------------


def tree_key(rollout: NestedArrayDict) -> tuple[int, int]:
    return int(rollout["malt.iteration"][0]), int(rollout["malt.tree"][0])


def unique_nodes(rollouts: list[NestedArrayDict]) -> dict[tuple[int, int], dict[int, tuple[int, int]]]:
    """Tree key -> node id -> ``(rollout index, round)`` of its first occurrence."""
    out: dict[tuple[int, int], dict[int, tuple[int, int]]] = defaultdict(dict)
    for r, rollout in enumerate(rollouts):
        nodes = out[tree_key(rollout)]
        for t, n in enumerate(rollout["malt.node_id"]):
            nodes.setdefault(int(n), (r, t))
    return out


def annotate_trees(rollouts: list[NestedArrayDict], thresholds: np.ndarray, seed: int) -> None:
    """Compute and write the expected-reward and pair fields of every timestep (in place)."""
    for key, nodes in unique_nodes(rollouts).items():
        parent = {n: int(rollouts[r]["malt.parent_id"][t]) for n, (r, t) in nodes.items()}
        reward = {n: rollouts[r]["next.agents.reward"][t] for n, (r, t) in nodes.items()}
        expected = expected_rewards(parent, reward)
        positive = positive_labels(expected, thresholds)
        r0, t0 = next(iter(nodes.values()))
        env_seed = int(rollouts[r0]["seed"][t0])
        pairs = sample_pairs(parent, positive, lambda p, i: np.random.default_rng(
            stable_seed(seed, env_seed, key[0], key[1], p, i)))
        for r in {r for r, _ in nodes.values()}:
            rollout = rollouts[r]
            ids = [int(n) for n in rollout["malt.node_id"]]
            pars = [parent[n] for n in ids]
            rollout["agents.expected_reward"] = np.stack([expected[n] for n in ids]).astype(np.float64)
            rollout["agents.is_positive_example"] = np.stack([positive[n] for n in ids]).astype(bool)
            rollout["agents.decision_has_pair"] = np.stack([pairs[p].has_pair for p in pars])
            rollout["agents.decision_positive_child"] = np.stack([pairs[p].positive for p in pars])
            rollout["agents.decision_negative_child"] = np.stack([pairs[p].negative for p in pars])


def tree_stats(rollouts: list[NestedArrayDict], agent_names: list[str]) -> dict[str, float]:
    """Per agent mean expected reward and positive rate over the real (non-padding) nodes,
    and has-pair rate over the decision points; each averaged within a tree, then over trees."""
    exp, posr, pair, sizes, leaves = [], [], [], [], defaultdict(int)
    for rollout in rollouts:
        leaves[tree_key(rollout)] += 1
    for key, nodes in unique_nodes(rollouts).items():
        real = [(r, t) for r, t in nodes.values() if not bool(rollouts[r]["padding"][t])]
        if not real:
            continue
        exp.append(np.mean([rollouts[r]["agents.expected_reward"][t] for r, t in real], axis=0))
        posr.append(np.mean([rollouts[r]["agents.is_positive_example"][t] for r, t in real], axis=0))
        points: dict[int, np.ndarray] = {}
        for r, t in real:
            points.setdefault(int(rollouts[r]["malt.parent_id"][t]), rollouts[r]["agents.decision_has_pair"][t])
        pair.append(np.mean(list(points.values()), axis=0))
        sizes.append(len(real))
    stats: dict[str, float] = {}
    if not exp:
        return stats
    for i, agent in enumerate(agent_names):
        stats[f"{agent}.mean_expected_reward"] = float(np.mean([e[i] for e in exp]))
        stats[f"{agent}.positive_example_rate"] = float(np.mean([p[i] for p in posr]))
        stats[f"{agent}.has_pair_rate"] = float(np.mean([p[i] for p in pair]))
    stats["malt.mean_rollouts_per_tree"] = float(np.mean(list(leaves.values())))
    stats["malt.mean_nodes_per_tree"] = float(np.mean(sizes))
    return stats


# -- sampling the trees -----------------------------------------------------------------------


class _BranchAgent:
    """An agent whose call seeds are re-derived with a branch salt, so sibling branches differ."""

    def __init__(self, agent: Any, salt: tuple):
        self.agent = agent
        self.salt = salt

    def generate(self, messages: list[dict[str, str]], seed: int | None = None, *,
                 decision: bool = False, form: str | None = None) -> tuple[str, str, int]:
        if seed is not None:
            seed = stable_seed(seed, "malt", *self.salt, modulus=2**31)
        return self.agent.generate(messages, seed=seed, decision=decision, form=form)


@dataclass
class _Node:
    node_id: int
    parent: "_Node | None"
    state: NestedArrayDict  # the episode state after this node's step (root: the reset state)
    timestep: NestedArrayDict | None = None
    ended: bool = False
    children: list["_Node"] = field(default_factory=list)


def sample_response_trees(env: Any, agents: dict[str, Any], protocol: str, hyper_params: Any,
                          roots: list[NestedArrayDict], k: int, iteration: int, max_workers: int,
                          on_level: Callable[[], None] | None = None) -> tuple[list[NestedArrayDict], int]:
    """The leaf rollouts of one response tree per root state, trees in order; and the tokens."""
    trees = [_Node(ROOT_ID, None, root) for root in roots]
    level = list(trees)
    lock = threading.Lock()
    tokens = [0]

    def step(job: tuple[_Node, int]) -> NestedArrayDict:
        node, child_id = job
        salt = (int(node.state["seed"]), int(node.state["datapoint_id"]), child_id)
        actor = TextActor(env, {n: _BranchAgent(a, salt) for n, a in agents.items()}, protocol, hyper_params)
        ts = env.step(node.state, actor(node.state))
        with lock:
            tokens[0] += actor.tokens
        return ts

    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        for _ in range(env.max_rounds):
            jobs = [(n, c) for n in level if not n.ended for c in child_ids(n.node_id, k)]
            results = iter(pool.map(step, jobs))
            for node in level:
                if node.ended:
                    node.children.append(_Node(child_ids(node.node_id, k)[0], node, node.state,
                                               env.padding_timestep(node.state), ended=True))
                    continue
                for child_id in child_ids(node.node_id, k):
                    ts = next(results)
                    ended = bool(ts["next.done"]) or bool(ts["next.terminated"])
                    node.children.append(_Node(child_id, node, env.next_state(ts), ts, ended))
            level = [c for n in level for c in n.children]  # tree order, children of earlier nodes first
            if on_level is not None:
                on_level()
    rollouts = []
    for t_index, root in enumerate(trees):
        frontier = [root]
        for _ in range(env.max_rounds):
            frontier = [c for n in frontier for c in n.children]
        for leaf in frontier:
            steps = []
            for node in _ancestors(leaf):
                ts = node.timestep.clone()
                ts["malt.iteration"] = np.int64(iteration)
                ts["malt.tree"] = np.int64(t_index)
                ts["malt.node_id"] = np.int64(node.node_id)
                ts["malt.parent_id"] = np.int64(node.parent.node_id)
                steps.append(ts)
            rollouts.append(stack_nested_array_dicts(steps))
    return rollouts, tokens[0]


def _ancestors(leaf: _Node) -> list[_Node]:
    """The nodes of the root-to-leaf path, root excluded, top first."""
    out, n = [], leaf
    while n.parent is not None:
        out.append(n)
        n = n.parent
    return out[::-1]


# -- the trainer ------------------------------------------------------------------------------


@register_trainer("pure_text_malt")
class PureTextMaltTrainer(PureTextRlTrainer):
    """MALT: response trees, expected-reward labels, DPO on positive/negative sibling pairs."""

    trainer_name = "pure_text_malt"
    trainer_kind = "pure_text"
    needs_critic = False
    fine_tune_method = "dpo"

    @property
    def reward_thresholds(self) -> np.ndarray:
        return np.array([self.protocol_handler.reward_mid_point_estimate(a) for a in self.agent_names])

    def _sample_rollouts(self, environment, iteration, use_tqdm: bool = False,
                         tqdm_desc: str = "Sampling response trees") -> list[NestedArrayDict]:
        """In training one response tree per datapoint of the iteration (same datapoints and
        seeds as EI); the test loop samples single episodes as the base class does."""
        if iteration == "test":
            return super()._sample_rollouts(environment, iteration, use_tqdm, "Sampling test rollouts")
        hp = self.hyper_params
        n = self.rollouts_per_iteration
        dataset, tag = environment.dataset, f"train-{iteration}"
        indices = datapoint_indices(hp.seed, len(dataset), n * iteration, n)
        seeds = [stable_seed(hp.seed, tag, j, modulus=2**16) for j in range(n)]
        roots = [environment.reset(dataset[d], s, datapoint_id=d) for d, s in zip(indices, seeds)]
        with self.make_iteration_context(environment.max_rounds, f"{tag}: sampling response trees",
                                         show_bar=use_tqdm) as ctx:
            rollouts, tokens = sample_response_trees(
                environment, self.scenario.whole_agents(), hp.interaction_protocol, hp, roots,
                hp.pure_text_malt.num_responses_per_timestep, iteration,
                self.settings.max_concurrent_requests, on_level=ctx.step)
        annotate_trees(rollouts, self.reward_thresholds, hp.seed)
        self.state.tokens_used += tokens
        return rollouts

    # -- log stats: the base stats plus, in training, the tree statistics -----------------------

    def _get_log_stats(self, rollouts: list[NestedArrayDict], *, train: bool = True) -> dict[str, float]:
        stats = super()._get_log_stats(rollouts, train=train)
        if train:  # test rollouts are single episodes, not trees
            stats.update(tree_stats(rollouts, self.agent_names))
            for agent in self.agent_names:
                stats[f"{agent}.dpo_pairs"] = float(len(self.agent_fine_tune_examples(agent, rollouts)))
        return stats

    # -- fine-tuning ----------------------------------------------------------------------------

    def agent_fine_tune_examples(self, agent: str, rollouts: list[NestedArrayDict]) -> list[dict]:
        """DPO examples of ``agent``: one per decision point where it has a usable pair."""
        i = self.agent_names.index(agent)
        env = self.scenario.train_environment
        examples = []
        for key, nodes in unique_nodes(rollouts).items():
            for n, (r, t) in sorted(nodes.items()):
                rollout = rollouts[r]
                if bool(rollout["padding"][t]) or not bool(rollout["agents.decision_has_pair"][t, i]):
                    continue
                if int(rollout["agents.decision_positive_child"][t, i]) != n:
                    continue  # each decision point once, from its sampled positive child
                neg = int(rollout["agents.decision_negative_child"][t, i])
                rn, tn = nodes[neg]
                good = rollout["agents.raw_message"][t, i]
                bad = rollouts[rn]["agents.raw_message"][tn, i]
                state = rollout[t]
                if good is None or bad is None or good == bad or not env.active_mask(state)[i].any():
                    continue  # inactive, gave up, or the same reply (no preference to learn)
                examples.append(self.dpo_example(agent, state, str(good), str(bad)))
        return examples
