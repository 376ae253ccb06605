"""All agents of a graph-isomorphism experiment as one module (docs/behaviour.md#b19, #b20).

``CombinedAgents`` holds every agent's parts in ``ModuleDict``s keyed by agent name
(``policy_body`` — or ``body`` when actor and critic share it —, ``value_body``,
``policy_head``, ``value_head``, ``solo_head``) and runs them on an environment
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

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from nip_core.agents.lr_groups import body_groups, drop_frozen, head_group, shared_body_groups
from nip_core.agents.mlp import agent_init_seed, orthogonal_init
from nip_core.scenarios.graph_isomorphism.agents.body import GraphIsomorphismAgentBody
from nip_core.scenarios.graph_isomorphism.agents.stacked import can_stack, stacked_bodies_forward
from nip_core.scenarios.graph_isomorphism.agents.heads import (
    ConstantValueHead,
    GraphIsomorphismPolicyHead,
    GraphIsomorphismSoloHead,
    GraphIsomorphismValueHead,
    RandomAgentBody,
    RandomPolicyHead,
)

MASK_VALUE = -1e9


class CombinedAgents(nn.Module):
    """Every agent's body and heads, run together on an environment tensordict.

    Parameters
    ----------
    hyper_params
        The experiment's parameters.
    protocol_handler
        Agent names, channels, visibility.
    max_nodes
        Number of node slots per graph.
    use_critic
        Build value heads.
    shared_body
        One body per agent for actor and critic (else separate policy and value bodies).
    solo
        Build solo heads (supervised trainer).
    """

    def __init__(self, hyper_params, protocol_handler, max_nodes: int, *, use_critic: bool = True,
                 shared_body: bool = True, solo: bool = False, policy: bool = True):
        super().__init__()
        self.hyper_params = hyper_params
        self.agent_names = list(protocol_handler.agent_names)
        self.max_nodes = max_nodes
        self.max_rounds = protocol_handler.max_message_rounds
        self.num_channels = len(protocol_handler.message_channel_names)
        self.message_size = hyper_params.message_size
        self.shared_body = shared_body
        self.use_critic = use_critic
        visibility = torch.as_tensor(protocol_handler.agent_channel_visibility_mask, dtype=torch.bool)
        self.visible_channels = [visibility[i].nonzero().squeeze(-1).tolist() for i in range(len(self.agent_names))]
        prover_names = set(getattr(protocol_handler, "prover_names", [a for a in self.agent_names if "prover" in a]))
        verifier_names = set(getattr(protocol_handler, "verifier_names",
                                     [a for a in self.agent_names if "verifier" in a]))
        self.register_buffer("is_prover", torch.tensor([a in prover_names for a in self.agent_names]),
                             persistent=False)
        self.policy_body, self.value_body = nn.ModuleDict(), nn.ModuleDict()
        self.policy_head, self.value_head, self.solo_head = nn.ModuleDict(), nn.ModuleDict(), nn.ModuleDict()
        for index, name in enumerate(self.agent_names):
            params = hyper_params.agent_params(name)
            n_vis = len(self.visible_channels[index])
            body_kw = dict(max_rounds=self.max_rounds, num_visible_channels=n_vis, message_size=self.message_size,
                           max_nodes=max_nodes, d_representation=hyper_params.d_representation)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(agent_init_seed(hyper_params.seed, index))
                if params.is_random:
                    if solo:
                        raise ValueError(f"agents.{name}: random agents cannot be trained as solo agents")
                    self.policy_body[name] = RandomAgentBody(max_nodes=max_nodes,
                                                             d_representation=hyper_params.d_representation)
                    if policy:
                        self.policy_head[name] = RandomPolicyHead(num_visible_channels=n_vis,
                                                                  message_size=self.message_size,
                                                                  max_nodes=max_nodes)
                    if use_critic:
                        self.value_head[name] = ConstantValueHead()
                    continue
                self.policy_body[name] = GraphIsomorphismAgentBody(params, **body_kw)
                if use_critic and not shared_body:
                    self.value_body[name] = GraphIsomorphismAgentBody(params, **body_kw)
                if policy:
                    self.policy_head[name] = GraphIsomorphismPolicyHead(
                        params, is_verifier=name in verifier_names, num_visible_channels=n_vis,
                        message_size=self.message_size, max_nodes=max_nodes, max_rounds=self.max_rounds,
                        d_representation=hyper_params.d_representation)
                if use_critic:
                    self.value_head[name] = GraphIsomorphismValueHead(
                        params, max_rounds=self.max_rounds, d_representation=hyper_params.d_representation)
                if solo:
                    self.solo_head[name] = GraphIsomorphismSoloHead(
                        params, d_representation=hyper_params.d_representation)
                if params.use_orthogonal_initialisation:
                    for part in (self.policy_body, self.value_body, self.policy_head, self.value_head,
                                 self.solo_head):
                        if name in part:
                            orthogonal_init(part[name], params.orthogonal_initialisation_gain)

    # -- running the parts ----------------------------------------------------------------

    def _body_outputs(self, td: TensorDictBase, bodies: nn.ModuleDict) -> list[tuple[Tensor, Tensor]]:
        ignore_message = td["round"] == 0
        outputs = []
        for index, name in enumerate(self.agent_names):
            channels = self.visible_channels[index]
            outputs.append(bodies[name](td["x"][:, :, channels], td["adjacency"], td["message"][:, channels],
                                        td["node_mask"], ignore_message))
        return outputs

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
        bodies of one agent (equal shapes) run stacked, as one batched computation
        (:func:`~nip_core.scenarios.graph_isomorphism.agents.stacked.stacked_bodies_forward`).
        """
        if self.shared_body:
            outputs = self._body_outputs(td, self.policy_body)
            return (*self._policy_from(td, outputs), self._values_from(td, outputs))
        ignore_message = td["round"] == 0
        policy_outputs, value_outputs = [], []
        for index, name in enumerate(self.agent_names):
            channels = self.visible_channels[index]
            inputs = (td["x"][:, :, channels], td["adjacency"], td["message"][:, channels], td["node_mask"],
                      ignore_message)
            bodies = [self.policy_body[name]] + ([self.value_body[name]] if name in self.value_body else [])
            if can_stack(bodies):
                outputs = stacked_bodies_forward(bodies, *inputs)
            else:
                outputs = [body(*inputs) for body in bodies]
            policy_outputs.append(outputs[0])
            value_outputs.append(outputs[-1])
        return (*self._policy_from(td, policy_outputs), self._values_from(td, value_outputs))

    def _policy_from(self, td: TensorDictBase, outputs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        B = td.batch_size[0]
        message_logits = torch.full((B, len(self.agent_names), self.num_channels, self.message_size,
                                     2 * self.max_nodes), MASK_VALUE, device=td["x"].device)
        decision_logits = []
        for index, (name, (graph_repr, node_repr)) in enumerate(zip(self.agent_names, outputs)):
            node_logits, dec_logits = self.policy_head[name](graph_repr, node_repr, td["round"])
            message_logits[:, index, self.visible_channels[index]] = node_logits.to(message_logits.dtype)
            decision_logits.append(dec_logits.to(message_logits.dtype))
        return self._mask_message_logits(message_logits, td), torch.stack(decision_logits, 1)

    def _values_from(self, td: TensorDictBase, outputs: list[tuple[Tensor, Tensor]]) -> Tensor:
        values = [self.value_head[name](graph_repr, td["round"]).float()
                  for name, (graph_repr, _) in zip(self.agent_names, outputs)]
        return torch.stack(values, 1)

    def _value_bodies(self) -> nn.ModuleDict:
        if self.shared_body:
            return self.policy_body
        merged = nn.ModuleDict()
        for name in self.agent_names:  # random agents have no separate value body
            merged[name] = self.value_body[name] if name in self.value_body else self.policy_body[name]
        return merged

    def solo_logits(self, td: TensorDictBase) -> Tensor:
        """``(B, A_solo, 2)`` classification logits of the agents with a solo head."""
        names = [n for n in self.agent_names if n in self.solo_head]
        outputs = self._body_outputs(td, self.policy_body)
        return torch.stack([self.solo_head[n](outputs[self.agent_names.index(n)][0]) for n in names], 1)

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
            if params.is_random:
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
                          use_critic: bool = True) -> CombinedAgents:
    """The parts a trainer needs (docs/behaviour.md#b20)."""
    if trainer_type == "solo_agent":
        return CombinedAgents(hyper_params, protocol_handler, max_nodes, use_critic=False, shared_body=True,
                              solo=True, policy=False)
    shared = hyper_params.rl.use_shared_body or not use_critic
    return CombinedAgents(hyper_params, protocol_handler, max_nodes, use_critic=use_critic, shared_body=shared,
                          solo=hyper_params.pretrain_agents)
