"""nip's agent layer: agent parts, the ``Agent`` that collects them, and how to add one.

An agent is made of *parts*. A TensorDict agent (graph isomorphism) has a body — or, with
``rl.use_shared_body = False``, a policy body and a value body — and heads: a policy head
(message and decision logits), a value head (a state value) and, for supervised training
or ``pretrain_agents``, a solo head (label logits). A text agent is not split: it is one
*whole* agent (:class:`~nip_core.agents.pure_text.PureTextWholeAgent`). Whatever its
kind, an agent's parts are held by an :class:`Agent`, and a scenario instance maps every
agent name to its ``Agent`` (``scenario_instance.agents``).

Every part subclasses :class:`AgentPart` (through :class:`AgentBody`,
:class:`AgentPolicyHead`, :class:`AgentValueHead` or :class:`SoloAgentHead`), and a part
of a TensorDict agent also subclasses :class:`TensorDictAgentPartMixin`, which declares
the part's ``in_keys`` and ``out_keys``: the part's ``forward`` takes the tensors named by
``in_keys`` positionally and returns those named by ``out_keys`` (a tuple, or one tensor
when there is one key).

The parts of all agents run together in one *combined* module per scenario (for graph
isomorphism :class:`~nip_core.scenarios.graph_isomorphism.agents.combined.CombinedAgents`),
built from the ``Agent``\\ s; how it runs them (one after the other, or stacked into one
batched computation when they have the same shape) is its own business.

Adding an architecture
----------------------
Subclass the base of the part you replace together with :class:`TensorDictAgentPartMixin`,
declare the keys, and hand the class to the scenario builder. For graph isomorphism a part
class is called as ``cls(hyper_params, settings, agent_name, protocol_handler,
max_nodes=...)``, and the inputs a body may declare are ``x``, ``adjacency``, ``message``
(restricted to the agent's visible channels), ``node_mask``, ``ignore_message`` and
``round``; a body returns ``graph_level_repr (B, 2, d_representation)`` and
``node_level_repr (B, 2, max_nodes, d_representation)``::

    class MeanFeatureBody(TensorDictAgentPartMixin, AgentBody):
        in_keys = ("x", "node_mask")
        out_keys = ("graph_level_repr", "node_level_repr")

        def __init__(self, hyper_params, settings, agent_name, protocol_handler, *, max_nodes):
            super().__init__(hyper_params, settings, agent_name, protocol_handler)
            ...

    instance = build_graph_isomorphism(hyper_params, settings,
                                       part_classes={AgentBody: MeanFeatureBody})

``part_classes`` maps a base (``AgentBody``, ``AgentPolicyHead``, ``AgentValueHead``,
``SoloAgentHead``) to the class used for every non-random agent; the scenario's stock
classes are in ``GRAPH_ISOMORPHISM_PART_CLASSES``
(:mod:`nip_core.scenarios.graph_isomorphism.agents.parts`), a per-scenario registry that
code run before the trainer may also update for ``nipflow run``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Iterator

import torch
from tensordict import TensorDictBase
from torch import nn


class AgentPart(nn.Module):
    """Base of every part of an agent.

    Parameters
    ----------
    hyper_params
        The experiment's ``HyperParameters``.
    settings
        The ``ExperimentSettings`` (``None`` where a part is built outside an experiment,
        e.g. in a test).
    agent_name
        The agent this part belongs to (one of ``protocol_handler.agent_names``).
    protocol_handler
        The interaction protocol: agent names, channels, visibility.

    Attributes
    ----------
    agent_params
        The agent's parameters, ``hyper_params.agent_params(agent_name)``.
    agent_index
        The agent's position in ``protocol_handler.agent_names``.
    """

    def __init__(self, hyper_params: Any, settings: Any, agent_name: str, protocol_handler: Any):
        super().__init__()
        names = list(protocol_handler.agent_names)
        if agent_name not in names:
            raise ValueError(f"agent_name '{agent_name}' is not an agent of the protocol (agents: {names})")
        self.hyper_params = hyper_params
        self.settings = settings
        self.agent_name = agent_name
        self.protocol_handler = protocol_handler
        self.agent_params = hyper_params.agent_params(agent_name)
        self.agent_index = names.index(agent_name)

    @property
    def is_prover(self) -> bool:
        """Whether the agent is one of the protocol's provers."""
        return self.agent_name in self.protocol_handler.prover_names

    @property
    def is_verifier(self) -> bool:
        """Whether the agent is one of the protocol's verifiers."""
        return self.agent_name in self.protocol_handler.verifier_names

    @property
    def visible_channel_indices(self) -> list[int]:
        """Indices of the message channels the agent can see."""
        mask = torch.as_tensor(self.protocol_handler.agent_channel_visibility_mask, dtype=torch.bool)
        return mask[self.agent_index].nonzero().squeeze(-1).tolist()

    @property
    def device(self) -> torch.device:
        """Where the part's tensors live: its first parameter or buffer, else ``settings.device``."""
        for tensor in self.parameters():
            return tensor.device
        for tensor in self.buffers():
            return tensor.device
        if self.settings is not None:
            from nip_core.settings import resolve_device

            return torch.device(resolve_device(self.settings.device))
        return torch.device("cpu")


class AgentBody(AgentPart):
    """Turns the agent's view of the environment into representations.

    Attributes
    ----------
    d_representation
        Size of the representations (``hyper_params.d_representation``).
    """

    def __init__(self, hyper_params: Any, settings: Any, agent_name: str, protocol_handler: Any):
        super().__init__(hyper_params, settings, agent_name, protocol_handler)
        self.d_representation = hyper_params.d_representation


class AgentHead(AgentPart):
    """Turns a body's representations into the agent's outputs."""


class AgentPolicyHead(AgentHead):
    """Produces the logits of the agent's actions (messages, and decisions for verifiers)."""

    @property
    def has_decider(self) -> bool:
        """Whether the head outputs decision logits: only verifiers decide."""
        return self.is_verifier


class AgentValueHead(AgentHead):
    """Produces the agent's value estimate of a state."""


class SoloAgentHead(AgentHead):
    """Predicts the datapoint's label (supervised training of the agent on its own)."""


class TensorDictAgentPartMixin:
    """A part of a TensorDict agent: its inputs and outputs are named tensordict keys.

    ``forward`` takes the tensors named by ``in_keys``, in that order, and returns the
    ones named by ``out_keys`` (a tuple in that order, or a tensor for a single key), so
    the combined module can feed each part what it declares.
    """

    in_keys: ClassVar[tuple[str, ...]] = ()
    out_keys: ClassVar[tuple[str, ...]] = ()

    def outputs_as_tuple(self, outputs: Any) -> tuple:
        """``forward``'s result as a tuple matching ``out_keys`` (checked)."""
        result = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        if len(result) != len(self.out_keys):
            raise ValueError(f"{type(self).__name__} (agent '{getattr(self, 'agent_name', '?')}') returned "
                             f"{len(result)} output(s) for out_keys {self.out_keys}")
        return result

    def forward_tensordict(self, td: TensorDictBase) -> TensorDictBase:
        """Run the part on ``td``: read ``in_keys``, write ``out_keys``; returns ``td``."""
        missing = [key for key in self.in_keys if key not in td.keys()]
        if missing:
            raise KeyError(f"{type(self).__name__}: input key(s) {missing} not in the tensordict")
        outputs = self.outputs_as_tuple(self(*(td.get(key) for key in self.in_keys)))
        for key, value in zip(self.out_keys, outputs):
            td.set(key, value)
        return td


def check_part_keys(part: nn.Module, available: set[str] | frozenset[str], required_out: tuple[str, ...],
                    role: str) -> None:
    """Raise a ``ValueError`` naming the part if its keys do not fit where it is used.

    Parameters
    ----------
    part
        A part; it must declare ``in_keys``/``out_keys`` (:class:`TensorDictAgentPartMixin`).
    available
        The keys it may read.
    required_out
        The keys it must produce.
    role
        What the part is used as, for the message (e.g. ``"policy_body of agent 'prover'"``).
    """
    name = type(part).__name__
    if not isinstance(part, TensorDictAgentPartMixin):
        raise TypeError(f"{role}: {name} must subclass TensorDictAgentPartMixin (declaring in_keys and out_keys)")
    unknown = [key for key in part.in_keys if key not in available]
    if unknown:
        raise ValueError(f"{role}: {name}.in_keys {list(unknown)} are not available here "
                         f"(available: {sorted(available)})")
    absent = [key for key in required_out if key not in part.out_keys]
    if absent:
        raise ValueError(f"{role}: {name}.out_keys must include {list(absent)} (declared: {list(part.out_keys)})")


@dataclass
class Agent:
    """The parts of one agent; the ones it does not have are ``None``.

    A TensorDict agent has either ``body`` (shared by its heads) or ``policy_body`` and,
    with a critic, ``value_body``; heads need a body. A text agent has only ``whole``.

    Raises
    ------
    ValueError
        For an inconsistent set of parts, naming the fields.
    """

    whole: Any = None
    body: AgentBody | None = None
    policy_body: AgentBody | None = None
    value_body: AgentBody | None = None
    policy_head: AgentPolicyHead | None = None
    value_head: AgentValueHead | None = None
    solo_head: SoloAgentHead | None = None

    def __post_init__(self) -> None:
        present = [f.name for f in fields(self) if getattr(self, f.name) is not None]
        if self.whole is not None and present != ["whole"]:
            raise ValueError(f"Agent: a whole agent has no other parts (also given: {present[1:]})")
        if self.body is not None and (self.policy_body is not None or self.value_body is not None):
            raise ValueError("Agent: give either body or policy_body/value_body, not both")
        if self.value_body is not None and self.policy_body is None:
            raise ValueError("Agent: value_body needs a policy_body")
        heads = [name for name in ("policy_head", "value_head", "solo_head") if getattr(self, name) is not None]
        if heads and self.body is None and self.policy_body is None:
            raise ValueError(f"Agent: {heads} need a body (body or policy_body)")

    @property
    def name(self) -> str | None:
        """The agent's name, from its parts."""
        for part in self.parts().values():
            for attribute in ("agent_name", "name"):
                if isinstance(getattr(part, attribute, None), str):
                    return getattr(part, attribute)
        return None

    def parts(self) -> dict[str, Any]:
        """The parts the agent has, by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def modules(self) -> dict[str, nn.Module]:
        """The parts that are torch modules, by field name."""
        return {name: part for name, part in self.parts().items() if isinstance(part, nn.Module)}

    def parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter of the agent's modules, each once."""
        seen: set[int] = set()
        for module in self.modules().values():
            for parameter in module.parameters():
                if id(parameter) not in seen:
                    seen.add(id(parameter))
                    yield parameter

    def train(self, mode: bool = True) -> "Agent":
        """Put every module part in training mode (``mode=False``: evaluation mode)."""
        for module in self.modules().values():
            module.train(mode)
        return self

    def eval(self) -> "Agent":
        """Put every module part in evaluation mode."""
        return self.train(False)
