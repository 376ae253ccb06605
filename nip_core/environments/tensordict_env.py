"""``TensorDictEnvironment``: the batched TorchRL environment of an interaction protocol.

One environment holds ``num_envs`` independent episodes (``batch_size == (num_envs,)``).
Each step every agent proposes a message (one index of the scenario's message space per
channel and position) and a decision; the messages of the agents active this round are
written into the message history, and the protocol handler computes rewards and done
flags (docs/behaviour.md#b13).

Layout of the tensordict (``B = num_envs``, ``A`` agents, ``R`` rounds, ``C`` channels,
``M = message_size``, ``S`` = the message-space shape):

* root: ``round (B,)``, ``seed (B,)``, ``decision_restriction (B,)``,
  ``x``/``message_history (B, R, C, M, *S)``, ``message (B, C, M, *S)``, ``y (B,)``,
  ``datapoint_id (B,)``, ``done``/``terminated (B, 1)``, plus scenario keys;
* ``agents`` (batch ``(B, A)``): actions ``decision``, the scenario's selection key
  ``(B, A, C, M)``, ``main_message_logits (B, A, C, M, prod(S))``,
  ``decision_logits (B, A, 3)``; ``reward``/``done``/``terminated (B, A, 1)``.

Deviations from the original, on purpose:

* Episode seeds and the data order come from the environment's own generator (seeded by
  ``set_seed``), never from the global torch RNG, so an environment is deterministic per
  seed and its RNG state can be checkpointed (:meth:`get_rng_state`).
* ``("agents", "done")`` also includes termination (the original only set it from the
  protocol's agent-done, so a timed-out episode was not a trajectory boundary for GAE),
  and ``("agents", "terminated")`` equals it: an episode ended by a decision is terminal
  too (the original copied the root ``terminated``, i.e. time-outs only, so GAE
  bootstrapped from the value of the state after a decision). The root ``terminated``
  keeps the protocol's meaning (the episode timed out).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Binary, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from nip_core.environments.data_cycler import VariableDataCycler
from nip_core.protocols.step import ProtocolStepInput

SEED_RANGE = 2**16


def environment_sizes(hyper_params, protocol_handler, dataset_length: int) -> tuple[int, int, int]:
    """``(steps_per_env, frames_per_batch, num_envs)`` by the rules of docs/behaviour.md#b12.

    Raises
    ------
    ValueError
        If ``rl.steps_per_env_per_iteration`` does not divide ``rl.frames_per_batch``.
    """
    rl = hyper_params.rl
    steps = rl.steps_per_env_per_iteration or protocol_handler.max_message_rounds
    if rl.frames_per_batch is not None:
        if rl.frames_per_batch % steps != 0:
            raise ValueError(f"rl.frames_per_batch ({rl.frames_per_batch}) must be a multiple of "
                             f"the steps per environment ({steps})")
        frames = rl.frames_per_batch
    elif rl.rollouts_per_iteration is not None:
        frames = rl.rollouts_per_iteration * steps
    else:
        frames = dataset_length * steps
    return steps, frames, frames // steps


def gather_datapoints(dataset, indices: torch.Tensor) -> TensorDictBase:
    """Rows ``indices`` of a dataset (any object indexable by a LongTensor, or with ``.data``)."""
    data = getattr(dataset, "data", None)
    if isinstance(data, TensorDictBase):
        return data[indices]
    return dataset[indices]


class TensorDictEnvironment(EnvBase):
    """Batched environment driven by a protocol handler; scenarios subclass it.

    Parameters
    ----------
    hyper_params
        The experiment's parameters (sizes, message size).
    dataset
        The datapoints episodes are drawn from (``y`` and the scenario's keys).
    protocol_handler
        Who speaks when, and the rewards (``nip_core.protocols`` interface).
    seed
        Seed of the environment's private generator (episode seeds and data order).
    device
        Torch device of the tensors.
    """

    #: name of the action key holding the selected message index (scenario-specific)
    main_message_out_key: str = "message_selected"
    #: keys the scenario copies from the datapoint at reset and passes through each step
    datapoint_keys: tuple[str, ...] = ()

    def __init__(self, hyper_params, dataset, protocol_handler, seed: int = 0, device: str = "cpu"):
        super().__init__(device=device, batch_size=torch.Size([0]))
        self.hyper_params = hyper_params
        self.dataset = dataset
        self.protocol_handler = protocol_handler
        self.steps_per_env, self.frames_per_batch, self.num_envs = environment_sizes(
            hyper_params, protocol_handler, len(dataset))
        self.batch_size = torch.Size([self.num_envs])
        self.num_agents = len(protocol_handler.agent_names)
        self.num_channels = len(protocol_handler.message_channel_names)
        self.max_rounds = protocol_handler.max_message_rounds
        self.message_size = hyper_params.message_size
        self.rng = torch.Generator()
        self._set_seed(seed)
        self._make_specs()

    # -- scenario hooks ------------------------------------------------------------------

    @property
    @abstractmethod
    def main_message_space_shape(self) -> tuple[int, ...]:
        """Shape ``S`` of one message (e.g. ``(2, max_nodes)`` for graph isomorphism)."""

    def _scenario_observation_specs(self) -> dict[str, Any]:
        """Extra observation specs (batch dims included)."""
        return {}

    # -- specs -----------------------------------------------------------------------------

    @property
    def num_message_logits(self) -> int:
        return math.prod(self.main_message_space_shape)

    def _make_specs(self) -> None:
        B, A, R, C, M = self.num_envs, self.num_agents, self.max_rounds, self.num_channels, self.message_size
        S = self.main_message_space_shape
        long = torch.long
        self.observation_spec = Composite(
            round=Categorical(R + 1, shape=(B,), dtype=long),
            decision_restriction=Categorical(3, shape=(B,), dtype=long),
            x=Unbounded(shape=(B, R, C, M, *S), dtype=torch.float32),
            message_history=Unbounded(shape=(B, R, C, M, *S), dtype=torch.float32),
            message=Unbounded(shape=(B, C, M, *S), dtype=torch.float32),
            seed=Categorical(SEED_RANGE, shape=(B,), dtype=long),
            **self._scenario_observation_specs(),
            shape=(B,),
        )
        self.state_spec = Composite(
            y=Categorical(2, shape=(B,), dtype=long),
            datapoint_id=Categorical(max(len(self.dataset), 1), shape=(B,), dtype=long),
            shape=(B,),
        )
        self.action_spec = Composite(
            agents=Composite(
                decision=Categorical(3, shape=(B, A), dtype=long),
                **{self.main_message_out_key: Categorical(self.num_message_logits, shape=(B, A, C, M),
                                                          dtype=long)},
                main_message_logits=Unbounded(shape=(B, A, C, M, self.num_message_logits)),
                decision_logits=Unbounded(shape=(B, A, 3)),
                shape=(B, A),
            ),
            shape=(B,),
        )
        self.reward_spec = Composite(
            agents=Composite(reward=Unbounded(shape=(B, A, 1)), shape=(B, A)), shape=(B,))
        self.done_spec = Composite(
            done=Binary(shape=(B, 1), dtype=torch.bool),
            terminated=Binary(shape=(B, 1), dtype=torch.bool),
            agents=Composite(
                done=Binary(shape=(B, A, 1), dtype=torch.bool),
                terminated=Binary(shape=(B, A, 1), dtype=torch.bool),
                shape=(B, A),
            ),
            shape=(B,),
        )

    # -- RNG ---------------------------------------------------------------------------------

    def _set_seed(self, seed: int | None) -> None:
        self.rng = torch.Generator().manual_seed(int(seed or 0))
        self.cycler = VariableDataCycler(len(self.dataset), self.rng)

    def get_rng_state(self) -> dict[str, Any]:
        """Everything random about the environment (generator + position in the data)."""
        return {"generator": self.rng.get_state(), "cycler": self.cycler.state_dict()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.rng.set_state(state["generator"])
        self.cycler.load_state_dict(state["cycler"])

    # -- reset -------------------------------------------------------------------------------

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        B = self.num_envs
        if tensordict is not None and "_reset" in tensordict.keys():
            reset_mask = tensordict["_reset"].reshape(B, -1).any(-1)
        elif tensordict is not None and ("agents", "_reset") in tensordict.keys(True):
            reset_mask = tensordict["agents", "_reset"].reshape(B, -1).any(-1)
        else:
            reset_mask = torch.ones(B, dtype=torch.bool)
        out = self.observation_spec.zero()
        out.update(self.state_spec.zero())
        out.update(self.done_spec.zero())
        n = int(reset_mask.sum())
        if n > 0:
            # The dataset, the data cycler and the seed generator live on the CPU; what they
            # give is moved to the device of the observation (CUDA environments).
            device = out["seed"].device
            rows = reset_mask.nonzero().squeeze(-1).to(device)
            indices = self.cycler.next_indices(n)
            data = gather_datapoints(self.dataset, indices)
            out["seed"][rows] = torch.randint(0, SEED_RANGE, (n,), generator=self.rng).to(device)
            out["y"][rows] = data["y"].reshape(n).to(device, torch.long)
            out["datapoint_id"][rows] = indices.to(device)
            for key in self.datapoint_keys:
                out[key][rows] = data[key].to(device, out[key].dtype)
        return out.to(self.device) if self.device is not None else out

    # -- step --------------------------------------------------------------------------------

    def _compute_message(self, env_td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """``(message, message_history)`` after this round's active agents have spoken."""
        B, C, M = self.num_envs, self.num_channels, self.message_size
        S = self.main_message_space_shape
        round_ = env_td["round"]
        active = self.protocol_handler.get_active_agents_mask(round_, env_td["seed"])  # (B, A, C)
        selected = env_td["agents", self.main_message_out_key]  # (B, A, C, M)
        one_hot = F.one_hot(selected, self.num_message_logits).float()
        one_hot = one_hot * active[..., None, None].to(one_hot.dtype)
        # Two agents choosing the same index on one channel give 2, as in the original.
        message = one_hot.sum(1).reshape(B, C, M, *S)
        in_round = F.one_hot(round_.clamp(max=self.max_rounds - 1), self.max_rounds).bool()
        in_round = in_round.reshape(B, self.max_rounds, *([1] * (message.dim() - 1)))
        history = torch.where(in_round, message.unsqueeze(1), env_td["message_history"])
        return message, history

    def _step(self, env_td: TensorDictBase) -> TensorDictBase:
        B, A = self.num_envs, self.num_agents
        message, history = self._compute_message(env_td)
        next_td = TensorDict(
            {
                "round": env_td["round"] + 1,
                "seed": env_td["seed"].clone(),
                "y": env_td["y"].clone(),
                "datapoint_id": env_td["datapoint_id"].clone(),
                "message": message,
                "message_history": history,
                "x": history.clone(),
                "decision_restriction": torch.zeros(B, dtype=torch.long, device=message.device),
            },
            batch_size=self.batch_size,
            device=self.device,
        )
        for key in self.datapoint_keys:
            next_td[key] = env_td[key].clone()
        message_logits = decision_logits = None
        agents_td = env_td["agents"]
        if "main_message_logits" in agents_td.keys():
            message_logits = agents_td["main_message_logits"]
        if "decision_logits" in agents_td.keys():
            decision_logits = agents_td["decision_logits"]
        out = self.protocol_handler.step_interaction_protocol(ProtocolStepInput(
            round=env_td["round"],
            seed=env_td["seed"],
            y=env_td["y"],
            decision=agents_td["decision"],
            done=env_td["done"].reshape(B),
            agent_done=env_td["agents", "done"].reshape(B, A),
            terminated=env_td["terminated"].reshape(B),
            message_logits=message_logits,
            decision_logits=decision_logits,
        ))
        terminated = out.terminated.reshape(B)
        done = out.shared_done.reshape(B) | terminated
        agent_done = out.agent_done.reshape(B, A) | terminated[:, None]
        next_td["done"] = done.unsqueeze(-1)
        next_td["terminated"] = terminated.unsqueeze(-1)
        next_td["agents"] = TensorDict(
            {
                "reward": out.reward.reshape(B, A, 1).float(),
                "done": agent_done.unsqueeze(-1),
                # Every end of an episode is terminal for the agents (a decision or a
                # time-out, both rewarded by the protocol): GAE must not bootstrap past it.
                "terminated": agent_done.unsqueeze(-1).clone(),
            },
            batch_size=(B, A),
            device=self.device,
        )
        return next_td
