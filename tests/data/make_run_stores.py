"""Write the run stores of ``run_stores_<rev>.tar.gz`` with the code of an older revision.

The archive holds two runs stopped part-way by that revision, for
``tests/test_older_run_stores.py`` to resume with today's code:

* ``gi-<rev>``: vanilla PPO on graph isomorphism (tiny agents), iterations 0-1 of 4 trained,
  its iteration-2 checkpoint written;
* ``cv-<rev>``: expert iteration on code validation against the local API server, killed
  at the start of iteration 0's ``create_fine_tune_jobs`` (rollouts, stats and the
  test-during-training stage written, no job created).

Run it from a checkout of the revision, with this repository's interpreter, e.g. for f717b65::

    git worktree add /tmp/old f717b65 && cd /tmp/old
    PYTHONPATH=/tmp/old NIPFLOW_TEST_KILL_AT=0:create_fine_tune_jobs:start \\
        python /path/to/tests/data/make_run_stores.py /tmp/stores f717b65
    tar -C /tmp/stores -czf run_stores_f717b65.tar.gz gi-f717b65 cv-f717b65

(stop the API server it leaves behind and delete ``/tmp/stores/.llm-server`` before packing).
The kill point ends the process in the second part; the first part finishes before it.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.getcwd())  # the old checkout's tests.kill_points

#: the overrides of each run (the tests build today's runs from the stored hyper_params.json)
GI_OVERRIDES = ["dataset=test", "rl.num_iterations=4", "rl.frames_per_batch=64", "rl.minibatch_size=32",
                "rl.num_test_iterations=1", "seed=7"] + [
    f"agents.{agent}.{field}={value}" for agent in ("prover", "verifier")
    for field, value in (("num_gnn_layers", 2), ("d_gnn", 4), ("d_gin_mlp", 4), ("d_transformer", 4),
                         ("d_transformer_mlp", 4), ("d_decider", 4), ("d_value", 4), ("d_node_selector", 4))]
CV_OVERRIDES = ["rl.num_iterations=2", "rl.rollouts_per_iteration=24", "seed=7", "nip_protocol.max_message_rounds=4",
                "text_rl.verifier_guess_replacement_proportion=0.5", "text_rl.test_scheme=last",
                "dataset_options.max_train_size=24", "dataset_options.max_test_size=4"]


def main(out: str, rev: str) -> None:
    import nip_core.trainers.catalogue  # noqa: F401
    from nip_core.experiment import make_params
    from nip_core.settings import ExperimentSettings
    from nip_core.trainers.build import build_trainer

    print("code from", os.path.dirname(os.path.dirname(os.path.abspath(nip_core.trainers.catalogue.__file__))),
          flush=True)
    gi = make_params("graph_isomorphism", "vanilla_ppo", params_file="configs/gi_nip_ppo_small.json",
                     overrides=GI_OVERRIDES)
    trainer = build_trainer(gi, ExperimentSettings(run_id=f"gi-{rev}", runs_dir=out, use_wandb=False,
                                                   show_progress=False))
    trainer.run_iterations(0, 2)
    trainer.close()

    from tests.kill_points import install_from_env

    install_from_env()  # NIPFLOW_TEST_KILL_AT=0:create_fine_tune_jobs:start
    cv = make_params("code_validation", "pure_text_ei", overrides=CV_OVERRIDES)
    build_trainer(cv, ExperimentSettings(run_id=f"cv-{rev}", runs_dir=out, use_wandb=False,
                                         show_progress=False)).train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
