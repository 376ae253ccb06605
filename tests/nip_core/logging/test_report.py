import re

from nip_core.logging.report import write_report
from nip_core.parameters import HyperParameters
from nip_core.runs import RunStore

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(store, run_id, protocol, accs):
    run = store.open_run(run_id, HyperParameters.from_dict({
        "scenario": "graph_isomorphism", "trainer": "vanilla_ppo", "dataset": "test",
        "interaction_protocol": protocol}))
    for it, acc in enumerate(accs):
        run.append_metrics(it, {"mean_accuracy": acc, "verifier.mean_episode_reward": acc - 0.5,
                                "prover.mean_episode_reward": 0.1 * it, "mean_episode_length": 4.0 + it})
    run.append_metrics(len(accs) - 1, {"kind": "test", "test_mean_accuracy": accs[-1] - 0.05})
    return run


def test_run_report_plots_and_final_numbers(tmp_path):
    store = RunStore(str(tmp_path / "runs"))
    make_run(store, "r1", "nip", [0.5, 0.6, 0.71])
    md = write_report(["r1"], str(tmp_path / "runs"), str(tmp_path / "out"))
    for name in ("rewards", "accuracy", "decision_rate", "episode_length"):
        assert (tmp_path / "out" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    text = md.read_text()
    rows = store.open_run("r1").read_metrics()
    assert f"| verifier train accuracy | {rows[2]['mean_accuracy']:.4f} |" in text
    assert f"| verifier test accuracy | {rows[3]['test_mean_accuracy']:.4f} |" in text
    assert "| verifier mean episode reward | 0.2100 |" in text


def test_sweep_report_table(tmp_path):
    store = RunStore(str(tmp_path / "runs"))
    make_run(store, "a", "nip", [0.5, 0.8])
    make_run(store, "b", "debate", [0.5, 0.6])
    md = write_report(["a", "b"], str(tmp_path / "runs"), str(tmp_path / "sweep"))
    text = md.read_text()
    assert re.search(r"\| a \| nip \| vanilla_ppo \| 0\.8000 \| 0\.7500 \|", text)
    assert re.search(r"\| b \| debate \| vanilla_ppo \| 0\.6000 \| 0\.5500 \|", text)
    assert (tmp_path / "sweep" / "final_accuracy.png").read_bytes()[:8] == PNG_MAGIC
