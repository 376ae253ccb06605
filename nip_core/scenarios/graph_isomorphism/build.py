"""Builder of the graph-isomorphism scenario (registered as ``"graph_isomorphism"``).

Builds, in order: the protocol handler, the train/test datasets, every agent as an
:class:`~nip_core.agents.base.Agent` (parts chosen by trainer type, docs/behaviour.md#b20;
part classes from ``part_classes`` or the scenario's registry), the combined module made of
those agents' parts and, for RL trainers, the train and test environments. Tests and
benchmarks may inject ready-made datasets or a protocol handler through keyword arguments.
"""

from __future__ import annotations

from nip_core.parameters.trainer_specs import trainer_uses_critic
from nip_core.scenarios.graph_isomorphism.agents import build_agents, build_combined_agents
from nip_core.scenarios.graph_isomorphism.environment import GraphIsomorphismEnvironment
from nip_core.scenarios.registry import ScenarioInstance, register_scenario


def load_datasets(hyper_params, settings):
    """``(train, test)`` ``GraphIsomorphismDataset``s named ``hyper_params.dataset``."""
    from nip_core.scenarios.graph_isomorphism.dataset import GraphIsomorphismDataset

    options = hyper_params.dataset_options
    train = GraphIsomorphismDataset.from_name(hyper_params.dataset, "train", data_dir=settings.data_dir,
                                              max_size=options.max_train_size)
    test = GraphIsomorphismDataset.from_name(hyper_params.dataset, "test", data_dir=settings.data_dir,
                                             max_size=options.max_test_size)
    return train, test


@register_scenario("graph_isomorphism")
def build_graph_isomorphism(hyper_params, settings, *, trainer_type: str = "rl", train_dataset=None,
                            test_dataset=None, protocol_handler=None, part_classes=None) -> ScenarioInstance:
    """Build every component of a graph-isomorphism experiment.

    Parameters
    ----------
    hyper_params, settings
        The experiment.
    trainer_type
        ``"rl"`` (environments, policy/value heads) or ``"solo_agent"`` (solo heads only).
    train_dataset, test_dataset, protocol_handler
        Ready-made components to use instead of building them.
    part_classes
        Agent part classes replacing the stock ones, by base class, e.g.
        ``{AgentBody: MyBody}`` (see :mod:`nip_core.agents.base`).
    """
    if protocol_handler is None:
        from nip_core.protocols import build_protocol_handler

        protocol_handler = build_protocol_handler(hyper_params)
    if train_dataset is None or test_dataset is None:
        train_dataset, test_dataset = load_datasets(hyper_params, settings)
    max_nodes = int(train_dataset.max_nodes)
    use_critic = trainer_uses_critic(hyper_params)
    agent_parts = build_agents(hyper_params, settings, protocol_handler, max_nodes, trainer_type=trainer_type,
                               use_critic=use_critic, part_classes=part_classes)
    agents = build_combined_agents(hyper_params, protocol_handler, max_nodes, trainer_type=trainer_type,
                                   use_critic=use_critic, settings=settings, agents=agent_parts)
    instance = ScenarioInstance(train_dataset=train_dataset, test_dataset=test_dataset,
                                protocol_handler=protocol_handler, agents=agent_parts)
    instance.extras["combined_agents"] = agents
    instance.extras["use_critic"] = use_critic
    if trainer_type == "rl":
        from nip_core.settings import resolve_device

        device = resolve_device(settings.device)  # "auto" -> this host's device
        # Test datasets may be smaller than a batch; the env cycles over them anyway.
        instance.train_environment = GraphIsomorphismEnvironment(hyper_params, train_dataset, protocol_handler,
                                                                 seed=hyper_params.seed, device=device)
        instance.test_environment = GraphIsomorphismEnvironment(hyper_params, test_dataset, protocol_handler,
                                                                seed=hyper_params.seed + 1, device=device)
        # one module runs every combined part (bodies and heads of all agents)
        instance.combined_body = agents if agents.shared_body else None
        instance.combined_policy_body = None if agents.shared_body else agents
        instance.combined_value_body = None if agents.shared_body else agents
        instance.combined_policy_head = agents
        instance.combined_value_head = agents if use_critic else None
    return instance
