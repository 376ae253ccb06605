"""``HyperParameters.from_dict`` validates a parameter tree once per process and shares the result.

The run through Prefect that relies on it is in ``tests/flows/test_params_built_once.py``.
"""

from __future__ import annotations

import itertools
import os

import pytest

from nip_core.parameters import HyperParameters, ParameterError
from nip_core.parameters.trainer_specs import TrainerSpec, declare, forget

# seeds no other test uses, so that this process has not built these parameters before
_SEEDS = itertools.count(800_000 + os.getpid() % 1000 * 100)


def tree(**top):
    return {"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test", "seed": next(_SEEDS),
            **top}


def test_the_same_tree_gives_the_same_object_and_a_stored_build_does_not_stand_for_a_new_one():
    data = tree()
    hp = HyperParameters.from_dict(data)
    assert HyperParameters.from_dict(dict(data)) is hp
    assert HyperParameters.from_dict(hp.to_dict()) is hp  # what it writes out
    assert HyperParameters.from_dict(hp.to_dict(), stored=True) is hp  # read back from a run store
    other = tree()
    from_store = HyperParameters.from_dict(other, stored=True)
    assert HyperParameters.from_dict(other) is not from_store  # a new run validates with every refusal
    assert HyperParameters.from_dict(tree()) is not hp


def test_a_tree_is_validated_again_once_its_trainer_is_unregistered_or_declared_otherwise():
    declare(TrainerSpec("built_once_td", "tensordict", True, None, "BuiltOnceTrainer"))
    try:
        data = tree(trainer="built_once_td")
        hp = HyperParameters.from_dict(data)
        assert HyperParameters.from_dict(data) is hp
        # the same name, now a text trainer: a graph-isomorphism tree is refused again
        declare(TrainerSpec("built_once_td", "pure_text", False, None, "BuiltOnceTrainer"))
        with pytest.raises(ParameterError, match="built_once_td"):
            HyperParameters.from_dict(data)
        declare(TrainerSpec("built_once_td", "tensordict", True, None, "BuiltOnceTrainer"))
        assert HyperParameters.from_dict(data) == hp
    finally:
        forget("built_once_td")
    with pytest.raises(ParameterError, match="unknown trainer 'built_once_td'"):
        HyperParameters.from_dict(data)
