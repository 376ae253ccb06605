"""Exceptions raised by nip_core; each names the file, field, run or job concerned."""

from __future__ import annotations

import signal


class NipflowError(Exception):
    """Base class of every nipflow error that a user can act on."""


class CheckpointNotFoundError(NipflowError):
    """A state or checkpoint file that should exist does not."""

    def __init__(self, path: str, what: str = "checkpoint"):
        self.path = path
        super().__init__(f"{what} not found: {path}")


class CorruptCheckpointError(NipflowError):
    """A state or checkpoint file exists but cannot be trusted (bad JSON, bad checksum...)."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"corrupt checkpoint {path}: {reason}")


class ParamsMismatchError(NipflowError):
    """An existing run was opened with different hyper-parameters."""

    def __init__(self, run_id: str, fields: list[str], path: str):
        self.run_id = run_id
        self.fields = fields
        shown = ", ".join(fields[:20]) + (f" (+{len(fields) - 20} more)" if len(fields) > 20 else "")
        super().__init__(
            f"run '{run_id}' exists with different hyper-parameters ({path}); differing fields: "
            f"{shown}. Use another --run-id, or on_params_mismatch='warn'|'force'."
        )


class WriteOnceConflictError(NipflowError):
    """A write-once run-store file exists already with other content; it was not replaced."""

    def __init__(self, path: str, what: str):
        self.path = path
        super().__init__(f"{what} {path} exists already with other content (written by another driver of "
                         f"this run?); it is written once and was not replaced")


class RunLockedError(NipflowError):
    """Another live process is driving the run."""

    def __init__(self, run_id: str, holder: dict, path: str):
        self.run_id = run_id
        self.holder = holder
        desc = ", ".join(f"{k}={v}" for k, v in holder.items() if k != "token")
        super().__init__(f"run '{run_id}' is locked by another process ({desc}); lock file {path}")


class RunNotFoundError(NipflowError):
    def __init__(self, run_id: str, path: str):
        self.run_id = run_id
        super().__init__(f"run '{run_id}' not found (looked in {path})")


class FineTuneJobFailed(NipflowError):
    """A fine-tune job ended in ``failed`` or ``cancelled``."""

    def __init__(self, job_id: str, group: str, status: str, error_repr: str):
        self.job_id = job_id
        self.group = group
        self.status = status
        super().__init__(f"fine-tune job {job_id} of group '{group}' {status}: {error_repr}")


class InvalidRunIdError(NipflowError, ValueError):
    def __init__(self, run_id: str):
        super().__init__(
            f"invalid run_id {run_id!r}: use 1-128 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit"
        )


class TrainingPreempted(NipflowError):
    """Training stopped on a signal after checkpointing the last finished iteration
    (raised by :mod:`nip_core.trainers.preemption`)."""

    def __init__(self, signum: int, iteration: int):
        self.signum = signum
        self.iteration = iteration
        super().__init__(f"training preempted by {signal.Signals(signum).name}: checkpoint of iteration {iteration} "
                         f"saved; resume the run to continue from it")
