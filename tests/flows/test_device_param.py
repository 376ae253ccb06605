"""The device of RL blocks is a flow parameter: ``auto`` by default, resolved on the host
that trains, passed parent -> child in the ``RunSpec`` and nothing else (no environment
variable, no job variable); an explicit ``cuda`` on a host without CUDA fails before
anything is built and without spending the flow's retries. Also: ``nipflow prefect setup
--gpus 0`` and flow parameters that are all optional (deployments editable in the UI).

This machine has no CUDA; "a host with CUDA" is ``torch.cuda.is_available`` patched.
"""

from __future__ import annotations

import uuid

import pytest
import torch

from nip_core.parameters.agents import GraphIsomorphismAgentParameters

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a CPU-only host")

TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump()


def _gi_parameters(tmp_path, run_id, iterations=2, **fields):
    """A real (tiny) GI vanilla_ppo experiment: a few seconds per block on a CPU."""
    from flows.parameters import ExperimentParameters

    rl = dict(frames_per_batch=16, num_iterations=iterations, num_epochs=1, minibatch_size=8,
              num_test_iterations=1, num_normalization_steps=3)
    return ExperimentParameters(
        scenario="graph_isomorphism", trainer="vanilla_ppo", protocol="nip", dataset="test", run_id=run_id,
        params={"d_representation": 2, "agents": {"_default": TINY}, "rl": rl}, runs_dir=str(tmp_path / "runs"),
        block_size=1, settings_overrides={"data_dir": str(tmp_path / "data")}, **fields)


def _child_runs(parent_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])))


@pytest.fixture
def no_live_trainers():
    """A process without the trainers of earlier flow runs (like a block's own process)."""
    from tasks import trainers

    saved = dict(trainers._KEPT)
    trainers._KEPT.clear()
    yield trainers._KEPT
    trainers._KEPT.clear()
    trainers._KEPT.update(saved)


# -- resolution ---------------------------------------------------------------------------


def test_auto_is_the_default_and_resolves_to_the_cpu_here():
    from flows.parameters import ExperimentParameters
    from nip_core.settings import ExperimentSettings, resolve_device

    assert ExperimentSettings().device == "auto"
    assert ExperimentParameters().device == "auto"
    assert "auto" in ExperimentParameters.model_fields["device"].description
    assert "auto" in ExperimentSettings.model_fields["device"].description
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"


def test_a_tensordict_trainer_computes_on_the_resolved_device_and_keeps_the_request(tmp_path):
    from tests.nip_core.trainers.gi_helpers import make_trainer, tiny_params

    trainer = make_trainer(tiny_params(), tmp_path)  # settings with the default device
    assert (trainer.requested_device, trainer.settings.device) == ("auto", "cpu")
    assert {p.device.type for p in trainer.agents.parameters()} == {"cpu"}


def test_explicit_cuda_fails_here_naming_the_field(tmp_path):
    from nip_core.parameters import HyperParameters
    from nip_core.settings import DeviceUnavailableError, ExperimentSettings, resolve_device
    from nip_core.trainers import build_trainer

    with pytest.raises(DeviceUnavailableError, match=r"^device is 'cuda' but .*CUDA"):
        resolve_device("cuda")
    with pytest.raises(DeviceUnavailableError, match=r"^parameters\.device is 'cuda:1' but .* on somewhere"):
        resolve_device("cuda:1", field="parameters.device", where="somewhere")
    # build_trainer fails before it opens (creates) the run in the run store
    hp = HyperParameters(scenario="graph_isomorphism", trainer="vanilla_ppo", dataset="test")
    settings = ExperimentSettings(run_id="dev-cuda", runs_dir=str(tmp_path), device="cuda", use_wandb=False)
    with pytest.raises(DeviceUnavailableError, match="device is 'cuda'"):
        build_trainer(hp, settings)
    assert not (tmp_path / "dev-cuda").exists()


def test_a_device_that_is_no_device_is_refused_naming_the_field():
    from pydantic import ValidationError

    from flows.parameters import ExperimentParameters
    from nip_core.settings import ExperimentSettings

    with pytest.raises(ValidationError, match=r"device\n.*'auto' or a torch device .* got 'gpu'"):
        ExperimentParameters(device="gpu")
    with pytest.raises(ValidationError, match=r"device\n.*got 'gpu'"):
        ExperimentSettings(device="gpu")


def test_auto_resolves_to_cuda_where_cuda_is_available(monkeypatch):
    from flows.trainer_access import check_device_here
    from nip_core.settings import DeviceUnavailableError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == "cuda"
    assert check_device_here("auto") == "cuda"
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(DeviceUnavailableError, match=r"'cuda:1' but only 1 CUDA device"):
        resolve_device("cuda:1")


def test_explicit_cuda_block_fails_naming_the_parameter_and_its_work_pool(prefect_server, monkeypatch):
    """The pool comes from prefect.runtime (the flow run id a worker sets) and the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.parameters import RunSpec
    from flows.rl_blocks import rl_iteration_block
    from nip_core.settings import DeviceUnavailableError

    pool = f"nipflow-gpu-{uuid.uuid4().hex[:8]}"
    spec = RunSpec(params={"scenario": "graph_isomorphism"}, settings={"run_id": "dev-pool", "device": "cuda"})
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        try:
            flow_id = client.create_flow_from_name("rl_iteration_block")
            deployment_id = client.create_deployment(flow_id=flow_id, name=pool, work_pool_name=pool,
                                                     entrypoint="flows.rl_blocks.rl_iteration_block")
            run = client.create_flow_run_from_deployment(deployment_id, parameters={})
            monkeypatch.setenv("PREFECT__FLOW_RUN_ID", str(run.id))  # what a process worker sets
            with pytest.raises(DeviceUnavailableError) as raised:
                rl_iteration_block.validate_parameters({"spec": spec.model_dump(mode="json"),
                                                        "block": {"index": 0, "start": 0, "stop": 1}})
        finally:
            monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
            client.delete_work_pool(pool)
    message = str(raised.value)
    assert message.startswith("parameters.device is 'cuda' but ")
    assert f"work pool '{pool}'" in message


def test_explicit_cuda_block_fails_before_running_and_spends_no_retry(prefect_server, tmp_path, monkeypatch,
                                                                      no_live_trainers):
    from prefect.client.orchestration import get_client

    from flows.parameters import RunSpec
    from flows.rl_blocks import rl_iteration_block
    from tasks.rl_block import Block

    parameters = _gi_parameters(tmp_path, "dev-cuda-block", device="cuda")
    hp = parameters.hyper_params()
    spec = RunSpec.of(hp, parameters.settings(hp))
    state = rl_iteration_block(spec, Block(index=0, start=0, stop=1), return_state=True)
    assert state.is_failed()
    assert "parameters.device is 'cuda' but " in state.message and "not in a work pool" in state.message
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        history = [s.type.value for s in client.read_flow_run_states(run.id)]
    # Pending -> Failed: the run never ran (run_count 0), so no retry was spent (rl_iteration_block has 2)
    assert rl_iteration_block.retries == 2
    assert (run.run_count, history) == (0, ["PENDING", "FAILED"])
    assert not (tmp_path / "runs" / "dev-cuda-block").exists()  # nothing built, no run opened
    assert not no_live_trainers


def test_explicit_cuda_experiment_fails_in_the_parent_naming_the_parameter(prefect_server, tmp_path):
    from flows.experiment import train_experiment

    state = train_experiment(**_gi_parameters(tmp_path, "dev-cuda-parent", device="cuda").flow_parameters(), return_state=True)
    assert state.is_failed()
    assert "parameters.device is 'cuda' but " in state.message and "not in a work pool" in state.message
    assert not (tmp_path / "runs" / "dev-cuda-parent").exists()


# -- parent -> child ------------------------------------------------------------------------


@pytest.mark.slow
def test_blocks_get_the_parents_device_through_the_runspec_not_the_environment(prefect_server, tmp_path,
                                                                              monkeypatch):
    """``NIPFLOW_DEVICE=cuda`` (what the gpu pool used to set) no longer changes anything."""
    from flows.experiment import train_experiment

    monkeypatch.setenv("NIPFLOW_DEVICE", "cuda")
    for run_id, device in (("dev-auto", None), ("dev-cpu", "cpu")):
        fields = {"device": device} if device else {}
        state = train_experiment(**_gi_parameters(tmp_path, run_id, **fields).flow_parameters(), return_state=True)
        assert state.is_completed(), state.message
        assert state.result()["iteration"] == 2
        blocks = [r for r in _child_runs(state.state_details.flow_run_id) if r.name.startswith("rl-block")]
        assert sorted(r.name for r in blocks) == ["rl-block-0[0:1]", "rl-block-1[1:2]"]
        # the device as the parent was asked for it ("auto" unresolved: each host resolves it)
        assert {r.parameters["spec"]["settings"]["device"] for r in blocks} == {device or "auto"}


@pytest.mark.slow
def test_a_block_builds_its_trainer_on_the_device_of_its_spec(prefect_server, tmp_path, monkeypatch,
                                                              no_live_trainers):
    """A block in a process of its own (as deployed): the trainer comes from the spec alone."""
    from flows.parameters import RunSpec
    from flows.rl_blocks import rl_iteration_block
    from tasks.rl_block import Block

    monkeypatch.setenv("NIPFLOW_DEVICE", "cuda")  # ignored: with it the block used to fail here
    parameters = _gi_parameters(tmp_path, "dev-child", iterations=1)
    hp = parameters.hyper_params()
    spec = RunSpec.of(hp, parameters.settings(hp))
    assert spec.settings["device"] == "auto"
    result = rl_iteration_block(spec, Block(index=0, start=0, stop=1))
    assert result["iteration"] == 1
    (trainer,) = no_live_trainers.values()  # the block's own trainer, built from the spec
    assert (trainer.requested_device, trainer.settings.device) == ("auto", "cpu")
    assert {p.device.type for p in trainer.agents.parameters()} == {"cpu"}
    trainer.close()


# -- nipflow prefect setup --gpus 0 -------------------------------------------------------------


def test_setup_with_no_gpus_leaves_no_gpu_limit(prefect_server, capsys):
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from flows.prefect_setup import GPU_TAG, WORK_POOLS, SetupError, setup_prefect

    with pytest.raises(SetupError, match="--gpus must be 0 .* got -1"):
        setup_prefect(gpus=-1)
    created_pools, created_automations = [], []
    try:
        with get_client(sync_client=True) as client:
            client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=0)  # would block every block
        report = setup_prefect(gpus=0)
        created_pools, created_automations = report["work_pools_created"], report["automations_created"]
        assert (report["gpu_limit"], report["gpu_limit_removed"]) == (None, 0)
        with get_client(sync_client=True) as client:
            with pytest.raises(ObjectNotFound):
                client.read_concurrency_limit_by_tag(GPU_TAG)
            assert {client.read_work_pool(name).name for name in WORK_POOLS} == set(WORK_POOLS)
        out = capsys.readouterr().out
        assert "'gpu' tag concurrency limit: none (--gpus 0: deleted the existing limit of 0;" in out
        assert "worker for both nipflow-cpu and nipflow-gpu" in out

        again = setup_prefect(gpus=0)  # idempotent: nothing to delete the second time
        assert (again["gpu_limit"], again["gpu_limit_removed"]) == (None, None)
        assert "deleted" not in capsys.readouterr().out
    finally:
        # leave the session's server as it was (other tests count what setup creates)
        with get_client(sync_client=True) as client:
            for name in created_pools:
                client.delete_work_pool(name)
            try:
                client.delete_concurrency_limit_by_tag(GPU_TAG)
            except ObjectNotFound:
                pass
        for name in created_automations:
            Automation.read(name=name).delete()


# -- optional flow parameters -----------------------------------------------------------------


def _schema(flow):
    from prefect.utilities.callables import parameter_schema

    return parameter_schema(flow.fn).model_dump_for_openapi()


def test_flow_parameters_are_all_optional_so_a_deployment_form_can_be_saved():
    from prefect.utilities.schema_tools.validation import validate

    from flows.experiment import train_experiment
    from flows.rl_blocks import rl_iteration_block

    experiment, block = _schema(train_experiment), _schema(rl_iteration_block)
    for flow, schema in ((train_experiment, experiment), (rl_iteration_block, block)):
        assert "required" not in schema, flow.name
        assert flow.parameters.required == [], flow.name
        # what the UI checks on Save: the deployment's parameter values, required included
        assert validate({}, schema, raise_on_error=False, preprocess=True, ignore_required=False) == []
    assert experiment["properties"]["device"]["default"] == "auto"  # a typed top-level parameter
    assert "required" not in block["definitions"]["RunSpec"]  # 'params'/'settings' refused Save before
    assert validate({"spec": {}}, block, raise_on_error=False, preprocess=True, ignore_required=False) == []
    assert block["properties"]["spec"]["default"] is None and block["properties"]["block"]["default"] is None


def test_missing_flow_parameters_fail_naming_the_parameter(prefect_server):
    from flows.experiment import train_experiment
    from flows.parameters import MissingParameterError, RunSpec
    from flows.rl_blocks import rl_iteration_block

    block = {"index": 0, "start": 0, "stop": 1}
    spec = RunSpec(params={"scenario": "graph_isomorphism"}, settings={"run_id": "r"}).model_dump(mode="json")
    with pytest.raises(MissingParameterError, match=r"^rl_iteration_block: parameter 'spec' is missing"):
        rl_iteration_block.validate_parameters({"block": block})
    with pytest.raises(MissingParameterError, match=r"parameter 'block' is missing"):
        rl_iteration_block.validate_parameters({"spec": spec})
    with pytest.raises(MissingParameterError, match=r"parameter 'spec.params' is missing"):
        rl_iteration_block.validate_parameters({"spec": {}, "block": block})
    with pytest.raises(MissingParameterError, match=r"parameter 'spec.settings.run_id' is missing"):
        rl_iteration_block.validate_parameters({"spec": {**spec, "settings": {}}, "block": block})
    assert set(rl_iteration_block.validate_parameters({"spec": spec, "block": block})) == {"spec", "block"}

    state = train_experiment(return_state=True)  # the deployment's empty form
    assert state.is_failed()
    assert "parameters.scenario: missing" in state.message and "parameters.trainer: missing" in state.message
