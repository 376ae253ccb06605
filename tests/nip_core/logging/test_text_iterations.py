"""Per-iteration figures of text runs across variants (what ``nipflow sweep --out`` adds for them)."""

from __future__ import annotations

from nip_core.logging.comparison import write_comparison
from nip_core.logging.text_iterations import iteration_table, kind_table
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore
from nip_core.runs.invocations import begin_invocation, end_invocation


def text_run(store: RunStore, run_id: str, protocol: str, seed: int, figures: list[tuple], kinds: list[dict]):
    """A completed 2-iteration EI run: ``figures`` per iteration (valid, accuracy, test, length, sampling s,
    verifier job s); ``kinds`` per test row: kind -> (accuracy, count)."""
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv", seed=seed,
                         interaction_protocol=protocol, rl={"num_iterations": 2, "rollouts_per_iteration": 8})
    run = store.open_run(run_id, hp)
    run.write_json("state.json", {"iteration": 2, "train_loop_stage": "done"})
    for i, (valid, acc, test, length, sampling, job) in enumerate(figures):
        run.append_metrics(i, {"valid_decision_rate": valid, "mean_accuracy": acc, "mean_episode_length": length})
        row = {"kind": "test", "test_mean_accuracy": test}
        for kind, (k_acc, n) in kinds[i].items():
            row[f"test_accuracy_by_kind.{kind}"], row[f"test_count_by_kind.{kind}"] = k_acc, float(n)
        run.append_metrics(i, row)
        run.write_json(f"stages/it{i}_sample_rollouts.json", {"iteration": i, "sampling_seconds": sampling})
        if job is not None:
            run.write_json(f"stages/it{i}_await_fine_tune_jobs.json", {"iteration": i, "trained_tokens": {"verifier": 9},
                                                                      "fine_tune_seconds": {"verifier": job}})
            run.write_json(f"fine_tune/iter_{i}_verifier.json", {"job_id": f"ftjob-{run_id}-{i}", "attempt": 1})
    end_invocation(run, begin_invocation(run, "direct"), "completed")
    return run_id


def runs(tmp_path):
    store = RunStore(str(tmp_path))
    labelled = [
        ("nip", text_run(store, "a", "nip", 0, [(1.0, 0.5, 0.5, 2.0, 30.0, 60.0), (1.0, 0.75, 0.75, 2.0, 20.0, None)],
                         [{"correct": (1.0, 4), "drop_else": (0.0, 4)}, {"correct": (1.0, 4), "drop_else": (0.5, 4)}])),
        ("nip", text_run(store, "b", "nip", 1, [(0.5, 0.25, 0.5, 3.0, 40.0, 80.0), (1.0, 0.5, 0.25, 2.5, 30.0, None)],
                         [{"correct": (0.5, 2), "drop_else": (0.5, 6)}, {"correct": (1.0, 2), "drop_else": (0.0, 6)}])),
        ("solo", text_run(store, "c", "solo_verifier", 0, [(1.0, 0.5, 0.5, 0.0, 10.0, 30.0),
                                                          (1.0, 0.5, 0.5, 0.0, 10.0, None)],
                          [{"correct": (1.0, 8)}, {"correct": (0.5, 8)}])),
    ]
    return store, labelled


def test_each_iteration_gets_mean_and_std_over_the_variants_runs(tmp_path):
    store, labelled = runs(tmp_path)
    rows = iteration_table(store, labelled).splitlines()
    assert rows[0] == ("| variant | iteration | runs | valid decisions | train accuracy | held-out accuracy | "
                       "episode length | sampling | fine-tune jobs |")
    assert rows[2:] == [
        "| nip | 0 | 2 | 0.75 ± 0.35 | 0.375 ± 0.177 | 0.500 ± 0.000 | 2.50 ± 0.71 | 35.0 s ± 7 s | "
        "verifier 1 min 10 s ± 14 s (2 of 2) |",
        "| nip | 1 | 2 | 1.00 ± 0.00 | 0.625 ± 0.177 | 0.500 ± 0.354 | 2.25 ± 0.35 | 25.0 s ± 7 s | — |",
        "| solo | 0 | 1 | 1.00 ± 0.00 | 0.500 ± 0.000 | 0.500 ± 0.000 | 0.00 ± 0.00 | 10.0 s ± 0 s | "
        "verifier 30.0 s ± 0 s (1 of 1) |",
        "| solo | 1 | 1 | 1.00 ± 0.00 | 0.500 ± 0.000 | 0.500 ± 0.000 | 0.00 ± 0.00 | 10.0 s ± 0 s | — |",
    ]


def test_accuracy_by_kind_is_pooled_over_runs_first_and_last(tmp_path):
    store, labelled = runs(tmp_path)
    rows = kind_table(store, labelled).splitlines()
    assert rows[0] == "| kind | nip: first → last tested | solo: first → last tested |"
    # nip correct: first (1.0*4 + 0.5*2)/6, last 1.0; drop_else: first (0 + 0.5*6)/10, last (0.5*4 + 0)/10
    assert rows[2:] == ["| correct | 0.83 → 1.00 (n=6) | 1.00 → 0.50 (n=8) |",
                        "| drop_else | 0.30 → 0.20 (n=10) | — → — (n=0) |"]


def test_the_sweep_comparison_of_text_runs_has_the_sections_and_plots(tmp_path):
    store, labelled = runs(tmp_path)
    out = write_comparison(store, labelled, tmp_path / "doc" / "cv.md", title="CV", baseline="solo")
    text = out.read_text()
    assert "## Per iteration" in text and "## Held-out accuracy by kind" in text
    assert "| nip | 1 | 2 | 1.00 ± 0.00 |" in text and "| correct | 0.83 → 1.00 (n=6) |" in text
    assert "![accuracy per iteration](cv_iterations.png)" in text
    assert (tmp_path / "doc" / "cv_iterations.png").stat().st_size > 0 and (tmp_path / "doc" / "cv.png").is_file()
