"""Waiting for the fine-tune jobs of an iteration: polling with backoff, retries, timeout.

:class:`FineTuneWaiter` polls every shared model group's job of the current iteration.
Every change of a job's status is saved in the state (``nipflow status`` shows it). A job
found ``failed`` or ``cancelled`` is retried as a new attempt (the group raises
``FineTuneJobFailed`` once out of attempts). A blocking wait sleeps
``settings.fine_tune_poll_interval_s``, doubling up to ``fine_tune_poll_max_interval_s``,
and gives up after ``fine_tune_wait_timeout_s`` (``None``: never); a non-blocking check
raises :class:`FineTuneJobsPending` while a job is still going.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from nip_core.errors import NipflowError


class FineTuneJobsPending(NipflowError, RuntimeError):
    """A non-blocking await found fine-tune jobs still pending or running."""

    def __init__(self, statuses: dict[str, str]):
        self.statuses = statuses
        super().__init__(f"fine-tune jobs still going: {statuses}")


class FineTuneWaitTimeout(NipflowError, TimeoutError):
    """The jobs of an iteration did not finish within ``settings.fine_tune_wait_timeout_s``."""

    def __init__(self, iteration: int, statuses: dict[str, str], timeout: float):
        super().__init__(f"iteration {iteration}: fine-tune jobs {statuses} not finished after {timeout} s")


class FineTuneWaiter:
    """Polls, retries and waits for the jobs of the shared model groups.

    Parameters
    ----------
    groups
        Group name -> ``PureTextSharedModelGroup`` (their states hold the jobs).
    settings
        ``ExperimentSettings``: the poll interval, its maximum and the wait timeout.
    save_state
        Called after every change of a status and after a retry.
    retry_kwargs
        Called for the keyword arguments of ``retry_failed_job`` (``run``, ``run_id``,
        ``iteration``) at the time of the retry.
    sleep, clock
        ``time.sleep`` and ``time.monotonic`` (injectable for unit tests).
    """

    def __init__(self, groups: dict[str, Any], settings: Any, save_state: Callable[[], None],
                 retry_kwargs: Callable[[], dict[str, Any]], sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.groups = groups
        self.settings = settings
        self.save_state = save_state
        self.retry_kwargs = retry_kwargs
        self.sleep = sleep
        self.clock = clock

    def poll(self) -> dict[str, str]:
        """The status of every group's job (one API call per group, no waiting)."""
        return {name: g.get_fine_tune_job_status() for name, g in self.groups.items()}

    def wait(self, iteration: int, block: bool, bar: Any = None) -> dict[str, str]:
        """Return the statuses once every job succeeded.

        Raises
        ------
        FineTuneJobsPending
            If ``block`` is false and a job is still going.
        FineTuneWaitTimeout
            If the jobs are not done within ``settings.fine_tune_wait_timeout_s``.
        """
        interval = self.settings.fine_tune_poll_interval_s
        timeout = self.settings.fine_tune_wait_timeout_s
        deadline = None if timeout is None else self.clock() + timeout
        done = 0
        while True:
            before = {n: g.state.last_status for n, g in self.groups.items()}
            statuses = self.poll()
            if any(before.get(n) != s for n, s in statuses.items()):
                self.save_state()
            if bar is not None:
                finished = sum(s == "succeeded" for s in statuses.values())
                bar.step(finished - done)
                done = finished
                bar.set_postfix(**statuses)
            failed = [n for n, s in statuses.items() if s in ("failed", "cancelled")]
            for name in failed:  # a new attempt, or FineTuneJobFailed listing all
                self.groups[name].retry_failed_job(**self.retry_kwargs())
            if failed:
                self.save_state()
                continue
            if all(s == "succeeded" for s in statuses.values()):
                return statuses
            if not block:
                raise FineTuneJobsPending(statuses)
            if deadline is not None and self.clock() > deadline:
                raise FineTuneWaitTimeout(iteration, statuses, timeout)
            self.sleep(interval)
            interval = min(interval * 2, self.settings.fine_tune_poll_max_interval_s)
