"""Environment tests: specs, the reference golden step, hand-computed episodes, seeding."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs, step_mdp

from nip_core.parameters import HyperParameters
from nip_core.scenarios.graph_isomorphism.environment import GraphIsomorphismEnvironment
from tests.nip_core.environments.standins import RandomGraphDataset, make_protocol

REWARDS = dict(prover_reward=1.0, verifier_reward=2.0, verifier_terminated_penalty=-4.0,
               verifier_no_guess_reward=8.0, verifier_incorrect_penalty=-16.0)


def make_env(protocol="nip", num_envs=12, rounds=6, verifier_first=False, message_size=1, seed=0):
    limits = {"max_message_rounds": rounds, "min_message_rounds": 1}
    hp = HyperParameters(
        scenario="graph_isomorphism", trainer="vanilla_ppo", dataset="test",
        interaction_protocol=protocol, message_size=message_size,
        protocol_common=dict(verifier_first=verifier_first, **REWARDS),
        nip_protocol=limits, debate_protocol=limits,
        rl=dict(frames_per_batch=num_envs * rounds),
    )
    return GraphIsomorphismEnvironment(hp, RandomGraphDataset(n=16, max_nodes=8), make_protocol(hp),
                                       seed=seed)


def act(env, td, decision, node_selected):
    """Put the actions into ``td`` (decision (B, A), node_selected (B, A, C, M))."""
    B, A = env.num_envs, env.num_agents
    td["agents"] = TensorDict({
        "decision": torch.as_tensor(decision, dtype=torch.long),
        "node_selected": torch.as_tensor(node_selected, dtype=torch.long).reshape(
            B, A, env.num_channels, env.message_size),
        "main_message_logits": torch.zeros(B, A, env.num_channels, env.message_size, 16),
        "decision_logits": torch.zeros(B, A, 3),
        "done": td["agents", "done"], "terminated": td["agents", "terminated"],
    }, batch_size=(B, A))
    return td


@pytest.mark.parametrize("protocol", ["nip", "debate"])
def test_check_env_specs(protocol):
    check_env_specs(make_env(protocol, num_envs=4, message_size=3))


def test_golden_step_nip_prover_first():
    """The reference library's GI ``_step`` test (docs/behaviour.md#b13), reproduced by hand."""
    env = make_env()
    td = env.reset()
    B = 12
    td["round"] = torch.arange(B) % 6
    td["y"] = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1])
    done = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    td["done"] = done[:, None]
    td["agents", "done"] = done[:, None, None].expand(B, 2, 1).clone()
    verifier_decision = torch.tensor([0, 0, 1, 2, 2, 2, 0, 0, 1, 1, 1, 1])
    prover_nodes = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12])
    verifier_nodes = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0, 8, 15, 14, 13])
    act(env, td, torch.stack([torch.full((B,), 2), verifier_decision], -1),
        torch.stack([prover_nodes, verifier_nodes], -1))
    nxt = env._step(td)

    assert nxt["round"].tolist() == [(i % 6) + 1 for i in range(B)]
    assert nxt["done"].squeeze(-1).int().tolist() == [0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1]
    expected = [(0, 0), (0, 2), (0, 0), (0, 8), (0, 0), (0, -4), (0, 0), (0, -16), (0, 0),
                (1, -16), (0, 0), (1, 2)]
    assert [tuple(r) for r in nxt["agents", "reward"].squeeze(-1).tolist()] == expected
    for i in range(B):
        r = i % 6
        node = int(prover_nodes[i] if r % 2 == 0 else verifier_nodes[i])
        expected_message = torch.zeros(2, 8)
        expected_message[node // 8, node % 8] = 1
        assert torch.equal(nxt["message"][i, 0, 0], expected_message)
        history = torch.zeros(6, 2, 8)
        history[r] = expected_message
        assert torch.equal(nxt["message_history"][i, :, 0, 0], history)
        assert torch.equal(nxt["x"][i], nxt["message_history"][i])
    assert torch.equal(nxt["adjacency"], td["adjacency"])
    assert torch.equal(nxt["node_mask"], td["node_mask"])


def run_steps(env, y, decisions, nodes):
    """Step through ``len(decisions)`` rounds from a fresh reset (no auto-reset)."""
    td = env.reset()
    td["y"] = torch.as_tensor(y)
    outs = []
    for decision, node in zip(decisions, nodes):
        act(env, td, decision, node)
        td = env.step(td)
        outs.append(td["next"].clone())
        td = step_mdp(td)
    return outs


def test_hand_computed_nip_episodes():
    """verifier first, 4 rounds: env0 correct at round 0, env1 continue / prover / wrong,
    env2 keeps continuing and times out in the prover's last round."""
    env = make_env("nip", num_envs=3, rounds=4, verifier_first=True)
    # agents: (prover, verifier)
    decisions = [
        [[2, 1], [2, 2], [2, 2]],  # round 0: verifier's turn
        [[2, 2], [2, 0], [2, 0]],  # round 1: prover's turn (verifier decisions ignored)
        [[2, 2], [2, 1], [2, 2]],  # round 2: verifier's turn
        [[2, 2], [2, 2], [2, 2]],  # round 3: prover's turn, last round
    ]
    nodes = [[[0, 3], [1, 9], [2, 4]], [[5, 6], [12, 0], [7, 7]],
             [[1, 1], [2, 2], [3, 3]], [[4, 4], [5, 5], [6, 6]]]
    outs = run_steps(env, [1, 0, 1], decisions, nodes)
    rewards = [o["agents", "reward"].squeeze(-1).tolist() for o in outs]
    done = [o["done"].squeeze(-1).tolist() for o in outs]
    terminated = [o["terminated"].squeeze(-1).tolist() for o in outs]
    # round 0: env0 correct accept -> verifier 2, prover 1; env1/env2 continue -> no-guess 8
    assert rewards[0] == [[1, 2], [0, 8], [0, 8]]
    assert done[0] == [True, False, False]
    # round 1: prover's turn, nobody is rewarded; the verifier's "0" is not a decision
    assert rewards[1][1:] == [[0, 0], [0, 0]]
    assert done[1][1:] == [False, False]
    # env1's history holds the verifier's node 9 (graph 1, node 1) at round 0 and the
    # prover's node 12 (graph 1, node 4) at round 1
    hist = outs[1]["message_history"][1, :, 0, 0]
    assert hist[0].nonzero().tolist() == [[1, 1]] and hist[1].nonzero().tolist() == [[1, 4]]
    assert hist[2:].sum() == 0
    # round 2: env1 wrong accept (y=0) -> -16, prover paid 1 for the accept; env2 continues
    assert rewards[2][1:] == [[1, -16], [0, 8]]
    assert done[2][1:] == [True, False]
    assert terminated[2][1:] == [False, False]
    # round 3 (last, prover's turn): env2 times out
    assert rewards[3][2] == [0, -4]
    assert done[3][2] is True and terminated[3][2] is True
    assert outs[3]["agents", "done"][2].all() and outs[3]["agents", "terminated"][2].all()


def test_hand_computed_debate_episodes():
    """Simultaneous debate, verifier first: (prover0, prover1, verifier), two channels."""
    env = make_env("debate", num_envs=3, rounds=4, verifier_first=True)
    decisions = [
        [[2, 2, 0], [2, 2, 2], [2, 2, 2]],
        [[2, 2, 2], [2, 2, 2], [2, 2, 2]],
        [[2, 2, 2], [2, 2, 1], [2, 2, 2]],
        [[2, 2, 2], [2, 2, 2], [2, 2, 2]],
    ]
    # node_selected (B, A, C): prover0 speaks on channel 0, prover1 on channel 1
    nodes = [[[[0, 0], [0, 0], [1, 2]]] * 1 + [[[0, 0], [0, 0], [3, 4]]] + [[[0, 0], [0, 0], [5, 6]]],
             [[[9, 0], [0, 10], [0, 0]], [[3, 7], [15, 2], [1, 1]], [[2, 2], [2, 2], [2, 2]]],
             [[[0, 0], [0, 0], [0, 0]]] * 3, [[[0, 0], [0, 0], [0, 0]]] * 3]
    outs = run_steps(env, [0, 0, 1], decisions, nodes)
    rewards = [o["agents", "reward"].squeeze(-1).tolist() for o in outs]
    done = [o["done"].squeeze(-1).tolist() for o in outs]
    # round 0: env0 correct reject -> prover0 paid 1, verifier 2
    assert rewards[0] == [[1, 0, 2], [0, 0, 8], [0, 0, 8]]
    assert done[0] == [True, False, False]
    # round 1: both provers speak in their own channel at once
    msg = outs[1]["message"][1, :, 0]  # (channel, 2, 8)
    assert msg[0].nonzero().tolist() == [[0, 3]]   # prover0's node 3 on channel 0
    assert msg[1].nonzero().tolist() == [[0, 2]]   # prover1's node 2 on channel 1
    assert rewards[1][1:] == [[0, 0, 0], [0, 0, 0]]
    # round 2: env1 wrong accept (y=0) -> prover1 paid, verifier -16
    assert rewards[2][1:] == [[0, 1, -16], [0, 0, 8]]
    assert done[2][1:] == [True, False]
    # round 3: env2 times out
    assert rewards[3][2] == [0, 0, -4]
    assert done[3][2] is True and outs[3]["terminated"][2].item() is True


def test_reset_is_deterministic_per_seed_and_resumable():
    a, b, c = make_env(seed=5), make_env(seed=5), make_env(seed=6)
    ta, tb, tc = a.reset(), b.reset(), c.reset()
    assert torch.equal(ta["seed"], tb["seed"]) and torch.equal(ta["datapoint_id"], tb["datapoint_id"])
    assert not torch.equal(ta["seed"], tc["seed"])
    state = a.get_rng_state()
    first = a.reset()
    a.set_rng_state(state)
    again = a.reset()
    assert torch.equal(first["seed"], again["seed"])
    assert torch.equal(first["datapoint_id"], again["datapoint_id"])
    # the data cycler goes through every datapoint once per epoch
    ids = torch.cat([b.reset()["datapoint_id"] for _ in range(3)])  # 12 + 36 = 48 = 3 epochs
    assert sorted(torch.cat([tb["datapoint_id"], ids])[:16].tolist()) == list(range(16))


def test_partial_reset_only_resets_done_rows():
    env = make_env(num_envs=4, rounds=6)
    td = env.reset()
    td["round"] = torch.tensor([3, 3, 3, 3])
    td["_reset"] = torch.tensor([[True], [False], [False], [True]])
    out = env.reset(td.clone())
    assert out["round"].tolist() == [0, 3, 3, 0]
