"""Where a run's Prefect results and locks live, and the cache policy of run-keyed tasks.

Every task of a run persists its result inside the run store (``<run>/results``) and is
keyed by ``(run_id, params_hash, <position>)`` rather than by the flow run, so that a
*new* flow run for the same run_id finds the results of the previous one and does not
execute completed work again. Keys are computed from the run, never from the raw inputs
(``INPUTS`` alone would collide across tasks). A task receives the run's spec
(:mod:`tasks.trainers`), from which the run id, the params hash and the run's storage
follow without opening the run.
Transactions are SERIALIZABLE with expiring lease locks in the run's storage
(:mod:`tasks.locks`), so two processes that race on the same key execute it once — on one
host or several; the second one waits and reads the first's result.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from prefect.cache_policies import CachePolicy
from prefect.transactions import IsolationLevel

from nip_core.runs import RunStore, Storage
from nip_core.settings import ExperimentSettings
from tasks.locks import LeaseLockManager
from tasks.trainers import RunSpecLike, spec_key

RESULTS_DIR = "results"
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")


class ResultStorageError(RuntimeError):
    """The run's result storage cannot be set up (names the location)."""


def run_cache_key(run_id: str, params_hash: str, *parts: Any) -> str:
    """The result file name of one unit of work of a run.

    Dots are replaced: Prefect's lock files are named ``Path(key).with_suffix(".lock")``,
    which would cut a dotted key short and make keys collide.

    >>> run_cache_key("r1.a", "abc", "it3", "log_stats")
    'r1_a--abc--it3--log_stats'
    """
    return "--".join(_UNSAFE.sub("_", str(p)) for p in (run_id, params_hash, *parts))


def run_storage_of(spec: RunSpecLike) -> Storage:
    """The storage of ``spec``'s run (``settings.runs_dir``/``run_id``), without opening it.

    Raises
    ------
    ResultStorageError
        If the spec names no run (``settings.run_id``) or asks for ``test_run``.
    """
    if not spec.settings.get("run_id") or spec.settings.get("test_run"):
        raise ResultStorageError("spec.settings: Prefect tasks need a run in the run store "
                                 "(set settings.run_id and do not use test_run)")
    runs_dir = spec.settings.get("runs_dir") or ExperimentSettings.model_fields["runs_dir"].default
    return RunStore(str(runs_dir)).run_storage(str(spec.settings["run_id"]))


def result_storage_for(storage: Storage):
    """Result storage inside the run directory (``storage``: the run's).

    A local run store gives a ``pathlib.Path`` (Prefect reads it as a local file system
    without any server-side block). An fsspec URL gives a saved ``RemoteFileSystem``
    block named after the URL, so that workers on other machines read the same results.
    """
    location = storage.url(RESULTS_DIR)
    if storage.local:
        return Path(location)
    from prefect.filesystems import RemoteFileSystem

    name = "nipflow-results-" + hashlib.sha1(location.encode()).hexdigest()[:12]
    try:
        return RemoteFileSystem.load(name)
    except ValueError:
        block = RemoteFileSystem(basepath=location)
        try:
            block.save(name, overwrite=True)
        except Exception as e:  # noqa: BLE001 - re-raised with the location
            raise ResultStorageError(f"cannot register result storage block for {location}: {e}") from e
        return block


@dataclass
class RunKeyPolicy(CachePolicy):
    """Cache key ``(run_id, params_hash, *key_fn(inputs))`` of one run's task.

    ``run_id`` and ``params_hash`` are the run's (:func:`tasks.trainers.spec_key` of the
    spec the task receives); ``key_fn`` maps the task's inputs to the position parts (for
    example ``("it3", "log_stats")``).
    """

    run_id: str = ""
    params_hash: str = ""
    key_fn: Optional[Callable[[dict[str, Any]], tuple]] = None

    def compute_key(self, task_ctx, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> Optional[str]:
        if not self.run_id or not self.params_hash:
            raise ResultStorageError("RunKeyPolicy needs the run_id and params_hash of a run (task_options_for)")
        parts = self.key_fn(inputs) if self.key_fn else ()
        return run_cache_key(self.run_id, self.params_hash, *parts)


def task_options_for(spec: RunSpecLike, key_fn: Callable[[dict[str, Any]], tuple]) -> dict[str, Any]:
    """``Task.with_options`` arguments that make a task of ``spec``'s run resumable and race-safe."""
    storage = run_storage_of(spec)
    run_id, params_hash = spec_key(spec)
    policy = RunKeyPolicy(run_id=run_id, params_hash=params_hash, key_fn=key_fn).configure(
        isolation_level=IsolationLevel.SERIALIZABLE,
        lock_manager=LeaseLockManager(storage),
    )
    return dict(cache_policy=policy, persist_result=True, result_storage=result_storage_for(storage),
                result_serializer="json")
