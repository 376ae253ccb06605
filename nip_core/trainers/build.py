"""``build_trainer``: the registered trainer of a set of hyper-parameters, ready to train.

It lives apart from :mod:`nip_core.trainers.base` (which the trainer classes import) and
from :mod:`nip_core.trainers.registry` (which the trainer modules import), so that neither of
those two imports the other: the registry knows trainer classes only by their
registration, and the base class knows nothing of the registry.
"""

from __future__ import annotations

from nip_core.parameters import HyperParameters
from nip_core.parameters.base import ParameterError
from nip_core.parameters.base_run import merge_with_base_run
from nip_core.parameters.trainer_specs import trainer_kind
from nip_core.runs import Run, RunStore
from nip_core.settings import ExperimentSettings, resolve_device
from nip_core.trainers.registry import get_trainer_class
from nip_core.trainers.base import Trainer
from nip_core.trainers.hooks import TrainerHooks


def build_trainer(hyper_params: HyperParameters, settings: ExperimentSettings | None = None,
                  *, run: Run | None = None, hooks: TrainerHooks | None = None,
                  open_run: bool = True) -> Trainer:
    """Build the registered trainer for ``hyper_params.trainer``.

    When ``settings.run_id`` is set and ``run`` is not given, the run is opened (or
    created) in ``settings.runs_dir`` with the settings' params-mismatch policy.

    Parameters
    ----------
    hyper_params
        The experiment's parameters; with a base run (``base_run.base_run_type`` other
        than ``"none"``) they are merged with the base run's stored parameters first.
    settings
        Run-time options; the defaults when ``None``.
    run
        An opened run to train in; when ``None`` and ``open_run`` is true, the run of
        ``settings.run_id`` (if any) is opened.
    hooks
        Observer callbacks handed to the trainer.
    open_run
        Whether to open ``settings.run_id``'s run when ``run`` is not given.

    Raises
    ------
    UnknownTrainerError
        If no trainer is registered as ``hyper_params.trainer``.
    DeviceUnavailableError
        If the trainer computes on a torch device and ``settings.device`` names a CUDA
        device this host does not have: before the run is opened or anything is built.
    """
    settings = settings or ExperimentSettings()
    if hyper_params.base_run.base_run_type != "none":
        base = RunStore(settings.runs_dir).load_params(hyper_params.base_run.run_id)
        hyper_params = merge_with_base_run(hyper_params, base)
    cls = get_trainer_class(hyper_params.trainer)
    if hyper_params.base_run.base_run_type == "rerun_tests":
        _check_rerun_tests(cls, hyper_params, settings)
    if cls.uses_torch_device:
        resolve_device(settings.device)  # the trainer resolves it again; this only fails early
    if run is None and open_run and settings.run_id and not settings.test_run:
        run = RunStore(settings.runs_dir).open_run(settings.run_id, hyper_params,
                                                   on_params_mismatch=settings.on_params_mismatch)
    return cls(hyper_params, settings=settings, run=run, hooks=hooks)


def _check_rerun_tests(cls: type, hyper_params: HyperParameters, settings: ExperimentSettings) -> None:
    """Refuse a rerun-tests run that the trainer cannot do, before anything is opened.

    The pure-text trainers replay the base run's models; the TorchRL trainers test its newest
    checkpoint (:mod:`nip_core.trainers.tensordict_checkpoints`), so the base run must have one.
    A trainer with neither (``solo_agent``, a custom loop) would train from scratch instead.
    """
    from nip_core.trainers.tensordict_checkpoints import TensorDictCheckpointMixin, latest_checkpoint_iteration

    run_id = hyper_params.base_run.run_id
    if trainer_kind(hyper_params.trainer) == "pure_text":
        return
    if not issubclass(cls, TensorDictCheckpointMixin):
        raise ParameterError([("base_run.base_run_type",
                               f"'rerun_tests' is implemented for the pure-text trainers and the TorchRL trainers "
                               f"(vanilla_ppo, spg, reinforce), not for {hyper_params.trainer!r}; test a trained "
                               f"run's checkpoint with `nipflow evaluate RUN_ID --dataset-file PATH`, or use "
                               f"'parameters' to train again from the base run's hyper-parameters")])
    if latest_checkpoint_iteration(RunStore(settings.runs_dir).open_run(run_id)) is None:
        raise ParameterError([("base_run.run_id", f"run '{run_id}' has no checkpoint to test again")])
