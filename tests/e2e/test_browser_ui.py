"""The Prefect UI with the project's deployments, in a real browser (Debian's Chromium).

A temporary Prefect server (on PostgreSQL, ``conftest.py``) gets the deployments of
``deployments/prefect.yaml`` through ``nipflow prefect setup`` + ``prefect deploy --all``.
Chromium, driven by Playwright (``browser_ui.py``), then checks what a user sees:

* the deployment list shows every deployment of the file, the scheduled ones with their
  schedule as the UI renders it, the others with none;
* the custom-run form of ``nip-gi-ppo`` offers ``trainer`` and ``protocol`` as dropdowns
  listing exactly the enums of the flow's parameter schema, preset to the deployment's
  ``vanilla_ppo`` and ``nip``;
* a tiny GI run submitted with that form (its JSON input, then "Submit": the request the
  UI itself sends to ``POST /api/deployments/{id}/create_flow_run``) completes on a
  worker of each pool (the ``nipflow-gpu`` one trains on the CPU here), and the run's
  Artifacts tab shows its result card, whose page renders ``# Result card: <run_id>``.

Screenshots of each step are saved under ``tests/e2e/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from browser_ui import chromium_browser, schema_enum, schema_property, screenshot, select_options, ui_page
from prefect_e2e_processes import PREFECT_FILE, REPO, Api, setup_and_deploy, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}
RUN_ID = "gi-browser"
# How the Prefect 3.8.8 UI renders the schedules of deployments/prefect.yaml. A schedule
# missing here fails the test: add the UI's text for it.
SCHEDULE_TEXT = {
    ("interval", 60): "Every minute",
    ("cron", "0 3 * * 1"): "At 03:00 AM, only on Monday",
}


def deployments_of_file(path: Path = PREFECT_FILE) -> dict[str, list[str]]:
    """Each deployment name of the prefect file -> the UI texts of its active schedules."""
    spec = yaml.safe_load(path.read_text())
    found = {}
    for deployment in spec["deployments"]:
        texts = []
        for schedule in deployment.get("schedules") or []:
            if not schedule.get("active", True):
                continue
            kind = "interval" if "interval" in schedule else "cron" if "cron" in schedule else "rrule"
            key = (kind, schedule.get(kind))
            assert key in SCHEDULE_TEXT, f"{deployment['name']}: no UI text known for schedule {key}"
            texts.append(SCHEDULE_TEXT[key])
        found[deployment["name"]] = texts
    return found


def tiny_gi_parameters(data_dir: Path) -> dict:
    """The form's ``parameters`` for a tiny real GI vanilla_ppo run (2 iterations, 1 per block)."""
    from nip_core.parameters.agents import GraphIsomorphismAgentParameters

    tiny = GraphIsomorphismAgentParameters.construct_test_params().model_dump(mode="json")
    rl = {"frames_per_batch": 16, "num_iterations": 2, "num_epochs": 1, "minibatch_size": 8,
          "num_test_iterations": 1, "num_normalization_steps": 3}
    return {"scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "protocol": "nip", "dataset": "test",
            "run_id": RUN_ID, "block_size": 1,
            "params": {"d_representation": 2, "agents": {"_default": tiny}, "rl": rl},
            "settings_overrides": {"data_dir": str(data_dir)}}


@pytest.fixture(scope="module")
def browser():
    with chromium_browser() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def deployed(prefect_server) -> dict[str, dict]:
    """The deployments of ``deployments/prefect.yaml`` on the server: name -> its API record."""
    setup_and_deploy(prefect_server)
    with Api(prefect_server.api_url).client() as client:
        return {d.name: d.model_dump(mode="json") for d in client.read_deployments()}


def test_deployment_list_shows_every_deployment_and_its_schedule(prefect_server, deployed, browser):
    from playwright.sync_api import expect

    expected = deployments_of_file()
    assert set(deployed) == set(expected)  # the server holds exactly the file's deployments
    assert any(expected.values()), "deployments/prefect.yaml has no scheduled deployment to check"
    with ui_page(browser) as page:
        page.goto(f"{prefect_server.process.ui_url}/deployments")
        names = page.locator("a.deployment-list__name")
        expect(names).to_have_count(len(expected))
        expect(page.get_by_text(f"{len(expected)} Deployments", exact=True)).to_be_visible()
        for name, schedules in expected.items():
            row = page.locator("tr.p-table-row", has=page.locator(f'a.deployment-list__name[title="{name}"]'))
            expect(row).to_have_count(1)
            expect(row.locator("a.deployment-list__name")).to_be_visible()
            expect(row.locator("a.deployment-list__name")).to_have_text(name)
            tags = row.locator(".deployment-schedule-tags__tag")
            expect(tags).to_have_count(len(schedules))
            for i, text in enumerate(schedules):
                expect(tags.nth(i)).to_have_text(text)
                expect(tags.nth(i)).to_be_visible()  # not folded into a "+1" overflow tag
        screenshot(page, "01-deployment-list")
        assert sorted(names.all_inner_texts()) == sorted(expected)


def test_custom_run_form_offers_trainer_and_protocol_dropdowns(prefect_server, deployed, browser):
    from playwright.sync_api import expect

    deployment = deployed["nip-gi-ppo"]
    schema = deployment["parameter_openapi_schema"]
    trainers = schema_enum(schema, "trainer")
    protocols = schema_enum(schema, "protocol")
    assert "vanilla_ppo" in trainers and "nip" in protocols, (trainers, protocols)
    with ui_page(browser) as page:
        page.goto(f"{prefect_server.process.ui_url}/deployments/deployment/{deployment['id']}/run")
        expect(page.get_by_role("heading", name="Parameters", exact=True)).to_be_visible()
        screenshot(page, "02-run-form")
        # top-level flow parameters: Prefect titles them with the parameter's name
        for title, default, options, shot in (("trainer", "vanilla_ppo", trainers, "03-run-form-trainer-open"),
                                              ("protocol", "nip", protocols, "04-run-form-protocol-open")):
            prop = schema_property(page, title)
            expect(prop).to_have_count(1)
            # a select preset to the deployment's value, not a free-text input
            expect(prop.locator(".p-select")).to_have_count(1)
            expect(prop.locator("textarea, input[type=text]")).to_have_count(0)
            expect(prop.locator(".p-select-button__control")).to_have_text(default)
            assert select_options(page, prop, screenshot_name=shot) == options, title


@pytest.mark.long(130)
def test_gi_run_submitted_in_the_form_completes_and_shows_its_result_card(prefect_server, deployed, browser,
                                                                         workers, tmp_path):
    from playwright.sync_api import expect

    started = time.monotonic()
    api = Api(prefect_server.api_url)
    worker_env = {"NIPFLOW_PROJECT_DIR": str(REPO), "NIPFLOW_RUNS_DIR": str(tmp_path / "runs"),
                  "PREFECT_WORKER_QUERY_SECONDS": "2"}
    cpu = workers.start(tmp_path / "cpu", pool="nipflow-cpu", name="ui-cpu", env=worker_env)
    gpu = workers.start(tmp_path / "gpu", pool="nipflow-gpu", name="ui-gpu", env=worker_env)
    logs = [cpu.log, gpu.log]
    parameters = tiny_gi_parameters(tmp_path / "data")
    ui = prefect_server.process.ui_url
    deployment_id = deployed["nip-gi-ppo"]["id"]

    with ui_page(browser) as page:
        # 1. the custom-run form, switched to its JSON input, filled and submitted
        page.goto(f"{ui}/deployments/deployment/{deployment_id}/run")
        page.locator(".flow-run-create-form-v2__header").get_by_role("button").click()
        page.get_by_role("button", name="Use JSON input").click()
        editor = page.locator(".schema-input textarea")
        expect(editor).to_have_count(1)
        expect(editor).to_have_value(re.compile(r'"trainer": "vanilla_ppo"'))  # the deployment's values as JSON
        editor.fill(json.dumps(parameters, indent=2))
        page.locator(".flow-run-create-form-v2__header").scroll_into_view_if_needed()
        screenshot(page, "05-run-form-json")
        with page.expect_response(lambda r: r.request.method == "POST" and
                                  r.url.endswith(f"/api/deployments/{deployment_id}/create_flow_run")) as created:
            page.get_by_role("button", name="Submit", exact=True).click()
        response = created.value
        assert response.status == 201, response.text()
        flow_run_id = response.json()["id"]
        submitted_after = time.monotonic() - started
        # the server stored exactly what was typed into the form
        assert api.flow_run(flow_run_id).parameters == parameters

        # 2. it completes on the workers (the gpu pool's trains on the CPU)
        wait_for(lambda: api.flow_run(flow_run_id).state.type.value in TERMINAL, "the GI run to finish", 300, logs,
                 interval=2)
        final = api.flow_run(flow_run_id)
        finished_after = time.monotonic() - started
        assert final.state.type.value == "COMPLETED", final.state.message
        blocks = api.flow_runs("rl_iteration_block")  # this module's server ran no other GI run
        assert sorted((b.state.type.value, b.work_pool_name) for b in blocks) == [("COMPLETED", "nipflow-gpu")] * 2

        # 3. its page: state badge, then the Artifacts tab with the result card
        page.goto(f"{ui}/runs/flow-run/{flow_run_id}")
        expect(page.locator(".state-badge", has_text="Completed").first).to_be_visible()
        expect(page.get_by_role("link", name="train_experiment", exact=True)).to_be_visible()  # its flow
        expect(page.get_by_role("link", name="nip-gi-ppo", exact=True)).to_be_visible()  # its deployment
        expect(page.get_by_role("link", name="nipflow-cpu", exact=True)).to_be_visible()  # its work pool
        screenshot(page, "06-flow-run")
        page.locator("li.p-tab", has_text=re.compile(r"^Artifacts$")).click()
        card = page.locator(".artifact-card").filter(
            has=page.locator(".artifact-card__title", has_text=re.compile(r"-result-card$")))
        expect(card).to_have_count(1)
        expect(card).to_be_visible()
        expect(card.locator(".artifact-card__title")).to_have_text(f"{RUN_ID}-result-card")
        screenshot(page, "07-flow-run-artifacts")
        card.click()
        page.wait_for_url(re.compile(r"/artifacts/artifact/"))
        heading = page.get_by_role("heading", name=f"Result card: {RUN_ID}", exact=True)
        expect(heading).to_be_visible()
        expect(page.get_by_role("cell", name="completed", exact=True)).to_be_visible()
        screenshot(page, "08-result-card")
    print(f"\nGI run {flow_run_id}: submitted after {submitted_after:.1f} s, "
          f"completed after {finished_after:.1f} s")
