"""Shared builders for the protocol tests (parameters, step inputs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nip_core.parameters import HyperParameters
from nip_core.protocols import ProtocolHandler, ProtocolStepInput, ProtocolStepOutput, build_protocol_handler

torch.set_num_threads(1)

# Distinct, non-default values so that a swapped or defaulted reward is caught.
P, V, T, N, I = 3.0, 2.0, -4.0, 8.0, -16.0
REWARDS = {
    "prover_reward": P,
    "verifier_reward": V,
    "verifier_terminated_penalty": T,
    "verifier_no_guess_reward": N,
    "verifier_incorrect_penalty": I,
}


def make_params(protocol: str, scenario: str = "graph_isomorphism", common: dict | None = None,
                **groups) -> HyperParameters:
    # spg reads spg.stackelberg_sequence (a field the trainer does not read is refused)
    trainer = "pure_text_ei" if scenario == "code_validation" else "spg" if "spg" in groups else "vanilla_ppo"
    return HyperParameters(scenario=scenario, trainer=trainer, dataset="test",
                           interaction_protocol=protocol,
                           protocol_common={**REWARDS, **(common or {})}, **groups)


def make_handler(protocol: str, scenario: str = "graph_isomorphism", common: dict | None = None,
                 **groups) -> ProtocolHandler:
    return build_protocol_handler(make_params(protocol, scenario, common, **groups))


@dataclass
class Row:
    """One batch row of a step; ``decision`` is the verifier's (other agents: ``other``)."""

    round: int
    y: int
    decision: int
    done: bool = False
    terminated: bool = False
    seed: int = 0
    stance: int | None = None
    other: int = 0


def step_input(handler: ProtocolHandler, rows: list[Row]) -> ProtocolStepInput:
    vi = handler.agent_names.index("verifier")
    decision = torch.tensor([[r.other] * handler.num_agents for r in rows])
    decision[:, vi] = torch.tensor([r.decision for r in rows])
    done = torch.tensor([r.done for r in rows])
    stances = [r.stance for r in rows]
    return ProtocolStepInput(
        round=torch.tensor([r.round for r in rows]),
        seed=torch.tensor([r.seed for r in rows]),
        y=torch.tensor([r.y for r in rows]),
        decision=decision,
        done=done,
        agent_done=done.unsqueeze(-1).expand(len(rows), handler.num_agents).clone(),
        terminated=torch.tensor([r.terminated for r in rows]),
        prover_stance=None if any(s is None for s in stances) else torch.tensor(stances),
    )


def step(handler: ProtocolHandler, rows: list[Row]) -> ProtocolStepOutput:
    return handler.step_interaction_protocol(step_input(handler, rows))


def schedule(handler: ProtocolHandler, seed: int = 0) -> list:
    """The active mask for rounds ``0 .. max-1`` as nested 0/1 lists ``[round][agent][channel]``."""
    rounds = torch.arange(handler.max_message_rounds)
    mask = handler.get_active_agents_mask(rounds, torch.full_like(rounds, seed))
    return mask.int().tolist()
