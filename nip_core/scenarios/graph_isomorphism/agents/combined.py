"""All agents of a graph-isomorphism experiment as one module (docs/behaviour.md#b19, #b20).

The agents are built first, as :class:`~nip_core.agents.base.Agent`\\ s
(:mod:`~nip_core.scenarios.graph_isomorphism.agents.parts`); ``CombinedAgents`` takes their
parts into ``ModuleDict``s keyed by agent name (``policy_body`` — which holds ``body`` when
actor and critic share it —, ``value_body``, ``policy_head``, ``value_head``,
``solo_head``; these names are the checkpoint keys) and runs them on an environment
tensordict, stacking results along an ``agent`` dim under the ``agents`` key:

* each body sees only its agent's visible channels of ``x`` and ``message``, and ignores
  the message in round 0;
* message logits are expanded back to all channels (invisible ones −1e9), provers may only
  pick a node of the graph opposite to the latest message (graph 0 when there is none),
  and absent nodes are masked (−1e9) for everyone.

``decision_restriction`` is not applied: the environment always sets it to 0 (docs/behaviour.md#b19),
which restricts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from nip_core.agents.base import Agent, check_part_keys
from nip_core.agents.lr_groups import body_groups, drop_frozen, head_group, shared_body_groups
from nip_core.scenarios.graph_isomorphism.agents.parts import agent_part_flags, build_agents
from nip_core.scenarios.graph_isomorphism.agents.stacked import can_stack, stacked_bodies_forward

MASK_VALUE = -1e9

#: What a part may read: the environment's keys, restricted to the agent's visible channels
#: (the label ``y`` is read by the oracle prover's head alone).
AGENT_INPUT_KEYS = frozenset({"x", "adjacency", "message", "node_mask", "ignore_message", "round", "y"})
BODY_OUTPUT_KEYS = ("graph_level_repr", "node_level_repr")
POLICY_HEAD_OUTPUT_KEYS = ("node_selected_logits", "decision_logits")


class CombinedAgents(nn.Module):
    """Every agent's body and heads, run together on an environment tensordict.

    The parts are those of the given :class:`~nip_core.agents.base.Agent`\\ s (the same
    module objects, so training this module trains them). Each part is fed the keys it
    declares (``in_keys``): a body reads the environment keys of ``AGENT_INPUT_KEYS``
    (``x`` and ``message`` restricted to the agent's visible channels, ``ignore_message``
    true in round 0), a head those and its body's outputs.

    Parameters
    ----------
    hyper_params
        The experiment's parameters.
    protocol_handler
        Agent names, channels, visibility.
    max_nodes
        Number of node slots per graph.
    agents
        Agent name -> ``Agent``, for every agent of the protocol. Either every agent has a
        ``body`` (shared by its heads) or the non-random ones have ``policy_body`` and
        ``value_body``.
    use_critic
        Whether value heads are trained (every agent then has a ``value_head``).

    Raises
    ------
    ValueError
        If an agent is missing, or a part's keys do not fit (naming the agent and part).
    """

    def __init__(self, hyper_params, protocol_handler, max_nodes: int, agents: Mapping[str, Agent], *,
                 use_critic: bool = True):
        super().__init__()
        self.hyper_params = hyper_params
        self.agent_names = list(protocol_handler.agent_names)
        missing = [name for name in self.agent_names if name not in agents]
        if missing:
            raise ValueError(f"agents: no Agent for {missing} (the protocol's agents are {self.agent_names})")
        self.max_nodes = max_nodes
        self.max_rounds = protocol_handler.max_message_rounds
        self.num_channels = len(protocol_handler.message_channel_names)
        self.message_size = hyper_params.message_size
        self.shared_body = not any(agents[name].policy_body is not None for name in self.agent_names)
        self.use_critic = use_critic
        visibility = torch.as_tensor(protocol_handler.agent_channel_visibility_mask, dtype=torch.bool)
        self.visible_channels = [visibility[i].nonzero().squeeze(-1).tolist() for i in range(len(self.agent_names))]
        prover_names = set(protocol_handler.prover_names)
        self.register_buffer("is_prover", torch.tensor([a in prover_names for a in self.agent_names]),
                             persistent=False)
        # Registration order and names make the state_dict keys: "policy_body.<agent>." holds
        # the shared body too.
        self.policy_body, self.value_body = nn.ModuleDict(), nn.ModuleDict()
        self.policy_head, self.value_head, self.solo_head = nn.ModuleDict(), nn.ModuleDict(), nn.ModuleDict()
        for name in self.agent_names:
            agent = agents[name]
            body = agent.body if agent.body is not None else agent.policy_body
            if body is None:
                raise ValueError(f"agents.{name}: a graph-isomorphism agent needs a body")
            check_part_keys(body, AGENT_INPUT_KEYS, BODY_OUTPUT_KEYS, f"body of agent '{name}'")
            self.policy_body[name] = body
            if agent.value_body is not None:
                check_part_keys(agent.value_body, AGENT_INPUT_KEYS, BODY_OUTPUT_KEYS, f"value_body of agent '{name}'")
                self.value_body[name] = agent.value_body
            for field, target, outputs in (("policy_head", self.policy_head, POLICY_HEAD_OUTPUT_KEYS),
                                           ("value_head", self.value_head, ("value",)),
                                           ("solo_head", self.solo_head, ("decision_logits",))):
                head = getattr(agent, field)
                if head is not None:
                    check_part_keys(head, AGENT_INPUT_KEYS | set(body.out_keys), outputs,
                                     f"{field} of agent '{name}'")
                    target[name] = head
            if use_critic and name not in self.value_head:
                raise ValueError(f"agents.{name}: use_critic is set but the agent has no value_head")

    # -- running the parts ----------------------------------------------------------------

    def _agent_input(self, td: TensorDictBase, index: int, key: str, ignore_message: Tensor) -> Tensor:
        """Environment input ``key`` as agent ``index`` sees it."""
        if key == "x":
            return td["x"][:, :, self.visible_channels[index]]
        if key == "message":
            return td["message"][:, self.visible_channels[index]]
        if key == "ignore_message":
            return ignore_message
        return td[key]

    def _run_part(self, part: nn.Module, td: TensorDictBase, index: int, ignore_message: Tensor,
                  known: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """``part``'s outputs by key, fed its ``in_keys`` from ``known`` or the environment."""
        inputs = [known[key] if known is not None and key in known else
                  self._agent_input(td, index, key, ignore_message) for key in part.in_keys]
        return dict(zip(part.out_keys, part.outputs_as_tuple(part(*inputs))))

    def _body_outputs(self, td: TensorDictBase, bodies: nn.ModuleDict) -> list[dict[str, Tensor]]:
        ignore_message = td["round"] == 0
        return [self._run_part(bodies[name], td, index, ignore_message) for index, name in enumerate(self.agent_names)]

    def _mask_message_logits(self, logits: Tensor, td: TensorDictBase) -> Tensor:
        """Expanded ``(B, A, C, M, 2N)`` logits with the visibility/opposite-graph/node masks."""
        B, N = logits.shape[0], self.max_nodes
        message = td["message"]  # (B, C, M, 2, N), possibly affinely normalised
        # Which graph holds the latest message: comparing maxima is invariant to the scalar
        # (positive-scale) observation normalisation, unlike testing for non-zero entries.
        in_graph_0 = message[..., 0, :].amax(-1) > message[..., 1, :].amax(-1)  # (B, C, M)
        allowed_graph = in_graph_0.long()  # message in graph 0 -> provers must answer in graph 1
        graph_of_slot = torch.arange(2 * N, device=logits.device) // N
        wrong_graph = graph_of_slot.view(1, 1, 1, -1) != allowed_graph.unsqueeze(-1)  # (B, C, M, 2N)
        prover_block = wrong_graph.unsqueeze(1) & self.is_prover.view(1, -1, 1, 1, 1)
        absent = ~td["node_mask"].reshape(B, 1, 1, 1, 2 * N)
        return logits.masked_fill(prover_block | absent, MASK_VALUE)

    def policy(self, td: TensorDictBase) -> tuple[Tensor, Tensor]:
        """``(main_message_logits (B, A, C, M, 2N), decision_logits (B, A, 3))``, float32.

        The logits are float32 whatever the precision the bodies ran in (bf16 autocast):
        log-probabilities and ratios are computed from them.
        """
        return self._policy_from(td, self._body_outputs(td, self.policy_body))

    def value(self, td: TensorDictBase) -> Tensor:
        """``(B, A, 1)`` values, float32 (see :meth:`policy`)."""
        return self._values_from(td, self._body_outputs(td, self._value_bodies()))

    def policy_and_value(self, td: TensorDictBase) -> tuple[Tensor, Tensor, Tensor]:
        """``(*self.policy(td), self.value(td))`` with each body run once.

        A shared body gives both heads the same representations; separate policy and value
        bodies of one agent run stacked, as one batched computation, when they are stock
        bodies of equal shapes
        (:func:`~nip_core.scenarios.graph_isomorphism.agents.stacked.stacked_bodies_forward`),
        else one after the other.
        """
        if self.shared_body:
            outputs = self._body_outputs(td, self.policy_body)
            return (*self._policy_from(td, outputs), self._values_from(td, outputs))
        ignore_message = td["round"] == 0
        policy_outputs, value_outputs = [], []
        for index, name in enumerate(self.agent_names):
            bodies = [self.policy_body[name]] + ([self.value_body[name]] if name in self.value_body else [])
            if can_stack(bodies):
                inputs = [self._agent_input(td, index, key, ignore_message) for key in bodies[0].in_keys]
                # a value head that reads no node-level representation: the value body computes
                # its graph-level one alone (no node token past the last attention)
                value_head = self.value_head[name] if name in self.value_head else None
                graph_only = [False, value_head is not None and "node_level_repr" not in value_head.in_keys]
                stacked = stacked_bodies_forward(bodies, *inputs, graph_only=graph_only[:len(bodies)])
                outputs = [{key: value for key, value in zip(body.out_keys, out) if value is not None}
                           for body, out in zip(bodies, stacked)]
            else:
                outputs = [self._run_part(body, td, index, ignore_message) for body in bodies]
            policy_outputs.append(outputs[0])
            value_outputs.append(outputs[-1])
        return (*self._policy_from(td, policy_outputs), self._values_from(td, value_outputs))

    def _policy_from(self, td: TensorDictBase, outputs: list[dict[str, Tensor]]) -> tuple[Tensor, Tensor]:
        B = td.batch_size[0]
        message_logits = torch.full((B, len(self.agent_names), self.num_channels, self.message_size,
                                     2 * self.max_nodes), MASK_VALUE, device=td["x"].device)
        decision_logits = []
        ignore_message = td["round"] == 0
        for index, (name, reprs) in enumerate(zip(self.agent_names, outputs)):
            head_out = self._run_part(self.policy_head[name], td, index, ignore_message, reprs)
            node_logits, dec_logits = (head_out[key] for key in POLICY_HEAD_OUTPUT_KEYS)
            message_logits[:, index, self.visible_channels[index]] = node_logits.to(message_logits.dtype)
            decision_logits.append(dec_logits.to(message_logits.dtype))
        return self._mask_message_logits(message_logits, td), torch.stack(decision_logits, 1)

    def _values_from(self, td: TensorDictBase, outputs: list[dict[str, Tensor]]) -> Tensor:
        ignore_message = td["round"] == 0
        values = [self._run_part(self.value_head[name], td, index, ignore_message, reprs)["value"].float()
                  for index, (name, reprs) in enumerate(zip(self.agent_names, outputs))]
        return torch.stack(values, 1)

    def _value_bodies(self) -> nn.ModuleDict:
        if self.shared_body:
            return self.policy_body
        merged = nn.ModuleDict()
        for name in self.agent_names:  # scripted agents have no separate value body
            merged[name] = self.value_body[name] if name in self.value_body else self.policy_body[name]
        return merged

    def solo_logits(self, td: TensorDictBase) -> Tensor:
        """``(B, A_solo, 2)`` classification logits of the agents with a solo head."""
        ignore_message = td["round"] == 0
        logits = []
        for index, name in enumerate(self.agent_names):
            if name in self.solo_head:
                reprs = self._run_part(self.policy_body[name], td, index, ignore_message)
                logits.append(self._run_part(self.solo_head[name], td, index, ignore_message,
                                             reprs)["decision_logits"])
        return torch.stack(logits, 1)

    def actor_parameters(self, name: str) -> list[nn.Parameter]:
        """The trainable parameters of ``name``'s policy (body and policy head)."""
        params = list(self.policy_body[name].parameters())
        if name in self.policy_head:
            params += list(self.policy_head[name].parameters())
        return [p for p in params if p.requires_grad]

    # -- optimiser groups -----------------------------------------------------------------

    def parameter_groups(self, lr: float, solo: bool = False,
                         override_body_factor: bool = False) -> dict[str, list[dict]]:
        """Per-agent optimiser groups (lr-0 groups frozen and omitted), see :mod:`lr_groups`."""
        out: dict[str, list[dict]] = {}
        for name in self.agent_names:
            params = self.hyper_params.agent_params(name)
            if params.is_scripted:
                for module in (self.policy_body, self.policy_head, self.value_head):
                    if name in module:
                        module[name].requires_grad_(False)
                continue
            groups: list[dict] = []
            if solo:
                groups += body_groups(self.policy_body[name], name, params, lr, "actor",
                                      override_body_factor=override_body_factor)
                groups.append(head_group(self.solo_head[name], name, params, lr, "actor", "solo_head"))
            else:
                if self.shared_body or not self.use_critic:
                    groups += shared_body_groups(self.policy_body[name], name, params, lr) if self.use_critic \
                        else body_groups(self.policy_body[name], name, params, lr, "actor")
                else:
                    groups += body_groups(self.policy_body[name], name, params, lr, "actor")
                    groups += body_groups(self.value_body[name], name, params, lr, "critic")
                groups.append(head_group(self.policy_head[name], name, params, lr, "actor", "policy_head"))
                if self.use_critic:
                    groups.append(head_group(self.value_head[name], name, params, lr, "critic", "value_head"))
            out[name] = drop_frozen(groups)
        return out


def build_combined_agents(hyper_params, protocol_handler, max_nodes: int, trainer_type: str = "rl",
                          use_critic: bool = True, *, settings: Any = None,
                          agents: Mapping[str, Agent] | None = None,
                          part_classes: Mapping[type, type] | None = None) -> CombinedAgents:
    """The combined module of the parts a trainer needs (docs/behaviour.md#b20).

    Parameters
    ----------
    hyper_params, protocol_handler, max_nodes
        The experiment, its protocol and the number of node slots per graph.
    trainer_type, use_critic
        Which parts to build (:func:`~nip_core.scenarios.graph_isomorphism.agents.parts.agent_part_flags`).
    settings
        The experiment settings, handed to the parts.
    agents
        Ready-built agents (:func:`~nip_core.scenarios.graph_isomorphism.agents.parts.build_agents`);
        built here when omitted.
    part_classes
        Part classes replacing the stock ones when the agents are built here.
    """
    if agents is None:
        agents = build_agents(hyper_params, settings, protocol_handler, max_nodes, trainer_type=trainer_type,
                              use_critic=use_critic, part_classes=part_classes)
    elif part_classes is not None:
        raise ValueError("build_combined_agents: part_classes applies only when the agents are built here")
    flags = agent_part_flags(hyper_params, trainer_type, use_critic)
    return CombinedAgents(hyper_params, protocol_handler, max_nodes, agents, use_critic=flags["use_critic"])
