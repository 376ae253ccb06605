"""Fake trainers inside flow-run processes started by real Prefect workers (e2e tests only).

A process worker starts each flow run as ``python -m prefect.engine`` with the worker's
environment, so the only way to reach the trainer registry of those processes without
touching the deployed code is the interpreter's start-up: this directory is put on the
*worker's* ``PYTHONPATH`` by ``tests/e2e/test_multi_worker_e2e.py``, Python imports this
``sitecustomize`` in every process of that worker, and when ``NIPFLOW_E2E_FAKES=1``

* nothing happens at start-up (the worker itself imports no trainer code), but
* once the package ``nip_core.trainers`` has been imported, its first trainer lookup
  (``get_trainer_class``, which every ``build_trainer`` goes through) first calls
  :func:`e2e_fakes.install`, which registers the fake trainers. (Deployment entrypoints
  such as ``flows/experiment.py`` are loaded by file path, so a hook on ``flows.*`` would
  come too late.)

Without ``NIPFLOW_E2E_FAKES=1`` this module does nothing.
"""

import os
import sys

if os.environ.get("NIPFLOW_E2E_FAKES") == "1":
    import importlib.abc
    import importlib.util

    def _install_before_first_lookup(trainers):
        """Make the first trainer lookup install the fakes (not the import itself: an
        entrypoint script runs with its own folder first on ``sys.path``, where a flow
        module could shadow a package of the same name)."""
        from nip_core.trainers import registry

        original = registry.get_trainer_class

        def get_trainer_class(name):
            if registry.get_trainer_class is get_trainer_class:
                registry.get_trainer_class = trainers.get_trainer_class = original
                import e2e_fakes

                e2e_fakes.install()
            return original(name)

        registry.get_trainer_class = trainers.get_trainer_class = get_trainer_class

    class _InstallFakesAfterTrainers(importlib.abc.MetaPathFinder):
        target = "nip_core.trainers"

        def find_spec(self, fullname, path=None, target=None):
            if fullname != self.target:
                return None
            sys.meta_path.remove(self)  # find the real module with the remaining finders
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_then_patch(module):
                exec_module(module)
                _install_before_first_lookup(module)

            spec.loader.exec_module = exec_then_patch
            return spec

    sys.meta_path.insert(0, _InstallFakesAfterTrainers())
