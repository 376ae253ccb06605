"""Zero-knowledge meta-protocol: wraps a single-verifier protocol.

Adds an ``adversarial_verifier`` and a ``simulator`` (appended to the base agents, in that
order) and triplicates every base channel ``c`` into ``c_standard``, ``c_adversarial``,
``c_simulator``, kind-major: ``[c1_standard .. ck_standard, c1_adversarial ..,
c1_simulator ..]`` (load-bearing order). The verifier talks to the provers in the standard
copy, the adversarial verifier in the adversarial copy (provers speak in both whenever the
base protocol lets them), and the simulator alone in the simulator copy, trying to imitate
the adversarial verifier's interaction without any prover. The simulator is rewarded for
matching the adversarial verifier's logits; the adversarial verifier gets the opposite;
provers get a bonus for making the simulator succeed (i.e. for leaking no knowledge).
"""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor

from nip_core.parameters import HyperParameters
from nip_core.protocols import rules
from nip_core.protocols.base import ProtocolHandler
from nip_core.protocols.errors import (
    MissingStepInputError,
    ProtocolError,
    ZeroKnowledgeUnsupportedError,
)
from nip_core.protocols.step import ProtocolStepInput, ProtocolStepOutput

ADVERSARIAL_VERIFIER = "adversarial_verifier"
SIMULATOR = "simulator"
CHANNEL_KINDS = ("standard", "adversarial", "simulator")


class ZeroKnowledgeProtocol(ProtocolHandler):
    """Zero-knowledge version of a base protocol whose only verifier is ``"verifier"``.

    Parameters
    ----------
    hyper_params : HyperParameters
        ``zk_protocol.simulator_reward_coefficient`` and
        ``zk_protocol.aux_prover_reward_coefficient`` set the rewards.
    base_protocol_cls : type[ProtocolHandler]
        The protocol made zero-knowledge; an instance is built internally as
        ``base_protocol``.

    Raises
    ------
    ZeroKnowledgeUnsupportedError
        If the base class cannot be zero-knowledge, its verifiers are not exactly
        ``["verifier"]``, or the scenario has no message logits (code validation).
    """

    # The simulator reward compares message logits, which only these scenarios produce.
    LOGIT_SCENARIOS: ClassVar[frozenset[str]] = frozenset({"graph_isomorphism", "image_classification"})
    can_be_zero_knowledge: ClassVar[bool] = False

    def __init__(self, hyper_params: HyperParameters, base_protocol_cls: type[ProtocolHandler]):
        if not base_protocol_cls.can_be_zero_knowledge:
            raise ZeroKnowledgeUnsupportedError(
                f"protocol {base_protocol_cls.__name__} cannot be made zero-knowledge "
                f"(can_be_zero_knowledge=False)"
            )
        if hyper_params.scenario not in self.LOGIT_SCENARIOS:
            raise ZeroKnowledgeUnsupportedError(
                f"protocol_common.zero_knowledge needs message logits, which scenario "
                f"{hyper_params.scenario!r} does not have (supported: {sorted(self.LOGIT_SCENARIOS)})"
            )
        self.base_protocol = base_protocol_cls(hyper_params)
        if self.base_protocol.verifier_names != ["verifier"]:
            raise ZeroKnowledgeUnsupportedError(
                f"protocol {base_protocol_cls.__name__}: zero-knowledge needs a single verifier "
                f"named 'verifier', got {self.base_protocol.verifier_names}"
            )
        super().__init__(hyper_params)
        self._allowed_by_device: dict[torch.device, Tensor] = {}

    # -- identity -------------------------------------------------------------------

    @property
    def display_name(self) -> str:
        return f"ZeroKnowledge({self.base_protocol.display_name})"

    @property
    def is_deterministic(self) -> bool:  # type: ignore[override]
        return self.base_protocol.is_deterministic

    @cached_property
    def agent_names(self) -> list[str]:  # type: ignore[override]
        return self.base_protocol.agent_names + [ADVERSARIAL_VERIFIER, SIMULATOR]

    @property
    def verifier_names(self) -> list[str]:
        return ["verifier", ADVERSARIAL_VERIFIER]

    @cached_property
    def message_channel_names(self) -> list[str]:  # type: ignore[override]
        return [f"{c}_{kind}" for kind in CHANNEL_KINDS for c in self.base_protocol.message_channel_names]

    @cached_property
    def agent_channel_visibility(self) -> list[tuple[str, str]]:  # type: ignore[override]
        pairs: list[tuple[str, str]] = []
        for agent, channel in self.base_protocol.agent_channel_visibility:
            if agent == "verifier":
                pairs += [("verifier", f"{channel}_standard"),
                          (ADVERSARIAL_VERIFIER, f"{channel}_adversarial"),
                          (SIMULATOR, f"{channel}_simulator")]
            else:
                pairs += [(agent, f"{channel}_standard"), (agent, f"{channel}_adversarial")]
        return pairs

    @property
    def verifier_index(self) -> int:
        return self.base_protocol.agent_names.index("verifier")

    @property
    def adversarial_verifier_index(self) -> int:
        return self.base_protocol.num_agents

    @property
    def simulator_index(self) -> int:
        return self.base_protocol.num_agents + 1

    # -- rounds ----------------------------------------------------------------------

    @property
    def max_message_rounds(self) -> int:
        return self.base_protocol.max_message_rounds

    @property
    def min_message_rounds(self) -> int:
        return self.base_protocol.min_message_rounds

    @property
    def max_verifier_questions(self) -> int:
        return self.base_protocol.max_verifier_questions

    # -- schedule --------------------------------------------------------------------

    def _channel_kind_allowed(self, agent_name: str) -> tuple[str, ...]:
        """Kinds of channel copies an agent may speak in (when its base role is active)."""
        if agent_name == "verifier":
            return ("standard",)
        if agent_name == ADVERSARIAL_VERIFIER:
            return ("adversarial",)
        if agent_name == SIMULATOR:
            return ("simulator",)
        return ("standard", "adversarial")

    def _allowed_mask(self, device: torch.device) -> Tensor:
        """Bool ``(agent, channel)``: the channel's kind is one the agent may use."""
        allowed = self._allowed_by_device.get(device)
        if allowed is None:
            num_base = self.base_protocol.num_message_channels
            allowed = torch.zeros(self.num_agents, self.num_message_channels, dtype=torch.bool)
            for a, agent in enumerate(self.agent_names):
                for kind in self._channel_kind_allowed(agent):
                    k = CHANNEL_KINDS.index(kind)
                    allowed[a, k * num_base:(k + 1) * num_base] = True
            allowed = self._allowed_by_device[device] = allowed.to(device)
        return allowed

    def get_active_agents_mask(self, round: Tensor, seed: Tensor | None) -> Tensor:
        """Base mask with the verifier row copied for the two new agents, channels tiled
        ×3 and each agent restricted to its kinds of channel."""
        base = self.base_protocol.get_active_agents_mask(round, seed)  # (..., base_agent, base_channel)
        verifier_row = base[..., [self.verifier_index], :]
        mask = torch.cat([base, verifier_row, verifier_row], dim=-2)
        mask = torch.cat([mask, mask, mask], dim=-1)
        return mask & self._allowed_mask(mask.device)

    def can_agent_be_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        self._check_agent(agent_name)
        self._check_channel(channel_name)
        base_channel, _, kind = channel_name.rpartition("_")
        if kind not in self._channel_kind_allowed(agent_name):
            return False
        base_agent = "verifier" if agent_name in (ADVERSARIAL_VERIFIER, SIMULATOR) else agent_name
        return self.base_protocol.can_agent_be_active(base_agent, round, base_channel)

    def get_verifier_guess_mask(self, round: Tensor, seed: Tensor | None) -> Tensor:
        """The base verifier's guess mask (shared by the adversarial verifier)."""
        return self.base_protocol.get_verifier_guess_mask(round, seed)

    def reward_mid_point_estimate(self, agent_name: str) -> float:
        """Base agents as in the base protocol; 0 for the adversarial verifier and the
        simulator (their rewards are ± a cosine similarity)."""
        self._check_agent(agent_name)
        if agent_name in (ADVERSARIAL_VERIFIER, SIMULATOR):
            return 0.0
        return self.base_protocol.reward_mid_point_estimate(agent_name)

    # -- step ------------------------------------------------------------------------

    def step_interaction_protocol(self, inp: ProtocolStepInput) -> ProtocolStepOutput:
        """Base step for the base agents, plus the adversarial verifier and simulator.

        * adversarial verifier done = its decision counts (same rule as the verifier's)
          or it was already done; shared done = (verifier done & adversarial done) | done;
          every other agent's done = shared done;
        * terminated = the base protocol's;
        * simulator reward ``s`` (:meth:`simulator_reward`), adversarial verifier ``-s``,
          each prover its base reward ``+ aux_prover_reward_coefficient * s``.

        Inputs are never modified (fixed, docs/behaviour.md#b11).
        """
        self._check_step_input(inp)
        if inp.message_logits is None or inp.decision_logits is None:
            raise MissingStepInputError(
                f"protocol {self.display_name}: the step needs message_logits and decision_logits"
            )
        base_out = self.base_protocol.step_interaction_protocol(
            inp.restrict_agents(self.base_protocol.num_agents)
        )

        adv = self.adversarial_verifier_index
        guess_mask = self.get_verifier_guess_mask(inp.round, inp.seed)
        adversary_made = rules.decision_made_mask(
            inp.round, inp.label(), guess_mask, inp.decision[..., adv],
            min_message_rounds=self.min_message_rounds,
            force_guess=self.protocol_common.force_guess,
        )
        adversary_done = adversary_made | inp.agent_done[..., adv]
        verifier_done = base_out.agent_done[..., self.verifier_index]
        shared_done = (verifier_done & adversary_done) | inp.done

        agent_done = shared_done.unsqueeze(-1).expand(*shared_done.shape, self.num_agents).clone()
        agent_done[..., self.verifier_index] = verifier_done
        agent_done[..., adv] = adversary_done

        simulator = self.simulator_reward(inp.round, inp.seed, inp.message_logits, inp.decision_logits)
        extra = torch.zeros((*base_out.reward.shape[:-1], 2), dtype=base_out.reward.dtype,
                            device=base_out.reward.device)
        reward = torch.cat([base_out.reward, extra], dim=-1)
        reward[..., self.simulator_index] = simulator
        reward[..., adv] = -simulator
        aux = self.hyper_params.zk_protocol.aux_prover_reward_coefficient
        reward[..., self.prover_indices] += aux * simulator.unsqueeze(-1)

        return ProtocolStepOutput(shared_done=shared_done, agent_done=agent_done,
                                  terminated=base_out.terminated, reward=reward)

    def simulator_reward(
        self, round: Tensor, seed: Tensor | None, message_logits: Tensor, decision_logits: Tensor
    ) -> Tensor:
        """``coef * (cos(M_adv, M_sim) + cos(D_adv, D_sim))``, float ``(...)``.

        ``M_adv``: the adversarial verifier's message logits in the adversarial channel
        block, ``M_sim``: the simulator's in the simulator block, both zeroed in base
        channels where they are inactive and flattened over (channel, position, logit).
        ``D_*``: their decision logits, zeroed where the verifier cannot guess. The cosine
        of two zero vectors is 0.

        Parameters
        ----------
        message_logits : Tensor (..., agent, channel, position, n_logits)
        decision_logits : Tensor (..., agent, 3)
        """
        num_base = self.base_protocol.num_message_channels
        if message_logits.dim() < 4 or message_logits.shape[-4:-2] != (self.num_agents, 3 * num_base):
            raise ProtocolError(
                f"protocol {self.display_name}: message_logits must have shape (..., {self.num_agents}, "
                f"{3 * num_base}, position, n_logits), got {tuple(message_logits.shape)}"
            )
        adv, sim = self.adversarial_verifier_index, self.simulator_index
        # (..., agent, kind, base_channel, position * logit)
        grouped = message_logits.reshape(*message_logits.shape[:-3], 3, num_base, -1)
        active = self.get_active_agents_mask(round, seed)[..., adv, num_base:2 * num_base]
        active = active.unsqueeze(-1)
        # torch.where builds new tensors: the caller's logits are left untouched.
        adversary_messages = torch.where(active, grouped[..., adv, 1, :, :], 0.0).flatten(-2)
        simulator_messages = torch.where(active, grouped[..., sim, 2, :, :], 0.0).flatten(-2)
        message_similarity = torch.cosine_similarity(adversary_messages, simulator_messages, dim=-1)

        can_guess = self.get_verifier_guess_mask(round, seed).unsqueeze(-1)
        adversary_decision = torch.where(can_guess, decision_logits[..., adv, :], 0.0)
        simulator_decision = torch.where(can_guess, decision_logits[..., sim, :], 0.0)
        decision_similarity = torch.cosine_similarity(adversary_decision, simulator_decision, dim=-1)

        coefficient = self.hyper_params.zk_protocol.simulator_reward_coefficient
        return coefficient * (message_similarity + decision_similarity)
