"""Partial parameter models: generated from the full ones, every field optional."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nip_core.parameters import HyperParameters, RlTrainerParameters
from nip_core.parameters.partial import partial_model

from test_descriptions import walk  # noqa: E402  (this directory is on sys.path under pytest)

Partial = partial_model(HyperParameters)


def test_the_partial_tree_mirrors_every_field_with_its_description():
    full = {path: info.description for path, _, _, info in walk(HyperParameters)}
    partial = {path: info.description for path, _, _, info in walk(Partial)}
    assert partial == full
    assert all(info.default is None for _, _, _, info in walk(Partial))
    assert partial_model(HyperParameters) is Partial  # built once


def test_an_empty_partial_dumps_nothing_and_a_given_subset_dumps_exactly_itself():
    assert Partial().model_dump() == {}
    given = {"rl": {"num_iterations": 3, "betas": [0.8, 0.9]}, "agents": {"verifier": {"d_gnn": 4}},
             "protocol_common": {"force_guess": None}}
    assert Partial.model_validate(given).model_dump(mode="json") == given


def test_types_and_constraints_are_kept():
    rl = partial_model(RlTrainerParameters)
    with pytest.raises(ValidationError, match="greater than 0"):
        rl(frames_per_batch=0)
    with pytest.raises(ValidationError, match="loss_critic_type"):
        rl(loss_critic_type="l3")
    with pytest.raises(ValidationError, match=r"agents\.prover"):
        Partial.model_validate({"agents": {"prover": {"kind": "random", "d_gnn": 4}}})
    with pytest.raises(ValidationError, match="unknown trainer"):
        Partial(trainer="no_such_trainer")


def test_model_validators_of_complete_groups_do_not_run_on_a_part():
    # the full group refuses momentum with adam; a part cannot know the optimiser yet
    assert partial_model(RlTrainerParameters)(momentum=0.5).model_dump() == {"momentum": 0.5}
    with pytest.raises(ValidationError):
        RlTrainerParameters(momentum=0.5)
