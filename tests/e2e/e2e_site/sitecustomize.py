"""Fake trainers inside flow-run processes started by real Prefect workers (e2e tests only).

A process worker starts each flow run as ``python -m prefect.engine`` with the worker's
environment, so the only way to reach the trainer registry of those processes without
touching the deployed code is the interpreter's start-up: this directory is put on the
*worker's* ``PYTHONPATH`` by ``tests/e2e/test_multi_worker_e2e.py``, Python imports this
``sitecustomize`` in every process of that worker, and when ``NIPFLOW_E2E_FAKES=1``

* nothing happens at start-up (the worker itself imports no trainer code), but
* right after ``nip_core.trainers.catalogue`` has registered the built-in trainers — which
  the first trainer lookup (``get_trainer_class``, which every ``build_trainer`` goes
  through) does, and nothing before it — :func:`e2e_fakes.install` registers the fake
  trainers under the built-ins' names. (Deployment entrypoints such as
  ``flows/experiment.py`` are loaded by file path, so a hook on ``flows.*`` would come too
  late; the production code has no hook for this.)

Without ``NIPFLOW_E2E_FAKES=1`` this module does nothing.
"""

import os
import sys

if os.environ.get("NIPFLOW_E2E_FAKES") == "1":
    import importlib.abc
    import importlib.util

    class _InstallFakesAfterCatalogue(importlib.abc.MetaPathFinder):
        target = "nip_core.trainers.catalogue"

        def find_spec(self, fullname, path=None, target=None):
            if fullname != self.target:
                return None
            sys.meta_path.remove(self)  # find the real module with the remaining finders
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_then_install(module):
                exec_module(module)  # the built-in trainers are registered now
                import e2e_fakes

                e2e_fakes.install()

            spec.loader.exec_module = exec_then_install
            return spec

    sys.meta_path.insert(0, _InstallFakesAfterCatalogue())
