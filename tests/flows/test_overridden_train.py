"""A trainer that overrides ``train()`` runs it under Prefect too (one task), never bypassed.

Before: ``train_experiment`` drove a TensorDict trainer through RL blocks
(``run_iterations``) and a pure-text trainer through its stages, so an overridden
``train()`` was silently skipped.

The trainer is registered in a fresh process before the flows are imported, as a user's
module does: the flow's form fields list the trainers registered when they are imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, sys
    from nip_core.trainers.registry import register_trainer
    from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer

    CALLS = []

    @register_trainer("my_train_ppo")
    class MyTrainPpo(VanillaPpoTrainer):
        def train(self) -> None:
            CALLS.append(f"train from iteration {self.state.iteration}")
            super().train()

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from flows.experiment import train_experiment

    state = train_experiment(
        scenario="graph_isomorphism", trainer="my_train_ppo", dataset="test", run_id="own-train",
        runs_dir=sys.argv[1], num_iterations=2,
        overrides=["rl.frames_per_batch=16", "rl.num_epochs=1", "rl.minibatch_size=8", "rl.num_test_iterations=1",
                   "rl.num_normalization_steps=3", "agents._default.num_gnn_layers=1", "agents._default.d_gnn=2"],
        return_state=True)
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id={"any_": [flow_run_id]}))
    print("RESULT " + json.dumps({
        "completed": state.is_completed(), "calls": CALLS,
        "iteration": state.result()["iteration"] if state.is_completed() else None,
        "train_tasks": [t.name for t in tasks if t.name.startswith("train[")], "children": len(children)}))
''')


def test_an_overridden_train_runs_in_one_task_under_the_flow(subprocess_env, tmp_path):
    script = tmp_path / "own_train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "runs")], cwd=REPO, env=subprocess_env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["completed"], done.stderr[-3000:]
    assert result["calls"] == ["train from iteration 0"]
    assert result["iteration"] == 2
    assert result["train_tasks"] == ["train[own-train]"]
    assert result["children"] == 0  # no RL block flow runs: they would have bypassed the override


def test_an_overridden_train_and_test_is_an_override_of_train_for_the_flow():
    """nip's ``_train_and_test`` is what ``train()`` runs: the RL blocks would bypass it too."""
    from flows.experiment import overrides_train
    from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer

    class OwnLoop(VanillaPpoTrainer):
        def _train_and_test(self) -> None:
            raise AssertionError("not called here")

    assert overrides_train(OwnLoop.__new__(OwnLoop), "blocks")
    assert not overrides_train(VanillaPpoTrainer.__new__(VanillaPpoTrainer), "blocks")
