"""Run stores written by an older nipflow resume with today's code and train on as today's would.

``tests/data/run_stores_f717b65.tar.gz`` holds two runs that f717b65 (the revision before the
house was rearranged: one run driver, one parameter carrier, the API server beside the domain
library) stopped part-way; ``tests/data/make_run_stores.py`` wrote them. Each is resumed with
``nipflow resume``. The code-validation run is compared with the same run trained by today's
code from the start (its parameters are the stored ``hyper_params.json``): what today's code
computes after the resume is what it computes uninterrupted, bit for bit. The GI run's
arithmetic changed in the last bits since f717b65 (docs/performance.md), so its test checks
that the checkpoint restores exactly and that the resume is deterministic instead.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from flows.cli import main
from nip_core.runs import RunStore
from nip_core.settings import ExperimentSettings
from nip_core.trainers.build import build_trainer

pytestmark = pytest.mark.slow
ARCHIVE = Path(__file__).resolve().parent / "data" / "run_stores_f717b65.tar.gz"
RUN_FLAGS = ["--direct", "--no-wandb", "--progress", "off"]


@pytest.fixture
def runs(tmp_path):
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(tmp_path / "runs", filter="data")
    return tmp_path / "runs"


def metric_rows(run_dir: Path) -> dict[tuple[int, str], dict]:
    """The run's metrics rows by (iteration, kind), without wall-clock figures."""
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["iteration"], row["kind"]] = {k: v for k, v in row.items()
                                               if "time" not in k and not k.startswith("timing")}
    return rows


def fresh_run(runs: Path, stored: Path, run_id: str) -> Path:
    params = json.loads((stored / "hyper_params.json").read_text())
    argv = ["run", params["scenario"], params["trainer"], "--params", str(stored / "hyper_params.json"),
            "--runs-dir", str(runs), "--run-id", run_id, *RUN_FLAGS]
    assert main(argv) == 0
    return runs / run_id


def test_a_graph_isomorphism_run_of_f717b65_resumes_from_its_pickled_checkpoint(runs, one_thread, capsys, caplog):
    """Today's GI arithmetic differs from f717b65's in the last bits (fused Adam, the folded
    tanh and the attention kernel, docs/performance.md), so a fresh run of today's code is no
    longer f717b65's run bit for bit. What is checked instead: the checkpoint's weights and
    optimiser state are what today's code restores, exactly; the resume completes; and two
    copies of the store resume to the same run, bit for bit."""
    old = runs / "gi-f717b65"
    before = metric_rows(old)
    assert sorted(before) == [(0, "train"), (1, "train")]
    copy = runs.parent / "copy" / "gi-f717b65"
    shutil.copytree(old, copy)
    pickled = torch.load(old / "checkpoints" / "iter_000002.pt", weights_only=False)  # this test's own fixture
    trainer = build_trainer(RunStore(str(copy.parent)).open_run("gi-f717b65").params,
                            ExperimentSettings(run_id="gi-f717b65", runs_dir=str(copy.parent), use_wandb=False,
                                               show_progress=False))
    assert trainer.restore_latest_checkpoint()
    restored = trainer.agents.state_dict()
    assert pickled["agents"].keys() == restored.keys()
    for key, value in pickled["agents"].items():
        assert torch.equal(restored[key], value), key
    optimizer = trainer.optimizer.state_dict()
    assert not optimizer["param_groups"][0]["fused"]  # the loop that wrote it, so it continues bit for bit
    for index, state in pickled["optimizer"]["state"].items():
        assert float(state["step"]) == 16.0  # 2 iterations x 8 minibatch steps
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer["state"][index][name], state[name]), (index, name)
    trainer.close()
    del trainer
    for store in (old, copy):
        assert main(["resume", "gi-f717b65", "--runs-dir", str(store.parent), *RUN_FLAGS]) == 0
        out = capsys.readouterr().out
        assert "status          completed" in out and "iterations      4/4" in out
    assert "a pickled checkpoint of an earlier nipflow" in caplog.text
    resumed = metric_rows(old)
    assert resumed[0, "train"] == before[0, "train"]  # what f717b65 logged is kept
    assert sorted(resumed) == [(0, "train"), (1, "train"), (2, "train"), (3, "train"), (4, "test")]
    assert resumed == metric_rows(copy)


@pytest.mark.long(25)
def test_a_code_validation_run_of_f717b65_resumes_at_its_fine_tune_stage(runs, monkeypatch, capsys):
    from nipflow_llm_server.launcher import LocalApiServer

    # The runs' local API server (where `nipflow` looks without OPENAI_BASE_URL), started here
    # with fast fine-tune jobs and left running by both runs.
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    server = LocalApiServer(runs / ".llm-server", detached=True, job_time_scale=0.02).start()
    try:
        check_code_validation_resume(runs, capsys)
    finally:
        server.stop()


def check_code_validation_resume(runs: Path, capsys) -> None:
    old = runs / "cv-f717b65"
    assert json.loads((old / "state.json").read_text())["train_loop_stage"] == "create_fine_tune_jobs"
    before = metric_rows(old)
    assert sorted(before) == [(0, "train")]
    assert main(["resume", "cv-f717b65", "--runs-dir", str(runs), *RUN_FLAGS]) == 0
    out = capsys.readouterr().out
    assert "status          completed" in out and "iterations      2/2" in out and "fine-tune jobs  1" in out
    resumed = metric_rows(old)
    assert resumed[0, "train"] == before[0, "train"]  # f717b65's row (fewer statistics than today's) kept
    today = metric_rows(fresh_run(runs, old, "cv-today"))
    assert sorted(resumed) == sorted(today) == [(0, "train"), (1, "test"), (1, "train")]
    for key in [(1, "train"), (1, "test")]:  # after the fine-tune job of the resumed stage
        assert resumed[key] == today[key], key
    assert resumed[1, "test"]["test_mean_accuracy"] == today[1, "test"]["test_mean_accuracy"] is not None
    today = runs / "cv-today"
    for name in ("rollouts/0.json", "rollouts/1.json", "models/iter_1.json"):
        assert (old / name).exists(), name
    assert json.loads((old / "rollouts/1.json").read_text()) == json.loads((today / "rollouts/1.json").read_text())
    assert [p.name for p in sorted((old / "stages").iterdir())] == [p.name for p in sorted((today / "stages").iterdir())]
