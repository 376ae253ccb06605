"""The code snippets of nip's trainer guide (seed 000, "Creating a New Trainer") run against nipflow.

Each snippet is kept verbatim as a string, except for its import paths (``nip.*`` ->
``nip_core.*``), and run with ``exec``. The guide's snippets are fragments: ``...`` stands for
the rest of the reader's code (it is valid Python and is kept), and some names come from the
surrounding code the guide assumes (``TensorDictTrainer``, ``IterationContext``, the
``loss_module`` being built). Those names are supplied in the namespace the snippet runs in,
each one documented at the place it is supplied; the snippet's own lines are not changed.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import torch

from nip_core.trainers.progress import IterationContext
from nip_core.trainers.tensordict_base import TensorDictTrainer
from nip_core.trainers.tensordict_rl import TensorDictRlTrainer
from tests.nip_core.trainers.gi_helpers import params_of, settings_for, tiny_params, tiny_scenario

# --- the snippets, verbatim but for import paths ---------------------------------------

# Seed 000, section "Trainer Base Classes" > "TensorDictRlTrainer": how the GAE module is
# built from the loss module inside ``_get_loss_module_and_gae``.
SNIPPET_GAE = """
from torchrl.objectives import ValueEstimators
...
loss_module.make_value_estimator(ValueEstimators.GAE, **additional_parameters)
gae = loss_module.value_estimator
"""

# Seed 000, section "Trainer Base Classes" > "TensorDictTrainer": train and test loops with
# progress bars (import path: nip.trainers.trainer_base -> nip_core.trainers.progress).
SNIPPET_PROGRESS_BAR = """
from nip_core.trainers.progress import attach_progress_bar
...
class MyTrainer(TensorDictTrainer):
    ...
    # The ``attach_progress_bar`` takes a function that returns the total number of
    # iterations for this phase of training.
    @attach_progress_bar(lambda self: self.hyper_params.rl.num_iterations)
    def _run_train_loop(self, iteration_context: IterationContext):
        # Add a description to the progress bar
        iteration_context.set_description("Training")
        ...
    @attach_progress_bar(lambda self: self.hyper_params.rl.num_test_iterations)
    def _run_test_loop(self, iteration_context: IterationContext):
        # Add a description to the progress bar
        iteration_context.set_description("Testing")
        ...
"""

# Seed 000, section "Trainer Base Classes" > "TensorDictTrainer": the loops run inside the
# contexts built by ``_build_train_context`` / ``_build_test_context``.
SNIPPET_EXIT_STACK = """
from contextlib import ExitStack
...
class MyTrainer(TensorDictTrainer):
    ...
    def train(self):
        ...
        # Run the training loop with the appropriate context managers
        with ExitStack() as stack:
            self._build_train_context(stack)
            self._run_train_loop()
        # Run the test loop with the appropriate context managers
        with ExitStack() as stack:
            self._build_test_context(stack)
            self._run_test_loop()
        ...
"""


def run_snippet(snippet: str, **names: Any) -> dict[str, Any]:
    """``exec`` a snippet in a namespace holding ``names``; return the namespace."""
    namespace: dict[str, Any] = {"__name__": "guide_snippet", **names}
    exec(compile(textwrap.dedent(snippet), "<seed 000 snippet>", "exec"), namespace)
    return namespace


def test_the_snippets_are_the_guides_own_lines():
    """Guard against drift: the lines of each snippet appear in the seed, in order."""
    from pathlib import Path

    seeds = sorted(Path("/work/shared/seeds").glob("000_*.txt")) if Path("/work/shared/seeds").is_dir() else []
    if not seeds:
        pytest.skip("the seed documents are not available here")
    guide_lines = [line.strip() for line in seeds[0].read_text().splitlines()]
    for snippet in (SNIPPET_GAE, SNIPPET_PROGRESS_BAR, SNIPPET_EXIT_STACK):
        position = 0
        for line in textwrap.dedent(snippet).strip().splitlines():
            expected = line.strip().replace("nip_core.trainers.progress", "nip.trainers.trainer_base")
            position = guide_lines.index(expected, position) + 1  # ValueError: not in the guide


# --- snippet 1: GAE from the loss module ------------------------------------------------


class GuideGaeTrainer(TensorDictRlTrainer):
    """A TensorDictRlTrainer whose ``_get_loss_module_and_gae`` is the guide's snippet."""

    trainer_kind = "tensordict"
    needs_critic = True

    def _get_loss_module_and_gae(self):
        from nip_core.trainers.objectives.ppo import ClipPpoLoss

        # the surrounding code the snippet assumes: the loss module and the GAE's arguments
        loss_module = ClipPpoLoss(self.agents, self.hyper_params, self.message_key, use_critic=self.use_critic)
        additional_parameters = {"gamma": self.hyper_params.rl.gamma, "lmbda": self.hyper_params.rl.lmbda}
        namespace = run_snippet(SNIPPET_GAE, loss_module=loss_module, additional_parameters=additional_parameters)
        return loss_module, namespace["gae"]


def test_gae_snippet_builds_the_value_estimator_the_trainer_trains_with(tmp_path):
    from torchrl.objectives.value import GAE

    hp = tiny_params(rl={"num_iterations": 1, "num_test_iterations": 0})
    settings = settings_for(tmp_path)
    trainer = GuideGaeTrainer(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings))
    assert isinstance(trainer.value_estimator, GAE)
    assert trainer.value_estimator is trainer.loss_module.value_estimator
    assert float(trainer.value_estimator.gamma) == pytest.approx(hp.rl.gamma)
    assert float(trainer.value_estimator.lmbda) == pytest.approx(hp.rl.lmbda)
    before = params_of(trainer)
    trainer.train()
    after = params_of(trainer)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "one PPO iteration with the guide's GAE changed no weight"
    trainer.close()


# --- snippet 2: progress bars on the train and test loops ------------------------------


def guide_progress_trainer() -> type:
    """The snippet's ``MyTrainer``; ``TensorDictTrainer`` and ``IterationContext`` are the
    names the guide's ``...`` assumes imported."""
    return run_snippet(SNIPPET_PROGRESS_BAR, TensorDictTrainer=TensorDictTrainer,
                       IterationContext=IterationContext)["MyTrainer"]


def test_progress_bar_snippet_counts_and_describes_both_loops(tmp_path):
    my_trainer = guide_progress_trainer()

    class Concrete(my_trainer):  # the reader's ``...``: a train method, required by Trainer
        def train(self):
            pass

    hp = tiny_params(rl={"num_iterations": 7, "num_test_iterations": 3})
    settings = settings_for(tmp_path)
    trainer = Concrete(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings))
    assert trainer.get_total_num_iterations() == 10
    made: list[IterationContext] = []
    make = trainer.make_iteration_context
    trainer.make_iteration_context = lambda *a, **k: made.append(make(*a, **k)) or made[-1]
    trainer._run_train_loop()
    trainer._run_test_loop()
    assert [(c.total, c.description) for c in made] == [(7, "Training"), (3, "Testing")]
    trainer.close()


# --- snippet 3: the loops inside ExitStack contexts -------------------------------------


def test_exit_stack_snippet_runs_both_loops_in_their_contexts(tmp_path):
    # The guide's MyTrainer is one class across the two TensorDictTrainer snippets: here the
    # ExitStack snippet's ``TensorDictTrainer`` is the progress-bar snippet's MyTrainer, so
    # that ``_run_train_loop``/``_run_test_loop`` exist.
    my_trainer = run_snippet(SNIPPET_EXIT_STACK, TensorDictTrainer=guide_progress_trainer())["MyTrainer"]
    hp = tiny_params(rl={"num_iterations": 2, "num_test_iterations": 1})
    settings = settings_for(tmp_path)
    trainer = my_trainer(hp, settings=settings, scenario_instance=tiny_scenario(hp, settings))
    seen: list[tuple[str, bool]] = []
    train_loop, test_loop = trainer._run_train_loop, trainer._run_test_loop
    trainer._run_train_loop = lambda: (seen.append(("train", trainer.agents.training)), train_loop())
    trainer._run_test_loop = lambda: (seen.append(("test", trainer.agents.training, torch.is_grad_enabled())),
                                      test_loop())
    trainer.train()
    # the train context puts the agents in training mode; the test context in evaluation
    # mode, without gradients
    assert seen == [("train", True), ("test", False, False)]
    assert torch.is_grad_enabled()
    trainer.close()


# --- not a snippet: the guide's documented state of pure-text trainers -------------------


def test_pure_text_state_has_the_fields_the_guide_documents():
    """Seed 000, "Experiment State": ``PureTextRlTrainer.State(iteration, agents, train_loop_stage,
    shared_model_groups, base_run_state_artifact_version)`` and the stage names."""
    from nip_core.trainers.pure_text_base import PureTextRlTrainer

    state = PureTextRlTrainer.State(iteration=3, agents={}, train_loop_stage="await_fine_tune_jobs",
                                    shared_model_groups={}, base_run_state_artifact_version=2)
    assert (state.iteration, state.train_loop_stage, state.base_run_state_artifact_version) == (
        3, "await_fine_tune_jobs", 2)
    defaults = PureTextRlTrainer.State()
    assert (defaults.iteration, defaults.train_loop_stage, defaults.base_run_state_artifact_version) == (
        0, "sample_rollouts", 0)
    for stage in ("sample_rollouts", "log_stats", "create_fine_tune_jobs", "await_fine_tune_jobs",
                  "test_during_training", "test", "done"):
        assert PureTextRlTrainer.State(train_loop_stage=stage).train_loop_stage == stage
