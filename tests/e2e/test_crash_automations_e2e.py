"""The crash automations of ``deployments/automations.yaml`` on a real ``prefect server start``.

The run states are set through the API and the heartbeats are sent as the flow engine sends
them, so that each history happens at a chosen moment; everything else is the server's own:
its state-change events, its trigger buckets, its proactive evaluation and the actions. The
automations are the file's, installed by ``ensure_automations``, with the 90 s windows
shortened to WINDOW_S so that the test takes seconds rather than minutes.

The history that once left a text run Pending for ever (CI of d86e526): the run started,
sent its heartbeat, suspended on a fine-tune wait, was resumed by the watcher a few seconds
later, and its worker died right after marking it Pending. Prefect keeps one bucket per run
and trigger, opened by the first ``after`` event; a later ``after`` event finds that bucket
and opens no window of its own unless it is also expected. So the Pending of the resume fell
into the window the first start had opened (already satisfied by the heartbeat): when that
window closed nothing fired, and nothing ever opened another one.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from prefect_e2e_processes import Api, automations_with_window, install_automations, wait_for

pytestmark = [pytest.mark.e2e]

WINDOW_S = 10  # the least Prefect accepts for a proactive trigger


def _heartbeat(api_url: str, flow_run) -> None:
    """The event the flow engine sends every PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds."""
    from prefect.events import Event
    from prefect.events.clients import PrefectEventsClient

    async def send():
        async with PrefectEventsClient(api_url) as events:
            await events.emit(Event(
                event="prefect.flow-run.heartbeat",
                resource={"prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                          "prefect.resource.name": flow_run.name},
                related=[{"prefect.resource.id": f"prefect.deployment.{flow_run.deployment_id}",
                          "prefect.resource.role": "deployment"}]))

    asyncio.run(send())


class Runs:
    def __init__(self, api_url: str):
        self.api_url, self.api = api_url, Api(api_url)
        with self.api.client() as client:
            flow_id = client.create_flow_from_name("train_experiment")
            self.deployment_id = client.create_deployment(flow_id=flow_id, name="crash-probe")

    def new(self):
        with self.api.client() as client:
            return client.create_flow_run_from_deployment(self.deployment_id)

    def set(self, flow_run, state) -> None:
        with self.api.client() as client:
            client.set_flow_run_state(flow_run.id, state, force=True)

    def history(self, flow_run) -> list[str]:
        return self.api.state_history(flow_run.id)


@pytest.fixture(scope="module")
def runs(prefect_server, tmp_path_factory):
    created, _ = install_automations(prefect_server,
                                     automations_with_window(tmp_path_factory.mktemp("automations"), WINDOW_S))
    assert len(created) == 3, created
    return Runs(prefect_server.api_url)


def test_a_run_resumed_inside_its_first_window_whose_worker_dies_at_pending_is_crashed_and_requeued(
        runs, prefect_server):
    from prefect.states import Pending, Running, Scheduled, Suspended

    run = runs.new()
    runs.set(run, Pending())
    runs.set(run, Running())
    _heartbeat(runs.api_url, run)
    runs.set(run, Suspended(timeout_seconds=3600))
    runs.set(run, Scheduled(name="Resuming"))
    runs.set(run, Pending())  # the worker dies here: no process, no heartbeat, no state
    started = time.monotonic()

    wait_for(lambda: "CRASHED/Crashed" in runs.history(run), "the silent Pending run to be marked Crashed",
             WINDOW_S + 60, [prefect_server.log], interval=0.5)
    crashed_after = time.monotonic() - started
    wait_for(lambda: runs.history(run)[-1] == "SCHEDULED/Scheduled", "the crashed run to be rescheduled",
             30, [prefect_server.log], interval=0.5)
    print(f"\nmarked Crashed {crashed_after:.1f} s after the silent Pending (window {WINDOW_S} s)")
    assert crashed_after >= WINDOW_S - 1
    assert runs.history(run)[-3:] == ["PENDING/Pending", "CRASHED/Crashed", "SCHEDULED/Scheduled"]


def test_a_run_that_keeps_sending_heartbeats_or_stays_suspended_is_left_alone(runs, prefect_server):
    from prefect.states import Pending, Running, Suspended

    beating, suspended = runs.new(), runs.new()
    for run in (beating, suspended):
        runs.set(run, Pending())
        runs.set(run, Running())
        _heartbeat(runs.api_url, run)
    runs.set(suspended, Suspended(timeout_seconds=3600))
    deadline = time.monotonic() + 3 * WINDOW_S + 10
    while time.monotonic() < deadline:
        time.sleep(WINDOW_S / 3)
        _heartbeat(runs.api_url, beating)
    assert runs.history(beating) == ["SCHEDULED/Scheduled", "PENDING/Pending", "RUNNING/Running"]
    assert runs.history(suspended)[-1] == "PAUSED/Suspended"
    assert "CRASHED/Crashed" not in runs.history(suspended)
