"""pure_text_malt: tree arithmetic on a hand-made tree; a 2-iteration run against the local server."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from nip_core.environments.nested_array_dict import NestedArrayDict
from nipflow_llm_server.server.validation import check_example
from nip_core.parameters import HyperParameters
from nip_core.settings import ExperimentSettings
from nip_core.trainers.build import build_trainer
from nip_core.trainers.pure_text_malt import (
    annotate_trees,
    child_ids,
    expected_rewards,
    positive_labels,
    sample_pairs,
    tree_stats,
)

import nip_core.trainers.catalogue  # noqa: F401

# A k=2 tree, agents (prover, verifier), thresholds (0.5, 0.0). Node 2 and node 4 end the
# episode, so they get padding children (5, 9) and 5 gets another (11).
#
#          0
#       1     2*
#     3   4*   5p
#    7 8  9p   11p
PARENT = {1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 7: 3, 8: 3, 9: 4, 11: 5}
REWARD = {1: [0, 0], 2: [1, -1], 3: [0, 0], 4: [0, 1], 5: [0, 0], 7: [1, 1], 8: [0, -1], 9: [0, 0], 11: [0, 0]}
PADDING = {5, 9, 11}
THRESHOLDS = np.array([0.5, 0.0])
LEAF_PATHS = [[1, 3, 7], [1, 3, 8], [1, 4, 9], [2, 5, 11]]


def test_heap_numbering_of_children():
    assert child_ids(0, 2) == [1, 2] and child_ids(3, 2) == [7, 8] and child_ids(2, 3) == [7, 8, 9]


def test_expected_rewards_average_children_equally():
    e = expected_rewards(PARENT, {n: np.array(r, float) for n, r in REWARD.items()})
    want = {7: [1, 1], 8: [0, -1], 9: [0, 0], 11: [0, 0], 3: [0.5, 0], 4: [0, 1], 5: [0, 0],
            1: [0.25, 0.5],  # 0 + mean([0.5, 0], [0, 1]); the original's leaf average gives [1/3, 1/3]
            2: [1, -1]}
    assert set(e) == set(want)
    for n, v in want.items():
        assert e[n] == pytest.approx(v), n


def test_positive_labels_and_pairs():
    e = expected_rewards(PARENT, {n: np.array(r, float) for n, r in REWARD.items()})
    pos = positive_labels(e, THRESHOLDS)
    assert {n: tuple(bool(x) for x in p) for n, p in pos.items()} == {
        1: (False, True), 2: (True, False), 3: (True, True), 4: (False, True), 5: (False, True),
        7: (True, True), 8: (False, False), 9: (False, True), 11: (False, True)}
    pairs = sample_pairs(PARENT, pos, lambda p, i: np.random.default_rng(0))
    assert set(pairs) == {0, 1, 2, 3, 4, 5}
    got = {p: (list(d.has_pair), list(d.positive), list(d.negative)) for p, d in pairs.items()}
    assert got[0] == ([True, True], [2, 1], [1, 2])
    assert got[1] == ([True, False], [3, -1], [4, -1])
    assert got[3] == ([True, True], [7, 7], [8, 8])
    assert got[2] == got[4] == got[5] == ([False, False], [-1, -1], [-1, -1])


def test_pair_sampling_is_seeded_and_picks_within_the_labels():
    parent = {1: 0, 2: 0, 3: 0, 4: 0}
    pos = {1: np.array([True]), 2: np.array([True]), 3: np.array([False]), 4: np.array([False])}
    draws = set()
    for s in range(20):
        d = sample_pairs(parent, pos, lambda p, i: np.random.default_rng(s))[0]
        again = sample_pairs(parent, pos, lambda p, i: np.random.default_rng(s))[0]
        assert (d.positive[0], d.negative[0]) == (again.positive[0], again.negative[0])
        assert d.positive[0] in (1, 2) and d.negative[0] in (3, 4)
        draws.add((int(d.positive[0]), int(d.negative[0])))
    assert len(draws) > 1


def synthetic_rollouts() -> list[NestedArrayDict]:
    out = []
    for path in LEAF_PATHS:
        out.append(NestedArrayDict({
            "malt.iteration": np.zeros(3, dtype=np.int64), "malt.tree": np.zeros(3, dtype=np.int64),
            "malt.node_id": np.array(path), "malt.parent_id": np.array([PARENT[n] for n in path]),
            "next.agents.reward": np.array([REWARD[n] for n in path], dtype=float),
            "padding": np.array([n in PADDING for n in path]), "seed": np.full(3, 5, dtype=np.int64)},
            batch_size=(3,)))
    return out


def test_annotated_rollouts_and_tree_stats():
    rollouts = synthetic_rollouts()
    annotate_trees(rollouts, THRESHOLDS, seed=1)
    r0 = rollouts[0]  # path 1-3-7
    assert r0["agents.expected_reward"].tolist() == [[0.25, 0.5], [0.5, 0.0], [1.0, 1.0]]
    assert r0["agents.is_positive_example"].tolist() == [[False, True], [True, True], [True, True]]
    # decision points of the three timesteps: the root, node 1, node 3
    assert r0["agents.decision_has_pair"].tolist() == [[True, True], [True, False], [True, True]]
    assert r0["agents.decision_positive_child"].tolist() == [[2, 1], [3, -1], [7, 7]]
    assert r0["agents.decision_negative_child"].tolist() == [[1, 2], [4, -1], [8, 8]]
    assert rollouts[3]["agents.decision_has_pair"].tolist() == [[True, True], [False, False], [False, False]]
    stats = tree_stats(rollouts, ["prover", "verifier"])
    # real nodes 1, 2, 3, 4, 7, 8; decision points 0, 1, 3
    assert stats == pytest.approx({
        "prover.mean_expected_reward": 2.75 / 6, "verifier.mean_expected_reward": 0.5 / 6,
        "prover.positive_example_rate": 3 / 6, "verifier.positive_example_rate": 4 / 6,
        "prover.has_pair_rate": 1.0, "verifier.has_pair_rate": 2 / 3,
        "malt.mean_rollouts_per_tree": 4.0, "malt.mean_nodes_per_tree": 6.0})


# -- against the local server ---------------------------------------------------------------

ROUNDS, K, DATAPOINTS = 3, 2, 20


@pytest.mark.e2e
def test_two_iteration_malt_run(tmp_path, server):
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_malt", dataset="nipflow-cv",
                         rl={"num_iterations": 2, "rollouts_per_iteration": DATAPOINTS},
                         nip_protocol={"max_message_rounds": ROUNDS},
                         pure_text_malt={"num_responses_per_timestep": K},
                         dataset_options={"max_train_size": DATAPOINTS, "max_test_size": 4},
                         text_rl={"transcript_format": "json"})
    run_id = "malt-e2e"
    settings = ExperimentSettings(use_wandb=False, runs_dir=str(tmp_path / "runs"), run_id=run_id,
                                  openai_base_url=server.base_url, fine_tune_poll_interval_s=0.1,
                                  fine_tune_poll_max_interval_s=0.5, max_concurrent_requests=8,
                                  show_progress=False)
    t = build_trainer(hp, settings)
    assert type(t).__name__ == "PureTextMaltTrainer"
    seen = []
    while t.next_stage()[1] != "done":
        seen.append(t.run_stage(t.next_stage()[1])["stage"])
    assert seen == ["sample_rollouts", "log_stats", "test_during_training", "create_fine_tune_jobs",
                    "await_fine_tune_jobs", "sample_rollouts", "log_stats", "test_during_training", "test"]
    assert t.next_stage() == (2, "done") and t.state.tokens_used > 0

    # trees: <= k^rounds leaves per datapoint, consistent and unique node ids, branches differ
    for it in (0, 1):
        rollouts = t.load_rollouts(str(it))
        by_tree = defaultdict(list)
        for r in rollouts:
            assert r.batch_size == (ROUNDS,) and set(r["malt.iteration"].tolist()) == {it}
            by_tree[int(r["malt.tree"][0])].append(r)
        assert sorted(by_tree) == list(range(DATAPOINTS))
        differing = 0
        for tree in by_tree.values():
            assert 1 <= len(tree) <= K ** ROUNDS
            assert len({int(r["datapoint_id"][0]) for r in tree}) == 1
            leaves = [int(r["malt.node_id"][-1]) for r in tree]
            assert len(set(leaves)) == len(leaves)
            node_info, raw = {}, defaultdict(set)
            for r in tree:
                for t_, (n, p) in enumerate(zip(r["malt.node_id"].tolist(), r["malt.parent_id"].tolist())):
                    assert node_info.setdefault(n, (p, t_)) == (p, t_)  # one id = one node
                    if not r["padding"][t_]:
                        raw[p].add(tuple(str(x) for x in r["agents.raw_message"][t_]))
            differing += sum(len(v) > 1 for v in raw.values())
        assert differing > 0
        # everything the job stage needs is recomputed identically from the saved rollouts
        again = t.load_rollouts(str(it))
        annotate_trees(again, t.reward_thresholds, hp.seed)
        for a, b in zip(rollouts, again):
            assert a == b

    # metrics: the tree statistics are logged with the base ones
    train = [m for m in t.run.read_metrics() if m.get("kind") == "train"]
    assert len(train) == 2
    for m in train:
        assert "verifier.mean_episode_reward" in m and "mean_accuracy" in m
        for agent in ("prover", "verifier"):
            for key in ("mean_expected_reward", "positive_example_rate", "has_pair_rate", "dpo_pairs"):
                assert f"{agent}.{key}" in m
        assert 1 <= m["malt.mean_rollouts_per_tree"] <= K ** ROUNDS

    # one DPO job per group of iteration 0 with >= 10 pairs (none for the last iteration)
    client = server.client()
    jobs = [j for j in client.fine_tuning.jobs.list(limit=100).data
            if (j.metadata or {}).get("nipflow_run_id") == run_id]
    pairs0 = {g: sum(train[0][f"{a}.dpo_pairs"] for a in t.groups[g].agent_names) for g in t.groups}
    expected_groups = sorted(g for g, n in pairs0.items() if n >= 10)
    assert expected_groups, f"no group had enough pairs: {pairs0}"
    assert sorted(j.metadata["nipflow_group"] for j in jobs) == expected_groups
    for j in jobs:
        assert j.metadata == {"nipflow_run_id": run_id, "nipflow_incarnation": t.run.incarnation,
                              "nipflow_iteration": "0", "nipflow_group": j.metadata["nipflow_group"],
                              "nipflow_attempt": "1"}
        assert j.method.type == "dpo" and j.status == "succeeded"
        lines = client.files.content(j.training_file).read().decode().splitlines()
        group = t.groups[j.metadata["nipflow_group"]]
        assert len(lines) == pairs0[group.group_name]
        # a resumed run rebuilds exactly these examples from the saved rollouts
        reloaded = t.load_rollouts("0")
        assert [json.loads(x) for x in lines] == [e for a in group.agent_names
                                                  for e in t.agent_fine_tune_examples(a, reloaded)]
        for line in lines:
            ex = json.loads(line)
            assert check_example(ex) == "preference"
            assert ex["input"]["messages"][0]["role"] == "system"
            assert ex["preferred_output"][0]["content"] != ex["non_preferred_output"][0]["content"]
