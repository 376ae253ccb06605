"""Flow building blocks that need no Prefect server: parameters, grid, warm start, waits."""

from __future__ import annotations

import json

import pytest

from flows.parameters import ExperimentParameters, RunSpec
from nip_core.parameters import ParameterError


def test_experiment_parameters_precedence_and_settings(tmp_path, monkeypatch):
    p = ExperimentParameters(params={"scenario": "graph_isomorphism", "trainer": "spg", "seed": 3},
                             trainer="vanilla_ppo", overrides=["seed=5", "rl.num_iterations=7"],
                             run_id="gi-1", runs_dir=str(tmp_path), settings_overrides={"checkpoint_every": 2})
    hp = p.hyper_params()
    assert (hp.trainer, hp.seed, hp.rl.num_iterations, hp.dataset) == ("vanilla_ppo", 5, 7, "small")
    settings = p.settings(hp)
    assert (settings.run_id, settings.runs_dir, settings.checkpoint_every, settings.use_wandb) == (
        "gi-1", str(tmp_path), 2, False)
    spec = RunSpec.of(hp, settings)
    # the worker's key (its environment wins over a Secret block), never a parameter
    monkeypatch.setenv("OPENAI_API_KEY", "sk-worker")
    got = spec.experiment_settings()
    assert got.openai_api_key.get_secret_value() == "sk-worker" and settings.openai_api_key is None
    assert spec.hyper_params() == hp and got.model_copy(update={"openai_api_key": None}) == settings
    assert json.loads(spec.model_dump_json())["settings"]["run_id"] == "gi-1"


def test_experiment_parameters_reject_bad_values():
    with pytest.raises(ParameterError):
        ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo",
                             overrides=["rl.num_iterations=-1"]).hyper_params()
    with pytest.raises(ValueError):
        ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo", run_id="bad id").settings(
            ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo").hyper_params())


def test_cli_settings_map_to_flow_parameters(tmp_path):
    from flows.entry import experiment_parameters, local_prefect_home
    from nip_core.experiment import make_params
    from nip_core.settings import ExperimentSettings

    hp = make_params("graph_isomorphism", "vanilla_ppo", overrides=["rl.num_iterations=3"])
    settings = ExperimentSettings(run_id="gi-2", runs_dir=str(tmp_path), use_wandb=False, checkpoint_every=4)
    p = experiment_parameters(hp, settings)
    assert p.hyper_params() == hp
    assert p.settings(hp).checkpoint_every == 4 and p.settings(hp).run_id == "gi-2"
    assert p.wait_mode == "poll"
    assert local_prefect_home(settings) == tmp_path.absolute() / ".prefect"


def test_grid_points_and_point_parameters():
    from flows.sweep import grid_points, point_parameters

    points = grid_points({"seed": [1, 2], "rl.num_iterations": [4]})
    assert points == [{"rl.num_iterations": 4, "seed": 1}, {"rl.num_iterations": 4, "seed": 2}]
    base = ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo")
    child = point_parameters(base, "sw", 1, points[1])
    assert child.run_id == "sw-001"
    assert (child.hyper_params().seed, child.hyper_params().rl.num_iterations) == (2, 4)


def test_latest_successful_run_and_warm_start(tmp_path, fake_trainers):
    from flows.retrain import apply_warm_start, latest_successful_run, mark_completed
    from nip_core.experiment import make_params
    from nip_core.runs import RunStore

    store = RunStore(str(tmp_path))
    hp = make_params("graph_isomorphism", "vanilla_ppo", overrides=["rl.num_iterations=2"])
    old, newer, other, fresh = (store.open_run(r, hp) for r in ("old", "newer", "other", "fresh"))
    mark_completed(old, "gi.ppo")
    newer.save_checkpoint_bytes("latest", b'{"w": 2.5}', iteration=2)
    mark_completed(newer, "gi.ppo")
    mark_completed(other, "cv.ei")
    assert latest_successful_run(str(tmp_path), "gi.ppo") == "newer"
    assert latest_successful_run(str(tmp_path), "gi.ppo", exclude="newer") == "old"
    assert latest_successful_run(str(tmp_path), "nothing") is None
    assert apply_warm_start(fresh, "newer", str(tmp_path)) == ["latest"]
    assert (tmp_path / "fresh" / "warm_start" / "latest.pt").read_bytes() == b'{"w": 2.5}'
    assert fresh.metadata()["warm_start_from"]["run_id"] == "newer"


def test_suspend_only_while_jobs_are_pending(tmp_path, fake_trainers, monkeypatch):
    """The deployed wait: suspend with a fresh key per attempt; never for finished jobs."""
    import prefect.flow_runs

    import flows.pure_text as pure_text
    from flows.trainer_access import build_flow_trainer

    p = ExperimentParameters(scenario="code_validation", trainer="pure_text_ei", run_id="cv-s",
                             runs_dir=str(tmp_path))
    hp = p.hyper_params()
    trainer = build_flow_trainer(hp, p.settings(hp))
    keys = []

    class Suspended(Exception):
        pass

    def fake_suspend(key, timeout=None):
        keys.append(key)
        raise Suspended

    monkeypatch.setattr(prefect.flow_runs, "suspend_flow_run", fake_suspend)
    monkeypatch.setattr(pure_text, "get_run_logger", lambda: __import__("logging").getLogger("t"))
    pure_text.suspend_while_jobs_pending(trainer, 0)  # no job yet: nothing to wait for
    monkeypatch.setenv("FAKE_JOB_S", "3600")
    for stage in ("sample_rollouts", "log_stats", "test_during_training", "create_fine_tune_jobs"):
        trainer.run_stage(stage)
    for _ in range(2):
        with pytest.raises(Suspended):
            pure_text.suspend_while_jobs_pending(trainer, 0)
    assert keys == ["await-cv-s-0-0", "await-cv-s-0-1"]
    monkeypatch.setenv("FAKE_FAIL_JOB", "1")
    pure_text.suspend_while_jobs_pending(trainer, 0)  # failed: let the await stage raise
    assert len(keys) == 2
    from flows.watcher import jobs_finished

    done, statuses = jobs_finished({"parameters": p.model_dump(mode="json")})
    assert (done, statuses) == (True, {"verifier": "failed"})


def test_deployment_file_entrypoints_and_parameters():
    from pathlib import Path

    import yaml
    from prefect.flows import load_flow_from_entrypoint

    root = Path(__file__).resolve().parents[2]
    spec = yaml.safe_load((root / "deployments" / "prefect.yaml").read_text())
    names = {d["name"] for d in spec["deployments"]}
    assert {"nip-gi-ppo", "cv-ei", "rl-block", "fine-tune-watcher", "sweep", "retrain-gi-ppo"} <= names
    for d in spec["deployments"]:
        flow = load_flow_from_entrypoint(d["entrypoint"])  # a module path: flows.x.flow_fn
        if d.get("parameters"):
            flow.validate_parameters(d["parameters"])
        if "parameters" in d.get("parameters", {}):
            ExperimentParameters.model_validate(d["parameters"]["parameters"]).hyper_params()
    pools = {d["work_pool"]["name"] for d in spec["deployments"]}
    assert pools == {"nipflow-cpu", "nipflow-gpu"}
    watcher = next(d for d in spec["deployments"] if d["name"] == "fine-tune-watcher")
    retrain = next(d for d in spec["deployments"] if d["name"] == "retrain-gi-ppo")
    assert watcher["schedules"][0]["interval"] == 60 and retrain["schedules"][0]["cron"] == "0 3 * * 1"


def test_local_server_environment_without_api_url(tmp_path, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.entry import _local_server_env
    from nip_core.settings import ExperimentSettings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", raising=False)
    settings = ExperimentSettings(run_id="x", runs_dir=str(tmp_path / "runs"))
    with temporary_settings(updates={PREFECT_API_URL: None}):
        env = _local_server_env(settings)
    # Prefect's 20 s wait for its temporary server is too short on a busy machine
    assert env == {"PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                   "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
                   "PREFECT_HOME": str((tmp_path / "runs").absolute() / ".prefect")}
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "45")  # the user's own value stands
    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" not in _local_server_env(settings)
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert _local_server_env(settings) == {}


def test_run_id_derives_from_the_flow_run_when_not_given():
    p = ExperimentParameters(scenario="graph_isomorphism", trainer="vanilla_ppo")
    hp = p.hyper_params()
    a = p.settings(hp, "0f8e2c1a-1111-2222-3333-444455556666").run_id
    assert a == "gr-vanilla_ppo-nip-0f8e2c1a1111"
    assert p.settings(hp, "0f8e2c1a-1111-2222-3333-444455556666").run_id == a  # stable on resume
    assert p.model_copy(update={"run_id": "mine"}).settings(hp, "0f8e").run_id == "mine"


def test_a_crashed_block_is_waited_for_and_dispatched_again_until_its_third_crash(prefect_server, monkeypatch):
    """The parent of a deployed block counts Crashed as final only at the block's third crash, and
    puts a block still Crashed after the grace period (no reschedule automation) back to Scheduled."""
    import logging
    import threading
    import time

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Crashed, Running

    from flows import rl_blocks
    from tasks.rl_block import Block

    @flow(name="block-stand-in")
    def stand_in():
        pass

    monkeypatch.setattr(rl_blocks, "BLOCK_POLL_S", 0.05)
    monkeypatch.setattr(rl_blocks, "CRASHED_GRACE_S", 0.5)
    monkeypatch.setattr(rl_blocks, "get_run_logger", lambda: logging.getLogger("test"))  # no run context here
    block = Block(index=0, start=0, stop=1)
    with get_client(sync_client=True) as client:
        # only a run of a deployment may go back to Scheduled (as deployed blocks are)
        deployment_id = client.create_deployment(flow_id=client.create_flow(stand_in), name="blocks")
        child = client.create_flow_run_from_deployment(deployment_id)
        client.set_flow_run_state(child.id, Running(), force=True)
        client.set_flow_run_state(child.id, Crashed(message="worker died"), force=True)
        found = {}
        waiter = threading.Thread(target=lambda: found.update(run=rl_blocks._wait_for_block(child.id, block)))
        waiter.start()
        # not final for the parent: after the grace period it is put back to Scheduled
        deadline = time.monotonic() + 20
        while client.read_flow_run(child.id).state.type.value != "SCHEDULED" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.read_flow_run(child.id).state.name == "Scheduled" and waiter.is_alive()
        # it runs and crashes twice more: the third crash is final
        for _ in range(2):
            client.set_flow_run_state(child.id, Running(), force=True)
            client.set_flow_run_state(child.id, Crashed(message="worker died"), force=True)
            time.sleep(0.3)
        waiter.join(20)
        assert not waiter.is_alive() and found["run"].state.is_crashed()
        # a block that completes is returned as it is
        done = client.create_flow_run(stand_in)
        client.set_flow_run_state(done.id, Completed(), force=True)
        assert rl_blocks._wait_for_block(done.id, block).state.is_completed()
