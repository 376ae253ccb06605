"""The parameters of a run are validated once per process, however many layers carry them,
and the way they take is the one ``docs/architecture.md#params-walk`` writes down.

``nipflow run`` builds ``HyperParameters`` from the file and the overrides; the flow gets them
as flow parameters, the RL blocks and tasks as ``RunSpec.params``, the run store reads them
back from ``hyper_params.json``. Every one of those conversions returns the object built first
(``HyperParameters.from_dict`` keeps what this process built, keyed by the tree's canonical
JSON; the parameters are immutable, so sharing them is safe).
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

from flows.cli import main
from nip_core.parameters import HyperParameters, ParameterError
from tests.test_architecture_diagram import documented_walk


def frames_of_this_stack() -> list[str]:
    """``module.qualname`` of every frame of the calling thread, outermost first."""
    frame, names = sys._getframe(1), []
    while frame is not None:
        names.append(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_qualname}")
        frame = frame.f_back
    return names[::-1]


# a seed no other test uses, so that this process has not built these parameters before
_SEEDS = itertools.count(900_000 + os.getpid() % 1000 * 100)


@pytest.fixture
def validations(monkeypatch):
    """Every ``HyperParameters.model_validate`` call in the test, as (data, context) pairs."""
    calls = []
    original = HyperParameters.model_validate.__func__

    def counting(cls, obj, *args, **kwargs):
        calls.append((obj, kwargs.get("context")))
        return original(cls, obj, *args, **kwargs)

    monkeypatch.setattr(HyperParameters, "model_validate", classmethod(counting))
    return calls


@pytest.mark.slow
def test_a_run_through_prefect_validates_its_parameters_once(prefect_server, tmp_path, validations, one_thread,
                                                               capsys, monkeypatch):
    from nip_core.runs import RunStore

    from nip_core.trainers.objectives.base import NipLossModule

    # The stack inside the loss's forward pass, seen from the advantage it reads (TorchRL wraps
    # each loss class's own ``forward`` when the class is made, so that cannot be patched).
    stacks = []
    advantage = NipLossModule.advantage

    def recording(self, td):
        stacks.append(frames_of_this_stack())
        return advantage(self, td)

    monkeypatch.setattr(NipLossModule, "advantage", recording)
    seed = next(_SEEDS)
    argv = ["run", "graph_isomorphism", "vanilla_ppo", "--params", "configs/gi_nip_ppo_small.json",
            "--set", "dataset=test", "--set", "rl.num_iterations=2", "--set", "rl.frames_per_batch=64",
            "--set", "rl.minibatch_size=32", "--set", "rl.num_test_iterations=1", "--set", f"seed={seed}",
            "--checkpoint-every", "1", "--runs-dir", str(tmp_path), "--run-id", "once", "--no-wandb",
            "--progress", "off"]
    assert main(argv) == 0
    assert "status          completed" in capsys.readouterr().out
    # the CLI's build; the flow, its two RL blocks, their tasks and the run store reuse it
    assert len(validations) == 1 and validations[0][0]["seed"] == seed
    # every loss computed went the documented way, frame by frame (other frames between them)
    documented = documented_walk("loss")
    assert stacks
    for stack in stacks:
        positions = [stack.index(frame) if frame in stack else None for frame in documented]
        assert None not in positions, [f for f, p in zip(documented, positions) if p is None]
        assert positions == sorted(positions)
    stored = RunStore(str(tmp_path)).load_params("once")
    assert len(validations) == 1 and stored.seed == seed
    # a different tree is validated (and refused) as before
    with pytest.raises(ParameterError, match="rl.lr"):
        HyperParameters.from_dict({**stored.to_dict(), "rl": {**stored.to_dict()["rl"], "lr": -1.0}})
    assert len(validations) == 2
