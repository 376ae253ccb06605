"""Rerun-tests mode of the pure-text trainers: replay a finished run's models, test them again.

With ``base_run.base_run_type == "rerun_tests"`` the hyper-parameters are the base run's
except the preserved test fields (see :mod:`nip_core.parameters.base_run`). Iteration
``i`` of the rerun loads the models the base run sampled iteration ``i`` with (its
``models/iter_{i}.json``, written once per iteration: the stored counterpart of nip's
versioned state artifact) instead of sampling and fine-tuning, and runs the test loop
where the current test scheme asks for it. The trainer state's
``base_run_state_artifact_version`` is the base-run iteration whose models were loaded
last; the rerun stops at the first iteration the base run never reached.
"""

from __future__ import annotations

from typing import Any

from nip_core.errors import NipflowError
from nip_core.trainers.pure_text_records import models_path


class BaseRunReplay:
    """The base run of a rerun-tests run and the models it recorded per iteration.

    Parameters
    ----------
    base_run
        The base run, opened in the run store.

    Raises
    ------
    NipflowError
        If the base run recorded no models at all (``models/iter_0.json``): there is
        nothing to test again.
    """

    def __init__(self, base_run: Any):
        self.run = base_run
        if not base_run.exists(models_path(0)):
            raise NipflowError(f"base_run.run_id: run '{base_run.run_id}' has no {models_path(0)} "
                               "(it never sampled an iteration): nothing to test again")

    @classmethod
    def open(cls, runs_dir: str, run_id: str) -> "BaseRunReplay":
        from nip_core.runs import RunStore

        return cls(RunStore(runs_dir).open_run(run_id))

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def models(self, iteration: int) -> dict[str, str] | None:
        """Group -> model the base run sampled ``iteration`` with (``None`` if it never got there)."""
        path = models_path(iteration)
        if not self.run.exists(path):
            return None
        return self.run.read_json(path, "base run models")

    def load_into(self, groups: dict[str, Any], iteration: int) -> bool:
        """Point every group at its base-run model of ``iteration``; ``False`` if there is none.

        Raises
        ------
        NipflowError
            If the base run's record has no model for one of the groups.
        """
        models = self.models(iteration)
        if models is None:
            return False
        for name, g in groups.items():
            if name not in models:
                raise NipflowError(f"base run '{self.run_id}' {models_path(iteration)} has no model for group '{name}'")
        for name, g in groups.items():
            g.state.fine_tuned_model_name = None if models[name] == g.params.model_name else models[name]
        return True
