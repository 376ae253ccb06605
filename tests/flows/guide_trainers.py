"""Two trainers written from nip's seed documents only, as a researcher porting one would.

Every method says which passage it follows (seed 000: the trainer guide "Creating a New
Trainer"; seed 002: the ``TensorDictRlTrainer`` API page). Each override records its name in
``CALLS`` and then does what the documents say it does (mostly: calls the superclass and adds
to the result), so ``test_guide_trainers.py`` can check that nipflow calls every one of them,
directly and under Prefect. Importing this module registers both, as the guide's
"Main Steps" say: "Register the trainer with the register_trainer decorator" (the test
imports it in a fixture, so that they are registered only while its tests run).
"""

from __future__ import annotations

import functools
from typing import Callable

from torchrl.objectives import ValueEstimators

from nip_core.trainers.progress import attach_progress_bar
from nip_core.trainers.pure_text_base import PureTextRlTrainer
from nip_core.trainers.registry import register_trainer
from nip_core.trainers.tensordict_rl import TensorDictRlTrainer
from tests.nip_core.trainers.test_extension_points import MinimalPpoLoss

#: names of the overrides called, in order (all trainers of this module, all processes' threads)
CALLS: list[str] = []

TENSORDICT_HOOKS = (
    "_add_normalization_transforms", "_build_operators", "_build_test_context", "_build_train_context",
    "_get_data_collectors", "_get_log_stats", "_get_loss_module_and_gae", "_get_metadata",
    "_get_optimizer_and_param_freezer", "_get_replay_buffer", "_initialise_state",
    "_load_state_dict_from_active_run_checkpoint", "_load_state_dict_from_base_run_checkpoint",
    "_pretrain_agents", "_run_test_loop", "_run_train_loop", "_train_on_replay_buffer",
    "load_and_set_state_from_checkpoint", "save_checkpoint")
PURE_TEXT_HOOKS = ("_sample_rollouts", "_get_log_stats", "_stage_create_fine_tune_jobs", "_initialise_state")


def recorded(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        CALLS.append(f"{type(self).trainer_name}.{method.__name__}")
        return method(self, *args, **kwargs)
    return wrapper


# Seed 000, "Main Steps": "Implement the trainer by subclassing one of the base classes ...
# Register the trainer with the register_trainer decorator." Seed 000, "TensorDictRlTrainer":
# "Use this class if your trainer works with TensorDict data structures and you're happy to
# use a standard TorchRL training loop, but you need to specify a new loss function."
@register_trainer("seed_guide_td")
class GuideTensorDictTrainer(TensorDictRlTrainer):

    # Seed 000, "TensorDictRlTrainer": "subclass this class and define the
    # _get_loss_module_and_gae method. This method should return a loss module ... and,
    # optionally, a Generalised Advantage Estimation (GAE) module", built as the snippet shows.
    @recorded
    def _get_loss_module_and_gae(self):
        loss_module = MinimalPpoLoss(self.scenario_instance.combined_policy_head, self.message_key)
        loss_module.make_value_estimator(ValueEstimators.GAE, gamma=self.hyper_params.rl.gamma,
                                         lmbda=self.hyper_params.rl.lmbda)
        gae = loss_module.value_estimator
        return loss_module, gae

    # Seed 000: "The train and test loops are implemented in the _run_train_loop and
    # _run_test_loop methods ... You can customise these methods as needed", decorated "with
    # attach_progress_bar" and using "iteration_context.set_description(...)".
    @attach_progress_bar(lambda self: self.hyper_params.rl.num_iterations)
    @recorded
    def _run_train_loop(self, iteration_context):
        iteration_context.set_description("Training")
        return super()._run_train_loop(iteration_context=iteration_context)

    @attach_progress_bar(lambda self: self.hyper_params.rl.num_test_iterations)
    @recorded
    def _run_test_loop(self, iteration_context):
        iteration_context.set_description("Testing")
        return super()._run_test_loop(iteration_context=iteration_context)

    # Seed 002 (API page), one method each: what the page says it does, via the superclass.
    @recorded
    def _add_normalization_transforms(self):  # "Add observation normalization transforms to the environments."
        return super()._add_normalization_transforms()

    @recorded
    def _build_operators(self):  # "Get the policy and value operators for the agents."
        super()._build_operators()
        assert self.policy_operator is not None and self.value_operator is not None

    @recorded
    def _build_train_context(self, stack):  # "Build the context manager ExitStack for training."
        return super()._build_train_context(stack)

    @recorded
    def _build_test_context(self, stack):  # "Build the context manager ExitStack for testing."
        return super()._build_test_context(stack)

    @recorded
    def _get_data_collectors(self):  # "Construct the data collectors, which generate rollouts"
        return super()._get_data_collectors()

    @recorded
    def _get_log_stats(self, rollouts, mean_loss_vals=None, *, train=True):
        # "Compute the statistics to log during training or testing."
        stats = super()._get_log_stats(rollouts, mean_loss_vals, train=train)
        stats["guide_frames"] = float(rollouts.numel())
        return stats

    @recorded
    def _get_metadata(self) -> dict:  # "Get metadata relevant to the current experiment, for saving the checkpoint."
        return {**super()._get_metadata(), "guide": "seed 002"}

    @recorded
    def _get_optimizer_and_param_freezer(self, loss_module):
        # "Construct the optimizer for the loss module and the model parameter freezer."
        return super()._get_optimizer_and_param_freezer(loss_module)

    @recorded
    def _get_replay_buffer(self, transform=None):  # "Construct the replay buffer, which will store the rollouts."
        return super()._get_replay_buffer(transform)

    @recorded
    def _initialise_state(self):  # "Initialise the state of the trainer."
        return super()._initialise_state()

    @recorded
    def _load_state_dict_from_active_run_checkpoint(self) -> dict:
        # "Load the experiment state from a checkpoint for the active run, if available."
        return super()._load_state_dict_from_active_run_checkpoint()

    @recorded
    def _load_state_dict_from_base_run_checkpoint(self, version="latest") -> dict:
        # "Load the experiment state from a base run checkpoint."
        return super()._load_state_dict_from_base_run_checkpoint(version)

    @recorded
    def _pretrain_agents(self):  # "Pretrain the agent bodies in isolation."
        return super()._pretrain_agents()

    @recorded
    def _train_on_replay_buffer(self):  # "Train the agents on data in the replay buffer." -> TensorDict
        return super()._train_on_replay_buffer()

    @recorded
    def load_and_set_state_from_checkpoint(self, from_base_run=False, version="latest"):
        # "Load and set the experiment state from a checkpoint, if available."
        return super().load_and_set_state_from_checkpoint(from_base_run, version)

    @recorded
    def save_checkpoint(self, *args, **kwargs):  # "Save the state of the experiment to a checkpoint."
        return super().save_checkpoint(*args, **kwargs)


# Seed 000, "PureTextRlTrainer": "Use this class if your trainer works with pure text data
# structures. All subclasses must define at least the _stage_create_fine_tune_jobs method."
@register_trainer("seed_guide_text")
class GuideTextTrainer(PureTextRlTrainer):

    # Seed 000, "Experiment State": "a dataclass specified by the Trainer.State child class
    # (or a subclass specific to the current scenario), and is available as self.state".
    class State(PureTextRlTrainer.State):
        rollouts_logged: int = 0

    @recorded
    def _initialise_state(self):
        return super()._initialise_state()

    # "Sample rollouts from the environment. You can customise this stage by overriding the
    # _sample_rollouts method." ... "Any customisation to the _sample_rollouts method will
    # also affect the test loop."
    @recorded
    def _sample_rollouts(self, environment, iteration, use_tqdm=False, tqdm_desc="Sampling rollouts"):
        return super()._sample_rollouts(environment, iteration, use_tqdm, tqdm_desc)

    # "Logging can be customised by overriding the _get_log_stats method. This method returns
    # a dictionary of statistics to log, and when overriding, it is recommended to call the
    # superclass method and update the dictionary."
    @recorded
    def _get_log_stats(self, rollouts, *, train=True) -> dict[str, float]:
        stats = super()._get_log_stats(rollouts, train=train)
        stats["guide_rollouts"] = float(len(rollouts))
        if train:
            self.state.rollouts_logged += len(rollouts)
        return stats

    # "This method takes as input the rollouts sampled in the first stage and calls an
    # appropriate method of each PureTextSharedModelGroup agent group (e.g.
    # create_supervised_fine_tune_job)." Seed 000, "Protocol Handler": verifier_names.
    @recorded
    def _stage_create_fine_tune_jobs(self, rollouts):
        for group_name, shared_model_group in self.shared_model_groups.items():
            rollouts_per_agent = {name: rollouts for name in shared_model_group.agent_names}
            guess_replaced = {name: rollouts[:2] for name in shared_model_group.agent_names
                              if name in self.protocol_handler.verifier_names}
            shared_model_group.create_supervised_fine_tune_job(
                rollouts_per_agent, guess_replaced, job_name=f"guide-{self.state.iteration}-{group_name}")


def reregister() -> None:
    """Register both again (after a test unregistered them)."""
    register_trainer("seed_guide_td")(GuideTensorDictTrainer)
    register_trainer("seed_guide_text")(GuideTextTrainer)


def called(trainer: str) -> list[str]:
    """The hooks of ``trainer`` called so far, without the prefix."""
    return [c.split(".", 1)[1] for c in CALLS if c.startswith(trainer + ".")]
