"""Zero-knowledge wrapper: names, visibility, schedule, and the step (docs/behaviour.md#b11)."""

from __future__ import annotations

import pytest
import torch

from nip_core.protocols import (
    MissingStepInputError,
    NipProtocol,
    ProtocolStepInput,
    ZeroKnowledgeProtocol,
    ZeroKnowledgeUnsupportedError,
    build_protocol_handler,
)
from nip_core.protocols.base import DeterministicSingleVerifierProtocolHandler

from ._helpers import P, V, make_handler, make_params

ZK = {"simulator_reward_coefficient": 0.342, "aux_prover_reward_coefficient": 0.123}
PROTOCOLS = ["nip", "adp", "debate", "merlin_arthur", "mnip", "solo_verifier", "multi_channel_test"]
KINDS = ("standard", "adversarial", "simulator")


def zk_handler(protocol: str, common: dict | None = None, **groups) -> ZeroKnowledgeProtocol:
    return make_handler(protocol, common={"zero_knowledge": True, **(common or {})}, zk_protocol=ZK, **groups)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_names_are_kind_major_and_agents_appended(protocol):
    base, zk = make_handler(protocol), zk_handler(protocol)
    assert isinstance(zk, ZeroKnowledgeProtocol) and type(zk.base_protocol) is type(base)
    assert zk.message_channel_names == [f"{c}_{k}" for k in KINDS for c in base.message_channel_names]
    assert zk.agent_names == base.agent_names + ["adversarial_verifier", "simulator"]
    assert zk.verifier_names == ["verifier", "adversarial_verifier"]
    assert zk.prover_names == base.prover_names
    assert (zk.max_message_rounds, zk.min_message_rounds, zk.max_verifier_questions) == (
        base.max_message_rounds, base.min_message_rounds, base.max_verifier_questions)
    assert zk.is_deterministic == base.is_deterministic


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_active_mask_invariants(protocol):
    base, zk = make_handler(protocol), zk_handler(protocol)
    nb = base.num_message_channels
    gen = torch.Generator().manual_seed(3)
    rounds = torch.arange(base.max_message_rounds).repeat_interleave(16)
    seeds = torch.randint(0, 2**16, rounds.shape, generator=gen)
    base_mask, zk_mask = base.get_active_agents_mask(rounds, seeds), zk.get_active_agents_mask(rounds, seeds)
    assert zk_mask.shape == (len(rounds), base.num_agents + 2, 3 * nb)
    expected = torch.zeros_like(zk_mask)
    for a, agent in enumerate(base.agent_names):
        for c in range(nb):
            if agent == "verifier":
                expected[:, a, c] = base_mask[:, a, c]
                expected[:, base.num_agents, nb + c] = base_mask[:, a, c]
                expected[:, base.num_agents + 1, 2 * nb + c] = base_mask[:, a, c]
            else:
                expected[:, a, c] = base_mask[:, a, c]
                expected[:, a, nb + c] = base_mask[:, a, c]
    assert torch.equal(zk_mask, expected)
    assert torch.equal(zk.get_verifier_guess_mask(rounds, seeds), base.get_verifier_guess_mask(rounds, seeds))
    # The scalar view agrees with the tensor one (seed-independent protocols only).
    if base.is_deterministic:
        for r in range(base.max_message_rounds):
            for a, agent in enumerate(zk.agent_names):
                for c, channel in enumerate(zk.message_channel_names):
                    assert zk.can_agent_be_active(agent, r, channel) == bool(zk_mask[r * 16, a, c])


def test_nip_table_and_visibility_literal():
    zk = zk_handler("nip")
    # [round][agent: prover, verifier, adversarial_verifier, simulator]
    # [channel: main_standard, main_adversarial, main_simulator]
    even = [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]
    odd = [[1, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]
    rounds = torch.arange(8)
    assert zk.get_active_agents_mask(rounds, rounds).int().tolist() == [even, odd] * 4
    assert zk.agent_channel_visibility_mask.int().tolist() == [[1, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert zk.agent_first_active_round == {"prover": 1, "verifier": 0, "adversarial_verifier": 0,
                                           "simulator": 0}
    assert zk.stackelberg_sequence == (("verifier", "adversarial_verifier"), ("prover", "simulator"))
    assert zk.reward_mid_point_estimate("prover") == P / 2
    assert zk.reward_mid_point_estimate("simulator") == zk.reward_mid_point_estimate("adversarial_verifier") == 0


def test_merlin_arthur_table_literal():
    zk = zk_handler("merlin_arthur")
    # agents: prover0, prover1, verifier, adversarial_verifier, simulator; channels as for nip
    mask = zk.get_active_agents_mask(torch.tensor([0, 0, 1]), torch.tensor([6, 9, 6]))
    assert mask.int().tolist() == [
        [[0, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]],  # round 0, even seed: prover1
        [[1, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]],  # round 0, odd seed: prover0
        [[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]],  # round 1: the verifiers and simulator
    ]


def test_debate_visibility_literal():
    zk = zk_handler("debate")
    s, a, m = "_standard", "_adversarial", "_simulator"
    p0, p1 = "prover0_channel", "prover1_channel"
    assert zk.agent_channel_visibility == [
        ("prover0", p0 + s), ("prover0", p0 + a), ("prover0", p1 + s), ("prover0", p1 + a),
        ("prover1", p0 + s), ("prover1", p0 + a), ("prover1", p1 + s), ("prover1", p1 + a),
        ("verifier", p0 + s), ("adversarial_verifier", p0 + a), ("simulator", p0 + m),
        ("verifier", p1 + s), ("adversarial_verifier", p1 + a), ("simulator", p1 + m),
    ]


def _pair_with_cosine(cos: torch.Tensor, dim: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random vectors ``a``, ``b`` (shape ``(*cos.shape, dim)``) with ``cos(a, b) == cos``."""
    u = torch.nn.functional.normalize(torch.randn(*cos.shape, dim, generator=gen), dim=-1)
    w = torch.randn(*cos.shape, dim, generator=gen)
    w = torch.nn.functional.normalize(w - (w * u).sum(-1, keepdim=True) * u, dim=-1)
    scale_a = 0.5 + torch.rand(*cos.shape, 1, generator=gen)
    scale_b = 0.5 + torch.rand(*cos.shape, 1, generator=gen)
    b = cos.unsqueeze(-1) * u + (1 - cos**2).sqrt().unsqueeze(-1) * w
    return scale_a * u, scale_b * b


@pytest.mark.parametrize("protocol", ["nip", "debate"])
def test_step_invariants_with_constructed_logits(protocol):
    """The original's zero-knowledge step test (docs/behaviour.md#b11), with our own logits (verifier first)."""
    zk, base = zk_handler(protocol), make_handler(protocol)
    gen = torch.Generator().manual_seed(0)
    shape, nb, n_logits = (32, 8), base.num_message_channels, 2
    adv, sim = zk.adversarial_verifier_index, zk.simulator_index
    rounds = torch.randint(0, zk.max_message_rounds, shape, generator=gen)
    done = torch.rand(shape, generator=gen) < 0.3
    agent_done = torch.rand((*shape, zk.num_agents), generator=gen) < 0.3
    decision = torch.randint(0, 3, (*shape, zk.num_agents), generator=gen)
    msg_cos = torch.rand(shape, generator=gen) * 2 - 1
    dec_cos = torch.rand(shape, generator=gen) * 2 - 1

    message_logits = torch.randn(*shape, zk.num_agents, 3 * nb, 1, n_logits, generator=gen)
    a, b = _pair_with_cosine(msg_cos, n_logits, gen)
    # Prescribed pair in the first base channel; the other base channels of the two blocks are zero.
    message_logits[..., adv, nb:2 * nb, :, :] = 0.0
    message_logits[..., sim, 2 * nb:, :, :] = 0.0
    message_logits[..., adv, nb, 0, :] = a
    message_logits[..., sim, 2 * nb, 0, :] = b
    decision_logits = torch.randn(*shape, zk.num_agents, 3, generator=gen)
    a, b = _pair_with_cosine(dec_cos, 3, gen)
    decision_logits[..., adv, :] = a
    decision_logits[..., sim, :] = b

    inp = ProtocolStepInput(round=rounds, seed=torch.randint(0, 2**16, shape, generator=gen),
                            y=torch.randint(0, 2, shape, generator=gen), decision=decision, done=done,
                            agent_done=agent_done, terminated=torch.zeros(shape, dtype=torch.bool),
                            message_logits=message_logits, decision_logits=decision_logits)
    out = zk.step_interaction_protocol(inp)
    base_out = base.step_interaction_protocol(inp.restrict_agents(base.num_agents))

    verifier_active = rounds % 2 == 0  # verifier first, simultaneous: even rounds
    vi = zk.verifier_index
    assert torch.equal(out.agent_done[..., vi], base_out.agent_done[..., vi])
    adv_done = ((decision[..., adv] != 2) & verifier_active) | agent_done[..., adv]
    assert torch.equal(out.agent_done[..., adv], adv_done)
    assert torch.equal(out.shared_done, (base_out.agent_done[..., vi] & adv_done) | done)
    for i in [*zk.prover_indices, sim]:
        assert torch.equal(out.agent_done[..., i], out.shared_done)
    assert torch.equal(out.terminated, base_out.terminated)

    expected_sim = 0.342 * (msg_cos * verifier_active + dec_cos * verifier_active)
    torch.testing.assert_close(out.reward[..., sim], expected_sim, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.reward[..., adv], -expected_sim, atol=1e-5, rtol=1e-5)
    assert torch.equal(out.reward[..., vi], base_out.reward[..., vi])
    for i in zk.prover_indices:
        torch.testing.assert_close(out.reward[..., i], base_out.reward[..., i] + 0.123 * expected_sim,
                                   atol=1e-5, rtol=1e-5)
    # Both cases of each mask occur, so the test exercises them.
    assert verifier_active.any() and (~verifier_active).any() and (expected_sim != 0).any()


def test_step_hand_computed_rows():
    zk = zk_handler("nip")  # agents: prover, verifier, adversarial_verifier, simulator
    message_logits = torch.zeros(3, 4, 3, 1, 2)
    decision_logits = torch.zeros(3, 4, 3)
    # row 0 (verifier round): messages parallel (cos 1), decisions orthogonal (cos 0)
    message_logits[0, 2, 1, 0] = torch.tensor([1.0, 0.0])
    message_logits[0, 3, 2, 0] = torch.tensor([2.0, 0.0])
    decision_logits[0, 2] = torch.tensor([1.0, 0.0, 0.0])
    decision_logits[0, 3] = torch.tensor([0.0, 0.0, 5.0])
    # row 1 (prover round): everything is masked out, so similarity 0
    message_logits[1, 2, 1, 0] = torch.tensor([1.0, 0.0])
    message_logits[1, 3, 2, 0] = torch.tensor([1.0, 0.0])
    decision_logits[1, 2] = decision_logits[1, 3] = torch.tensor([1.0, 1.0, 0.0])
    # row 2 (verifier round): messages orthogonal (0), decisions opposite (-1)
    message_logits[2, 2, 1, 0] = torch.tensor([1.0, 1.0])
    message_logits[2, 3, 2, 0] = torch.tensor([1.0, -1.0])
    decision_logits[2, 2] = torch.tensor([1.0, 0.0, 0.0])
    decision_logits[2, 3] = torch.tensor([-3.0, 0.0, 0.0])
    # Noise where nobody may speak must not matter.
    message_logits[:, 2, 0] = 7.0
    message_logits[:, 3, 1] = -7.0
    before = (message_logits.clone(), decision_logits.clone())

    inp = ProtocolStepInput(
        round=torch.tensor([0, 1, 2]), seed=torch.zeros(3, dtype=torch.long), y=torch.tensor([1, 1, 0]),
        decision=torch.tensor([[2, 1, 2, 2], [2, 2, 2, 2], [2, 0, 1, 2]]),
        done=torch.zeros(3, dtype=torch.bool), agent_done=torch.zeros(3, 4, dtype=torch.bool),
        terminated=torch.zeros(3, dtype=torch.bool),
        message_logits=message_logits, decision_logits=decision_logits)
    out = zk.step_interaction_protocol(inp)
    expected = torch.tensor([
        [P + 0.123 * 0.342, V, -0.342, 0.342],
        [0.0, 0.0, 0.0, 0.0],
        [-0.123 * 0.342, V, 0.342, -0.342],
    ])
    torch.testing.assert_close(out.reward, expected, atol=1e-6, rtol=1e-6)
    assert out.agent_done.int().tolist() == [[0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert out.shared_done.int().tolist() == [0, 0, 1]
    # Fixed (docs/behaviour.md#b11): the inputs are not modified.
    assert torch.equal(message_logits, before[0]) and torch.equal(decision_logits, before[1])


def test_errors():
    with pytest.raises(ValueError, match="zero_knowledge"):  # the params model refuses it
        make_params("nip", scenario="code_validation", common={"zero_knowledge": True})
    cv_params = make_params("nip", scenario="code_validation")
    with pytest.raises(ZeroKnowledgeUnsupportedError, match="code_validation"):
        ZeroKnowledgeProtocol(cv_params, NipProtocol)

    class NotZk(NipProtocol):
        can_be_zero_knowledge = False

    class Judged(DeterministicSingleVerifierProtocolHandler):
        AGENTS, CHANNELS, VISIBILITY = ("prover", "judge"), ("main",), (("prover", "main"), ("judge", "main"))
        VERIFIER_NAME = "judge"
        max_message_rounds, min_message_rounds = 2, 1

        def is_agent_active(self, agent_name, round, channel_name):
            return (agent_name == "judge") == (round % 2 == 1)

    gi = make_params("nip")
    with pytest.raises(ZeroKnowledgeUnsupportedError, match="NotZk"):
        ZeroKnowledgeProtocol(gi, NotZk)
    with pytest.raises(ZeroKnowledgeUnsupportedError, match="'judge'"):
        ZeroKnowledgeProtocol(gi, Judged)
    zk = build_protocol_handler(make_params("nip", common={"zero_knowledge": True}))
    inp = ProtocolStepInput(round=torch.tensor([0]), seed=torch.tensor([0]), y=torch.tensor([1]),
                            decision=torch.tensor([[2, 2, 2, 2]]), done=torch.tensor([False]),
                            agent_done=torch.zeros(1, 4, dtype=torch.bool), terminated=torch.tensor([False]))
    with pytest.raises(MissingStepInputError, match="logits"):
        zk.step_interaction_protocol(inp)
