"""Base classes of the protocol handlers.

``ProtocolHandler`` is the interface every protocol implements (agents, channels,
visibility, who speaks when, the step that yields dones and rewards).
``SingleVerifierProtocolHandler`` implements the step for protocols with one verifier
(the rules live in :mod:`nip_core.protocols.rules`), and
``DeterministicSingleVerifierProtocolHandler`` turns a scalar schedule
``is_agent_active(agent, round, channel)`` into a precomputed
``active_agents_mask[round, agent, channel]`` table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import Tensor

from nip_core.parameters import CommonProtocolParameters, HyperParameters
from nip_core.protocols import rules
from nip_core.protocols.errors import (
    ProtocolError,
    ProtocolSpecificationError,
    UnknownAgentError,
)
from nip_core.protocols.step import ProtocolStepInput, ProtocolStepOutput


class ProtocolHandler(ABC):
    """An interaction protocol: its agents, channels, schedule and rewards.

    Concrete protocols list their agents, channels and visibility in the class constants
    ``AGENTS``, ``CHANNELS`` and ``VISIBILITY`` (or override the matching properties) and
    implement the abstract methods.

    Parameters
    ----------
    hyper_params : HyperParameters
        The experiment's parameters (``protocol_common``, the protocol's own group, and
        ``spg.stackelberg_sequence`` are read).
    """

    AGENTS: ClassVar[tuple[str, ...]] = ()
    CHANNELS: ClassVar[tuple[str, ...]] = ()
    VISIBILITY: ClassVar[tuple[tuple[str, str], ...]] = ()

    is_deterministic: ClassVar[bool] = False
    can_be_zero_knowledge: ClassVar[bool] = True

    def __init__(self, hyper_params: HyperParameters):
        self.hyper_params = hyper_params
        self._check_names()

    # -- identity -------------------------------------------------------------------

    @property
    def display_name(self) -> str:
        """A label for error messages."""
        return type(self).__name__

    @property
    def protocol_common(self) -> CommonProtocolParameters:
        return self.hyper_params.protocol_common

    @property
    def agent_names(self) -> list[str]:
        """Agent names; index = agent index in every ``agent`` tensor dim."""
        return list(self.AGENTS)

    @property
    def message_channel_names(self) -> list[str]:
        return list(self.CHANNELS)

    @property
    def agent_channel_visibility(self) -> list[tuple[str, str]]:
        """``(agent, channel)`` pairs: the agent sees (and may write to) the channel."""
        return list(self.VISIBILITY)

    @cached_property
    def prover_names(self) -> list[str]:
        return [a for a in self.agent_names if "prover" in a]

    @property
    def verifier_names(self) -> list[str]:
        return [a for a in self.agent_names if "verifier" in a]

    @cached_property
    def prover_indices(self) -> list[int]:
        return [self.agent_names.index(a) for a in self.prover_names]

    @cached_property
    def verifier_indices(self) -> list[int]:
        return [self.agent_names.index(a) for a in self.verifier_names]

    @property
    def num_agents(self) -> int:
        return len(self.agent_names)

    @property
    def num_message_channels(self) -> int:
        return len(self.message_channel_names)

    @cached_property
    def agent_channel_visibility_mask(self) -> Tensor:
        """Bool ``(agent, channel)``: ``True`` where the agent sees the channel."""
        mask = torch.zeros(self.num_agents, self.num_message_channels, dtype=torch.bool)
        for agent, channel in self.agent_channel_visibility:
            mask[self.agent_names.index(agent), self.message_channel_names.index(channel)] = True
        return mask

    def can_agent_see_channel(self, agent_name: str, channel_name: str) -> bool:
        return (agent_name, channel_name) in self.agent_channel_visibility

    def agent_visible_channels(self, agent_name: str) -> list[str]:
        """The channels ``agent_name`` sees, in visibility order."""
        self._check_agent(agent_name)
        return [c for a, c in self.agent_channel_visibility if a == agent_name]

    # -- rounds ----------------------------------------------------------------------

    #: Fixed round limits of protocols without a parameter group (adp, merlin_arthur...).
    MAX_MESSAGE_ROUNDS: ClassVar[int | None] = None
    MIN_MESSAGE_ROUNDS: ClassVar[int | None] = None

    @property
    def protocol_params(self) -> Any:
        """The parameter group with ``max/min_message_rounds`` (protocols with fixed limits:
        none; they set ``MAX_MESSAGE_ROUNDS`` / ``MIN_MESSAGE_ROUNDS`` instead)."""
        raise NotImplementedError(f"{type(self).__name__} has no protocol parameter group")

    @property
    def max_message_rounds(self) -> int:
        """Number of rounds; round ids are ``0 .. max_message_rounds - 1``."""
        if self.MAX_MESSAGE_ROUNDS is not None:
            return self.MAX_MESSAGE_ROUNDS
        return self.protocol_params.max_message_rounds

    @property
    def min_message_rounds(self) -> int:
        """Verifier decisions before round ``min_message_rounds - 1`` are ignored."""
        if self.MIN_MESSAGE_ROUNDS is not None:
            return self.MIN_MESSAGE_ROUNDS
        return self.protocol_params.min_message_rounds

    @property
    @abstractmethod
    def max_verifier_questions(self) -> int:
        """How many turns the verifier gets (fills ``$max_questions`` in text prompts)."""

    # -- schedule --------------------------------------------------------------------

    @abstractmethod
    def get_active_agents_mask(self, round: Tensor, seed: Tensor | None) -> Tensor:
        """Bool ``(..., agent, channel)``: who sends a message in which channel.

        Parameters
        ----------
        round : LongTensor (...)
        seed : LongTensor (...) or None
            Per-episode seed; deterministic protocols ignore it (``None`` allowed).
        """

    @abstractmethod
    def can_agent_be_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        """Whether the agent speaks in the channel that round (non-deterministic
        protocols: with some probability)."""

    def can_agent_be_active_any_channel(self, agent_name: str, round: int) -> bool:
        return any(self.can_agent_be_active(agent_name, round, c) for c in self.message_channel_names)

    @abstractmethod
    def get_verifier_guess_mask(self, round: Tensor, seed: Tensor | None) -> Tensor:
        """Bool ``(...)``: the verifier may decide this round."""

    @cached_property
    def agent_first_active_round(self) -> dict[str, int]:
        """First round (``< max_message_rounds``) in which each agent can be active.

        Agents that are never active within the episode are left out.
        """
        first: dict[str, int] = {}
        for agent in self.agent_names:
            for round_id in range(self.max_message_rounds):
                if self.can_agent_be_active_any_channel(agent, round_id):
                    first[agent] = round_id
                    break
        return first

    # -- training-related ------------------------------------------------------------

    def reward_mid_point_estimate(self, agent_name: str) -> float:
        """Reward expected under random play, the "positive response" threshold of MALT.

        Verifiers: midway between ``verifier_reward`` and ``verifier_incorrect_penalty``;
        other agents: half of ``prover_reward``.
        """
        self._check_agent(agent_name)
        common = self.protocol_common
        if agent_name in self.verifier_names:
            return (common.verifier_reward + common.verifier_incorrect_penalty) / 2
        return common.prover_reward / 2

    @property
    def default_stackelberg_sequence(self) -> tuple[tuple[str, ...], ...]:
        """Verifiers lead; all other agents follow as one group, in ``agent_names`` order.

        (Fixed, docs/behaviour.md#b9: the original built the follower group from a set.) An empty
        follower group (solo verifier) is left out.
        """
        followers = tuple(a for a in self.agent_names if a not in self.verifier_names)
        return tuple(group for group in (tuple(self.verifier_names), followers) if group)

    @cached_property
    def stackelberg_sequence(self) -> tuple[tuple[str, ...], ...]:
        """``spg.stackelberg_sequence`` if set (validated), else the default sequence."""
        given = self.hyper_params.spg.stackelberg_sequence
        if given is None:
            return self.default_stackelberg_sequence
        sequence = tuple(tuple(group) for group in given)
        flat = [a for group in sequence for a in group]
        unknown = sorted(set(flat) - set(self.agent_names))
        missing = [a for a in self.agent_names if a not in flat]
        repeated = sorted({a for a in flat if flat.count(a) > 1})
        if unknown or missing or repeated or any(len(g) == 0 for g in sequence):
            raise ProtocolSpecificationError(
                f"spg.stackelberg_sequence={given!r} must list each agent of protocol "
                f"{self.display_name} {self.agent_names} exactly once in non-empty groups "
                f"(unknown: {unknown}, missing: {missing}, repeated: {repeated})"
            )
        return sequence

    # -- step ------------------------------------------------------------------------

    @abstractmethod
    def step_interaction_protocol(self, inp: ProtocolStepInput) -> ProtocolStepOutput:
        """Dones, termination and rewards of one environment step."""

    # -- helpers ---------------------------------------------------------------------

    def _check_agent(self, agent_name: str) -> None:
        if agent_name not in self.agent_names:
            raise UnknownAgentError(self.display_name, agent_name, self.agent_names)

    def _check_channel(self, channel_name: str) -> None:
        if channel_name not in self.message_channel_names:
            raise UnknownAgentError(self.display_name, channel_name, self.message_channel_names, "channel")

    def _check_names(self) -> None:
        agents, channels = self.agent_names, self.message_channel_names
        if len(set(agents)) != len(agents) or len(set(channels)) != len(channels):
            raise ProtocolSpecificationError(
                f"protocol {self.display_name}: duplicate agent or channel names ({agents}, {channels})"
            )
        for agent, channel in self.agent_channel_visibility:
            if agent not in agents or channel not in channels:
                raise ProtocolSpecificationError(
                    f"protocol {self.display_name}: visibility pair ({agent!r}, {channel!r}) names an "
                    f"unknown agent or channel"
                )

    def _check_step_input(self, inp: ProtocolStepInput) -> None:
        for field in ("decision", "agent_done"):
            value = getattr(inp, field)
            if value.shape[-1] != self.num_agents:
                raise ProtocolError(
                    f"protocol {self.display_name}: step input '{field}' has {value.shape[-1]} agents in "
                    f"its last dim, expected {self.num_agents} ({self.agent_names})"
                )


class SingleVerifierProtocolHandler(ProtocolHandler, ABC):
    """A protocol whose only decisive agent is the verifier ``VERIFIER_NAME``.

    The step (see :meth:`step_interaction_protocol`) follows the rules of
    :mod:`nip_core.protocols.rules`; subclasses change the prover pay by overriding
    :meth:`_prover_reward_stances` or :meth:`_include_prover_rewards`, and termination by
    overriding :meth:`_new_terminated_mask`.
    """

    VERIFIER_NAME: ClassVar[str] = "verifier"

    @property
    def verifier_names(self) -> list[str]:
        return [self.VERIFIER_NAME]

    @cached_property
    def verifier_index(self) -> int:
        return self.agent_names.index(self.VERIFIER_NAME)

    def get_verifier_guess_mask(self, round: Tensor, seed: Tensor | None) -> Tensor:
        return self.get_active_agents_mask(round, seed)[..., self.verifier_index, :].any(dim=-1)

    def decision_made_mask(self, round: Tensor, y: Tensor, guess_mask: Tensor, decision: Tensor) -> Tensor:
        """Bool ``(...)``: the decision (of any decisive agent) counts this step."""
        return rules.decision_made_mask(
            round, y, guess_mask, decision,
            min_message_rounds=self.min_message_rounds,
            force_guess=self.protocol_common.force_guess,
        )

    def _new_terminated_mask(self, round: Tensor, decision_made: Tensor) -> Tensor:
        return rules.new_terminated_mask(round, decision_made, max_message_rounds=self.max_message_rounds)

    def step_interaction_protocol(self, inp: ProtocolStepInput) -> ProtocolStepOutput:
        """One step: the verifier's decision ends the episode; rewards per the rules.

        ``shared_done = done | made``; ``terminated = terminated | terminated_now``;
        ``agent_done = agent_done | shared_done``; rewards: verifier per
        :func:`rules.verifier_reward`, provers per :meth:`_include_prover_rewards`.
        """
        self._check_step_input(inp)
        y = inp.label()
        verifier_decision = inp.decision[..., self.verifier_index]
        guess_mask = self.get_verifier_guess_mask(inp.round, inp.seed)
        made = self.decision_made_mask(inp.round, y, guess_mask, verifier_decision)

        shared_done = inp.done | made
        terminated_now = self._new_terminated_mask(inp.round, made)
        terminated = inp.terminated | terminated_now

        reward = torch.zeros(
            (*shared_done.shape, self.num_agents), dtype=torch.float32, device=shared_done.device
        )
        reward[..., self.verifier_index] = rules.verifier_reward(
            y=y, decision=verifier_decision, decision_made=made, guess_mask=guess_mask,
            shared_done=shared_done, terminated=terminated, terminated_now=terminated_now,
            common=self.protocol_common,
        )
        self._include_prover_rewards(reward, made, verifier_decision, inp)

        agent_done = inp.agent_done | shared_done.unsqueeze(-1)
        return ProtocolStepOutput(shared_done=shared_done, agent_done=agent_done,
                                  terminated=terminated, reward=reward)

    def _include_prover_rewards(
        self, reward: Tensor, decision_made: Tensor, verifier_decision: Tensor, inp: ProtocolStepInput
    ) -> None:
        """Write the provers' rewards into ``reward`` (``(..., agent)``, in place).

        ``protocol_common.shared_reward``: each prover gets the verifier's reward;
        otherwise each prover is paid ``prover_reward`` iff the decision was made and
        equals the stance that :meth:`_prover_reward_stances` gives it.
        """
        if not self.prover_indices:
            return
        if self.protocol_common.shared_reward:
            reward[..., self.prover_indices] = reward[..., [self.verifier_index]]
            return
        stances = self._prover_reward_stances(inp).to(verifier_decision.device)
        reward[..., self.prover_indices] = rules.stance_prover_rewards(
            decision=verifier_decision, decision_made=decision_made, stances=stances,
            prover_reward=self.protocol_common.prover_reward,
        )

    def _prover_reward_stances(self, inp: ProtocolStepInput) -> Tensor:
        """LongTensor broadcastable to ``(..., prover)``: the decision each prover is paid for.

        Default: one prover accept; two provers prover 0 reject, prover 1 accept.
        """
        return torch.tensor(rules.default_prover_stances(len(self.prover_names), self.display_name))


class DeterministicSingleVerifierProtocolHandler(SingleVerifierProtocolHandler, ABC):
    """A single-verifier protocol whose schedule depends on the round only.

    Subclasses implement :meth:`is_agent_active`; construction precomputes
    ``active_agents_mask[round, agent, channel]`` for ``round < max_message_rounds`` and
    checks that no agent speaks in a channel it cannot see.
    """

    is_deterministic: ClassVar[bool] = True

    def __init__(self, hyper_params: HyperParameters):
        super().__init__(hyper_params)
        self._validate_active_agents()
        self._mask_by_device: dict[torch.device, Tensor] = {}

    @abstractmethod
    def is_agent_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        """The schedule: whether the agent speaks in the channel in that round."""

    def can_agent_be_active(self, agent_name: str, round: int, channel_name: str) -> bool:
        self._check_agent(agent_name)
        self._check_channel(channel_name)
        return bool(self.is_agent_active(agent_name, round, channel_name))

    @cached_property
    def active_agents_by_round(self) -> list[dict[str, list[str]]]:
        """``[round][channel]`` -> names of the agents active there."""
        return [
            {c: [a for a in self.agent_names if self.is_agent_active(a, r, c)]
             for c in self.message_channel_names}
            for r in range(self.max_message_rounds)
        ]

    @cached_property
    def active_agents_mask(self) -> Tensor:
        """Bool ``(round, agent, channel)`` for every round ``0 .. max_message_rounds - 1``."""
        mask = torch.zeros(self.max_message_rounds, self.num_agents, self.num_message_channels,
                           dtype=torch.bool)
        for r, by_channel in enumerate(self.active_agents_by_round):
            for c, channel in enumerate(self.message_channel_names):
                for agent in by_channel[channel]:
                    mask[r, self.agent_names.index(agent), c] = True
        return mask

    def get_active_agents_mask(self, round: Tensor, seed: Tensor | None = None) -> Tensor:
        """Table lookup; rounds ``>= max_message_rounds`` (after the end) have nobody active."""
        table = self._mask_by_device.get(round.device)
        if table is None:
            padded = torch.cat([self.active_agents_mask, torch.zeros_like(self.active_agents_mask[:1])])
            table = self._mask_by_device[round.device] = padded.to(round.device)
        return table[round.clamp(max=self.max_message_rounds)]

    def get_verifier_guess_mask(self, round: Tensor, seed: Tensor | None = None) -> Tensor:
        return super().get_verifier_guess_mask(round, seed)

    @property
    def max_verifier_questions(self) -> int:
        """Rounds in which the verifier is active (fixed, docs/behaviour.md#b8: counted from the schedule,
        so the sequential 3-cycle variants are right too)."""
        return int(self.active_agents_mask[:, self.verifier_index, :].any(dim=-1).sum())

    def _validate_active_agents(self) -> None:
        for r, by_channel in enumerate(self.active_agents_by_round):
            for channel, agents in by_channel.items():
                for agent in agents:
                    if not self.can_agent_see_channel(agent, channel):
                        raise ProtocolSpecificationError(
                            f"protocol {self.display_name}: agent {agent!r} is active in round {r} in "
                            f"channel {channel!r}, which it cannot see"
                        )
