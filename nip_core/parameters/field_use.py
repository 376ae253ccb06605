"""Which trainers read which hyper-parameters: a field set for a trainer that never reads it is refused.

Every trainer is built from the same :class:`~nip_core.parameters.HyperParameters` tree, but
each reads only part of it: ``ppo.clip_epsilon`` means nothing to ``reinforce``, ``rl.lr``
nothing to a text trainer, the protocol rewards nothing to ``solo_agent``. A value other
than the default in a field the run's trainer never reads would be ignored in silence; it is
refused instead, naming the field, the trainer and the trainers that do read it.

:data:`READERS` maps a dotted path prefix (``agents.*.`` stands for every agent entry) to the
trainers that read the fields under it; a field matches its longest prefix, and a field no
prefix matches is read by every trainer. A reader is a trainer *kind* (``"tensordict"``,
``"solo"``, ``"pure_text"``: every trainer of that kind, built-in or registered by a user) or
a built-in trainer's name. A trainer registered by a user reads, besides its kind's fields,
the groups of the built-in trainers of its kind (nipflow cannot know what a plug-in's code
reads: a TensorDict trainer written from nip's guide may build a PPO loss from ``ppo.*``).

The table is what ``tests/nip_core/parameters/test_field_effects.py`` proves: for each
built-in trainer, every field it reads changes what it does (a perturbation probe), and every
field it does not read is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from nip_core.parameters.trainer_specs import BUILT_IN_TRAINERS, trainer_spec

TD, SOLO, TEXT = "tensordict", "solo", "pure_text"

#: dotted path prefix -> the kinds and built-in trainer names that read the fields under it
READERS: dict[str, frozenset[str]] = {
    # top level: graph-isomorphism agents and their pretraining
    "pretrain_agents": frozenset({TD}),
    "test_size": frozenset({TD, SOLO}),
    "d_representation": frozenset({TD, SOLO}),
    "message_size": frozenset({TD, SOLO}),
    # what every agent entry carries: learning-rate factors, schedules, initialisation
    "agents.*.agent_lr_factor.actor": frozenset({TD, SOLO}),
    "agents.*.body_lr_factor.actor": frozenset({TD, SOLO}),
    "agents.*.gnn_lr_factor.actor": frozenset({TD, SOLO}),
    "agents.*.agent_lr_factor.critic": frozenset({TD}),
    "agents.*.body_lr_factor.critic": frozenset({TD}),
    "agents.*.gnn_lr_factor.critic": frozenset({TD}),
    "agents.*.update_schedule": frozenset({TD}),
    "agents.*.use_orthogonal_initialisation": frozenset({TD, SOLO}),
    "agents.*.orthogonal_initialisation_gain": frozenset({TD, SOLO}),
    # graph-isomorphism heads that solo training never builds (it trains body + decider alone)
    "agents.*.d_node_selector": frozenset({TD}),
    "agents.*.num_node_selector_layers": frozenset({TD}),
    "agents.*.include_round_in_decider": frozenset({TD}),
    "agents.*.d_value": frozenset({TD}),
    "agents.*.num_value_layers": frozenset({TD}),
    "agents.*.include_round_in_value": frozenset({TD}),
    # the RL loop: TorchRL trainers; text trainers read only how long and how much to sample and test
    "rl.": frozenset({TD}),
    "rl.num_iterations": frozenset({TD, TEXT}),
    "rl.rollouts_per_iteration": frozenset({TD, TEXT}),
    "rl.frames_per_batch": frozenset({TD, TEXT}),
    "rl.num_test_iterations": frozenset({TD, TEXT}),
    # trainer-specific groups
    "ppo.": frozenset({"vanilla_ppo", "spg"}),
    "ppo.loss_type": frozenset({"vanilla_ppo"}),
    "ppo.kl_": frozenset({"vanilla_ppo"}),
    "spg.": frozenset({"spg"}),
    "reinforce.": frozenset({"reinforce"}),
    "solo_agent.": frozenset({"solo_agent", TD}),  # TD: how pretrain_agents trains the bodies
    "text_rl.": frozenset({TEXT}),
    # MALT trains the verifier on its own decisions at the tree's nodes: no guess replacement
    "text_rl.verifier_guess_replacement_": frozenset({"pure_text_ei"}),
    "pure_text_ei.": frozenset({"pure_text_ei"}),
    "pure_text_malt.": frozenset({"pure_text_malt"}),
    # the protocol: solo training reads only which agents there are and how many rounds
    "protocol_common.": frozenset({TD, TEXT}),
    "protocol_common.zero_knowledge": frozenset({TD, SOLO}),  # not for code validation
    "protocol_common.randomize_prover_stance": frozenset({TEXT}),
    "nip_protocol.min_message_rounds": frozenset({TD, TEXT}),
    "debate_protocol.": frozenset({TD, TEXT}),
    "mnip_protocol.": frozenset({TD, TEXT}),
    "debate_protocol.randomize_channel_order": frozenset({TEXT}),
    "mnip_protocol.randomize_channel_order": frozenset({TEXT}),
    "zk_protocol.": frozenset({TD}),
    "dataset_options.max_test_size": frozenset({TD, TEXT}),
}


def readers_of(path: str) -> frozenset[str] | None:
    """The readers of the dotted ``path`` (agent fields as ``agents.*.x``); ``None``: every trainer."""
    best = None
    for prefix in READERS:
        if (path == prefix or path.startswith(prefix if prefix.endswith(("." , "_")) else prefix + ".")) \
                and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else READERS[best]


def reads(trainer: str, path: str) -> bool:
    """Whether the trainer registered as ``trainer`` reads the field at ``path``."""
    readers = readers_of(path)
    if readers is None:
        return True
    kind = trainer_spec(trainer).kind
    if kind in readers or trainer in readers:
        return True
    if trainer in BUILT_IN_TRAINERS:
        return False
    # a user's trainer: the groups of the built-ins of its kind (see the module's text)
    return any(BUILT_IN_TRAINERS[name].kind == kind for name in readers if name in BUILT_IN_TRAINERS)


def who_reads(path: str) -> str:
    """The readers of ``path`` in words, for messages and ``params describe``."""
    readers = readers_of(path)
    if readers is None:
        return "every trainer"
    words = {TD: "the TensorDict RL trainers", SOLO: "solo_agent", TEXT: "the text trainers"}
    return ", ".join(sorted(words.get(r, r) for r in readers))


def changed_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of the leaf fields of ``model`` whose value differs from the field's default.

    Agent entries are reported as ``agents.<name>.<field>``; a group whose value is a model of
    a different class than its default (an update schedule's kind) counts as changed as a whole.
    """
    out: list[str] = []
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        path = prefix + name
        if isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
            for key, entry in value.items():
                out.extend(changed_fields(entry, f"{path}.{key}."))
            continue
        default = info.get_default(call_default_factory=True)
        if isinstance(value, BaseModel) and isinstance(default, BaseModel) and type(value) is type(default):
            out.extend(changed_fields(value, path + "."))
        elif _differs(value, default):
            out.append(path)
    return out


def _differs(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) != list(default)
    return value != default


def unread_fields(hyper_params: Any) -> list[tuple[str, str]]:
    """``(path, message)`` for each field set away from its default that the trainer never reads."""
    out = []
    for path in changed_fields(hyper_params):
        parts = path.split(".")
        generic = ".".join(["agents", "*", *parts[2:]]) if parts[0] == "agents" else path
        if not reads(hyper_params.trainer, generic):
            out.append((path, f"the {hyper_params.trainer} trainer does not read {generic} (read by "
                              f"{who_reads(generic)}); leave it at its default"))
    return out
