"""``TensorDictTrainer``: the base of trainers of local torch agents on a TensorDict scenario.

It resolves the device, seeds, builds (or takes) the scenario's components and moves the
combined agents there, and holds the two context builders of nip's guide that its
subclasses' loops enter: :meth:`TensorDictTrainer._build_train_context` and
:meth:`TensorDictTrainer._build_test_context` (each enters its contexts on an
``ExitStack``). The RL loop is :class:`nip_core.trainers.tensordict_rl.TensorDictRlTrainer`;
the supervised one :class:`nip_core.trainers.solo_agent.SoloAgentTrainer`.
"""

from __future__ import annotations

import contextlib
from contextlib import ExitStack

import torch
from torch import nn

from nip_core.scenarios.registry import build_scenario_instance
from nip_core.settings import ExperimentSettings, resolve_device
from nip_core.trainers.base import Trainer, refuse_settings_as_scenario, set_global_seed
from nip_core.trainers.tensordict_checkpoints import RngStatesMixin


@contextlib.contextmanager
def module_mode(module: nn.Module, training: bool):
    """``module.train(training)`` inside the block; the previous mode after it."""
    previous = module.training
    module.train(training)
    try:
        yield
    finally:
        module.train(previous)


class TensorDictTrainer(RngStatesMixin, Trainer):
    """A trainer of local torch agents on a TensorDict scenario.

    Parameters
    ----------
    hyper_params, settings, run, hooks, stat_logger
        As :class:`~nip_core.trainers.base.Trainer`.
    scenario_instance
        Ready-made scenario components (tests inject small ones); built from the
        scenario registry when omitted.

    The device is resolved first, before anything is built
    (:func:`~nip_core.settings.resolve_device`): ``settings.device`` of the trainer is the
    device it computes on here (``"auto"`` becomes ``"cuda"`` or ``"cpu"``), and
    ``requested_device`` the device as asked, which is what a process on another host
    (an RL block) must resolve again.

    Raises
    ------
    DeviceUnavailableError
        If ``settings.device`` names a CUDA device this host does not have.
    """

    uses_torch_device = True
    # Registration reads these (nip_core/trainers/registry.py), so that a subclass registered with
    # only ``@register_trainer`` (nip's guide) needs no more: nip's ``trainer_type`` says what the
    # scenario builds — ``"rl"``: policy and value heads, ``"solo_agent"``: the solo heads only.
    trainer_kind = "tensordict"
    needs_critic = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.trainer_type == "solo_agent":  # a solo trainer declared the nip way, by trainer_type
            if "trainer_kind" not in cls.__dict__:
                cls.trainer_kind = "solo"
            if "needs_critic" not in cls.__dict__:
                cls.needs_critic = False

    def __init__(self, hyper_params, scenario_instance=None, settings=None, *, run=None, hooks=None,
                 stat_logger=None):
        refuse_settings_as_scenario(type(self), scenario_instance)
        settings = settings or ExperimentSettings()
        self.requested_device: str = settings.device
        settings = settings.model_copy(update={"device": resolve_device(settings.device)})
        super().__init__(hyper_params, None, settings, run=run, hooks=hooks, stat_logger=stat_logger)
        set_global_seed(hyper_params.seed)
        if scenario_instance is None:
            scenario_instance = build_scenario_instance(hyper_params, self.settings,
                                                        trainer_type=self.trainer_type)
        self.scenario_instance = scenario_instance
        self.protocol_handler = scenario_instance.protocol_handler
        self.agents: nn.Module = scenario_instance.extras["combined_agents"].to(self.settings.device)
        self.agent_names = list(self.protocol_handler.agent_names)
        self.verifier_index = self.agent_names.index(self.protocol_handler.verifier_names[0])

    # -- extension points: the contexts of the loops ------------------------------------------

    def _build_train_context(self, stack: ExitStack) -> list:
        """Enter the contexts of the training loop on ``stack``; return them (the agents' training mode)."""
        contexts = [module_mode(self.agents, training=True)]
        for context in contexts:
            stack.enter_context(context)
        return contexts

    def _build_test_context(self, stack: ExitStack) -> list:
        """Enter the contexts of the test loop on ``stack``; return them (no gradients, evaluation mode)."""
        contexts = [torch.no_grad(), module_mode(self.agents, training=False)]
        for context in contexts:
            stack.enter_context(context)
        return contexts
