"""``nipflow prefect setup`` against the test server, and a local sweep."""

from __future__ import annotations


def test_setup_creates_pools_limit_automations_and_secret(prefect_server, monkeypatch, capsys):
    from datetime import timedelta

    from prefect.automations import Automation
    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client

    from flows.prefect_setup import OPENAI_SECRET_BLOCK, setup_prefect

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    first = setup_prefect(gpus=2)
    again = setup_prefect(gpus=2)  # idempotent
    assert sorted(first["work_pools_created"]) == ["nipflow-cpu", "nipflow-gpu"]
    assert again["work_pools_created"] == [] and again["automations_created"] == []
    assert again["automations_updated"] == []
    assert sorted(first["automations_created"]) == ["nipflow-mark-silent-deployed-runs-crashed",
                                                    "nipflow-mark-zombie-runs-crashed",
                                                    "nipflow-reschedule-crashed-runs"]
    # a server set up by an older version (a different trigger) is brought up to date
    old = Automation.read(name="nipflow-mark-zombie-runs-crashed")
    old.trigger.within = timedelta(seconds=300)
    old.update()
    assert setup_prefect(gpus=2)["automations_updated"] == ["nipflow-mark-zombie-runs-crashed"]
    assert Automation.read(name="nipflow-mark-zombie-runs-crashed").trigger.within == timedelta(seconds=90)
    silent = Automation.read(name="nipflow-mark-silent-deployed-runs-crashed").trigger
    assert silent.after == {"prefect.flow-run.Pending", "prefect.flow-run.Running"}
    assert silent.match_related
    with get_client(sync_client=True) as client:
        assert client.read_work_pool("nipflow-gpu").type == "process"
        assert client.read_concurrency_limit_by_tag("gpu").concurrency_limit == 2
    assert Secret.load(OPENAI_SECRET_BLOCK).get() == "sk-test-not-a-real-key"
    assert Automation.read(name="nipflow-reschedule-crashed-runs").actions[0].type == "change-flow-run-state"
    assert "sk-test" not in capsys.readouterr().out


def test_local_sweep_runs_each_point_and_tabulates(fakes, tmp_path):
    from prefect.client.orchestration import get_client

    from flows.parameters import ExperimentParameters
    from flows.sweep import sweep

    base = ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo",
                                runs_dir=str(tmp_path / "runs"), overrides=["rl.num_iterations=2"],
                                block_size=2)
    rows = sweep(grid={"seed": [1, 2]}, sweep_id="sw", **base.flow_parameters())
    assert [(r["run_id"], r["seed"], r["state"]) for r in rows] == [("sw-000", 1, "Completed"),
                                                                    ("sw-001", 2, "Completed")]
    assert rows[0]["w"] == rows[1]["w"] == 1.25  # the fake's training ignores the seed
    with get_client(sync_client=True) as client:
        artifact = client.read_latest_artifacts()
    keys = {a.key for a in artifact}
    assert {"sw-sweep", "sw-000-summary", "sw-001-metrics"} <= keys
