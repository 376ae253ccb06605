"""Run store: state, checkpoints, rollouts, fine-tune records and metrics of each run."""

from nip_core.runs.lock import RunLock
from nip_core.runs.null import NullRun
from nip_core.runs.storage import Storage
from nip_core.runs.store import Run, RunStore, package_version, validate_run_id

__all__ = ["NullRun", "Run", "RunLock", "RunStore", "Storage", "package_version", "validate_run_id"]
