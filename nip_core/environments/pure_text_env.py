"""``PureTextEnvironment``: one text episode at a time, stepped by the protocol handler.

An episode state is a :class:`NestedArrayDict` with empty batch size holding ``round``,
``seed``, ``message_history`` (rounds, channels; ``None`` = no message),
``message_agent_id`` (rounds, channels; -1 = nobody), ``raw_message_history`` (rounds,
agents), ``y``, ``datapoint_id``, the flags ``done``/``terminated``/``agents.done`` and
scenario extras. A *timestep* is the state before the step, the agents' actions
(``agents.message``, ``agents.raw_message``, ``agents.decision``, ``agents.retry_count``,
``agents.token_limit``) and the outcome under ``next.*`` (rewards, flags, the updated
histories). A rollout is ``max_rounds`` stacked timesteps; those after the episode ended
are marked ``padding`` (zero reward, copies of the final state).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nip_core.environments.nested_array_dict import NestedArrayDict, stack_nested_array_dicts
from nip_core.protocols.step import ProtocolStepInput

NEXT_KEYS = ("round", "message_history", "message_agent_id", "raw_message_history", "done",
             "terminated", "agents.done", "agents.reward")


class DuplicateSenderError(RuntimeError):
    """Two agents sent a message on the same channel in the same round."""


def _none_array(shape: tuple[int, ...]) -> np.ndarray:
    arr = np.empty(shape, dtype=object)
    arr.fill(None)
    return arr


class PureTextEnvironment:
    """Text environment over a protocol handler.

    Parameters
    ----------
    protocol_handler
        The interaction protocol (agent names, channels, step rule).
    dataset
        The datapoints this environment's episodes are drawn from (``environment.dataset``,
        as in nip): the trainer's ``_sample_rollouts`` samples from it.
    """

    def __init__(self, protocol_handler: Any, dataset: Any = None):
        self.protocol_handler = protocol_handler
        self.dataset = dataset
        self.max_rounds = int(protocol_handler.max_message_rounds)
        self.agent_names = list(protocol_handler.agent_names)
        self.channel_names = list(protocol_handler.message_channel_names)

    # -- hooks for scenarios -------------------------------------------------------------

    def datapoint_fields(self, datapoint: Any) -> dict[str, Any]:
        """Extra observation fields taken from a datapoint (scenarios override)."""
        return {}

    def datapoint_kind(self, datapoint: Any) -> str | None:
        """The kind of a datapoint that the test statistics break accuracy down by (None: no kinds)."""
        return None

    # -- reset / step ----------------------------------------------------------------------

    def reset(self, datapoint: Any, seed: int, datapoint_id: int | None = None) -> NestedArrayDict:
        """A fresh episode state for ``datapoint`` with episode seed ``seed`` (in [0, 2**16))."""
        r, c, a = self.max_rounds, len(self.channel_names), len(self.agent_names)
        state = NestedArrayDict({
            "round": np.int64(0), "seed": np.int64(seed % 2**16),
            "message_history": _none_array((r, c)),
            "message_agent_id": np.full((r, c), -1, dtype=np.int64),
            "raw_message_history": _none_array((r, a)),
            "y": np.int64(int(getattr(datapoint, "y"))),
            "datapoint_id": np.int64(datapoint_id if datapoint_id is not None else 0),
            "done": np.bool_(False), "terminated": np.bool_(False), "padding": np.bool_(False),
            "agents.done": np.zeros(a, dtype=bool), "agents.reward": np.zeros(a, dtype=np.float64),
        })
        for key, value in self.datapoint_fields(datapoint).items():
            state[key] = value
        return state

    def active_mask(self, state: NestedArrayDict) -> np.ndarray:
        """Bool (agents, channels): who may send where in the state's round."""
        rnd = torch.tensor([int(state["round"])])
        seed = torch.tensor([int(state["seed"])])
        return self.protocol_handler.get_active_agents_mask(rnd, seed)[0].numpy()

    def step(self, state: NestedArrayDict, actions: dict[str, np.ndarray]) -> NestedArrayDict:
        """Apply the agents' ``actions`` to ``state``; return the timestep (state, actions, next.*).

        Raises
        ------
        DuplicateSenderError
            If two agents sent on one channel in this round.
        """
        a, c = len(self.agent_names), len(self.channel_names)
        rnd = int(state["round"])
        message = actions["message"]
        history = state["message_history"].copy()
        sender = state["message_agent_id"].copy()
        raw_history = state["raw_message_history"].copy()
        for ch in range(c):
            senders = [i for i in range(a) if message[i, ch] is not None]
            if len(senders) > 1:
                raise DuplicateSenderError(
                    f"round {rnd}, channel '{self.channel_names[ch]}': agents "
                    f"{[self.agent_names[i] for i in senders]} all sent a message")
            if senders and rnd < self.max_rounds:
                history[rnd, ch] = message[senders[0], ch]
                sender[rnd, ch] = senders[0]
        if rnd < self.max_rounds:
            raw_history[rnd] = actions["raw_message"]
        decision = torch.as_tensor(np.asarray(actions["decision"], dtype=np.int64)).unsqueeze(0)
        inp = ProtocolStepInput(
            round=torch.tensor([rnd]), seed=torch.tensor([int(state["seed"])]),
            y=torch.tensor([int(state["y"])]), decision=decision,
            done=torch.tensor([bool(state["done"])]),
            agent_done=torch.as_tensor(state["agents.done"]).unsqueeze(0),
            terminated=torch.tensor([bool(state["terminated"])]),
            prover_stance=torch.tensor([int(state["prover_stance"])]) if "prover_stance" in state else None)
        out = self.protocol_handler.step_interaction_protocol(inp)
        timestep = state.clone()
        for key in ("message", "raw_message", "decision", "retry_count", "token_limit"):
            if key in actions:
                timestep[f"agents.{key}"] = actions[key]
        timestep.update({
            "next.round": np.int64(rnd + 1), "next.message_history": history,
            "next.message_agent_id": sender, "next.raw_message_history": raw_history,
            "next.done": np.bool_(out.shared_done[0].item()),
            "next.terminated": np.bool_(out.terminated[0].item()),
            "next.agents.done": out.agent_done[0].numpy().astype(bool),
            "next.agents.reward": out.reward[0].numpy().astype(np.float64),
        })
        return timestep

    def next_state(self, timestep: NestedArrayDict) -> NestedArrayDict:
        """The state after ``timestep`` (its ``next.*`` keys lifted, action keys dropped)."""
        state = NestedArrayDict({k: v for k, v in timestep.items()
                                 if not k.startswith("next.") and not k.startswith("agents.")
                                 or k in ("agents.done", "agents.reward")})
        for key in NEXT_KEYS:
            state[key] = timestep[f"next.{key}"]
        state["padding"] = np.bool_(False)
        return state

    def padding_timestep(self, state: NestedArrayDict) -> NestedArrayDict:
        """A filler timestep after the episode ended: no actions, zero reward, same state."""
        a, c = len(self.agent_names), len(self.channel_names)
        ts = state.clone()
        ts["padding"] = np.bool_(True)
        ts.update({"agents.message": _none_array((a, c)), "agents.raw_message": _none_array((a,)),
                   "agents.decision": np.full(a, 2, dtype=np.int64),
                   "agents.retry_count": np.zeros((a, c), dtype=np.int64),
                   "agents.token_limit": np.zeros((a, c), dtype=bool)})
        for key in NEXT_KEYS:
            ts[f"next.{key}"] = state[key]
        ts["next.round"] = state["round"]
        ts["next.done"] = np.bool_(True)
        ts["next.agents.reward"] = np.zeros(a, dtype=np.float64)
        return ts

    def run_episode(self, state: NestedArrayDict, act) -> NestedArrayDict:
        """Roll out one episode with ``act(state) -> actions``; padded to ``max_rounds`` steps."""
        steps: list[NestedArrayDict] = []
        ended = False
        for _ in range(self.max_rounds):
            if ended:
                steps.append(self.padding_timestep(state))
                continue
            ts = self.step(state, act(state))
            steps.append(ts)
            ended = bool(ts["next.done"]) or bool(ts["next.terminated"])
            state = self.next_state(ts)
        return stack_nested_array_dicts(steps)
