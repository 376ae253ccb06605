"""Every field of the HyperParameters tree has a description (they feed the UI forms and
``nipflow params show --describe``)."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from nip_core.parameters import HyperParameters


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models that appear anywhere in a type annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        args = args[:1]
    elif origin not in (Union, types.UnionType, list, dict, tuple, set):
        return []
    return [m for a in args for m in models_in(a)]


def walk(model: type[BaseModel], prefix: str = "", seen: set | None = None):
    """``(dotted path, model, field name, FieldInfo)`` of every field of the tree."""
    seen = set() if seen is None else seen
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path, model, name, info
        for sub in models_in(info.annotation):
            if (sub, path) not in seen:
                seen.add((sub, path))
                yield from walk(sub, f"{path}.", seen)


def test_the_walk_reaches_nested_models_union_members_and_agent_blocks():
    paths = {path for path, *_ in walk(HyperParameters)}
    assert {"rl.num_iterations", "agents.update_schedule.period", "agents.d_gnn", "agents.model_name",
            "agents.agent_lr_factor.actor", "agents.update_schedule.first_agent_num_rounds",
            "debate_protocol.max_message_rounds", "spg.ihvp_rho", "base_run.run_id"} <= paths
    assert len(paths) > 180


def test_every_field_has_a_description():
    missing = [f"{path} ({model.__name__}.{name})" for path, model, name, info in walk(HyperParameters)
               if not (info.description or "").strip()]
    assert missing == []


def test_descriptions_are_sentences_not_placeholders():
    short = [path for path, _, _, info in walk(HyperParameters) if len(info.description.split()) < 3]
    assert short == []


def test_describe_lists_every_leaf_with_type_value_and_description():
    from nip_core.experiment import make_params
    from nip_core.parameters.describe import describe_lines

    hp = make_params("code_validation", "pure_text_ei", protocol="debate",
                     overrides=["rl.num_iterations=7", "agents.prover0.temperature=0.5"])
    lines = describe_lines(hp)
    by_path = {line.split(":", 1)[0]: line for line in lines}
    desc = HyperParameters.model_fields["seed"].description
    assert by_path["seed"] == f"seed: int = 6198  # {desc}"
    assert by_path["rl.num_iterations"].startswith("rl.num_iterations: int = 7  # Training iterations")
    assert by_path["rl.frames_per_batch"].startswith("rl.frames_per_batch: int | None = 1000  # ")
    assert by_path["agents.prover0.temperature"].startswith("agents.prover0.temperature: float | None = 0.5  # ")
    assert by_path["agents._default.update_schedule.kind"].startswith(
        "agents._default.update_schedule.kind: 'constant' = 'constant'  # ")
    assert by_path["protocol_common.force_guess"].startswith(
        "protocol_common.force_guess: 'zero' | 'one' | 'y' | None = None  # ")
    assert all("  # " in line for line in lines)
    assert len(lines) == len(by_path)  # one line per path


def test_params_show_describe_on_the_command_line(capsys):
    from flows.cli import main

    assert main(["params", "show", "--scenario", "graph_isomorphism", "--trainer", "vanilla_ppo",
                 "--set", "rl.lr=0.01", "--describe"]) == 0
    out = capsys.readouterr().out.splitlines()
    lr_description = HyperParameters.model_fields["rl"].annotation.model_fields["lr"].description
    assert f"rl.lr: float = 0.01  # {lr_description}" in out
    assert any(line.startswith("agents._default.d_gnn: int = 16  # ") for line in out)
