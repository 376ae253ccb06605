"""It learns on hard data: the nip verifier beats chance on Weisfeiler–Lehman-matched pairs.

Data: the named dataset ``wl-small`` (2,000 training and 500 held-out pairs of 7–9 nodes,
``p`` 0.4 or 0.6) generated with the original's Weisfeiler–Lehman quotas: of the
non-isomorphic pairs 10% have WL score 1, 20% score 2 and 70% a score above 2 — two graphs
with equal degree multisets and equal 2-round colour histograms. A verifier that only
separates pairs by their degrees and 2-hop structure can reach at most 0.65.

Configuration: ``configs/gi_nip_ppo_wl.json`` — the main job's (vanilla PPO, nip, the paper's
prover, one transformer layer per agent, 1,024 frames x 4 epochs, lr 1e-3) with a verifier of
4 GIN layers instead of 2 (with 2 layers a verifier cannot see WL-3 differences at all),
PyTorch's default initialisation instead of the orthogonal one (docs/behaviour.md#b18),
no reward for not guessing and 4 test batches — trained here for ITERATIONS = 50 of its 100
iterations (half the time; the whole run is what the README shows).

Calibration (2-core Intel Xeon with AVX-512 BF16, one torch thread; each run deterministic
there), 50 iterations, the config's seed and two others (other trajectories, as another CPU
kind may take): held-out accuracy 0.737 / 0.744 / 0.788 over ~1,260 test episodes each
(seeds 8144 / 1 / 2); mean train accuracy over the first 10 iterations 0.505 / 0.504 / 0.498
and over the last 10 0.752 / 0.706 / 0.747 (rise 0.25 / 0.20 / 0.25); about 190 s each. The
full 100 iterations reached 0.917 (seed 8144). Chance is 0.5 and the standard error of an
accuracy over ~1,250 episodes about 0.014: the threshold 0.65 is 10 standard errors above
chance and 0.087 below the lowest calibrated value; the rise threshold 0.12 is below every
calibrated rise by 0.08. The solo verifier with the same 4-layer body, trained supervised
(docs/behaviour.md#b18), reached 0.87: this shows that RL through the nip protocol trains the
verifier on hard data, not that the prover was needed for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nip_core.experiment import make_params
from tests.nip_core.trainers.gi_helpers import train_config

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "gi_nip_ppo_wl.json"
ITERATIONS = 50
THRESHOLD = 0.65  # held-out accuracy after ITERATIONS iterations
RISE = 0.12  # mean train accuracy, last 10 iterations minus first 10


@pytest.mark.long(320)
@pytest.mark.slow
def test_nip_verifier_beats_chance_on_weisfeiler_lehman_matched_data(tmp_path, one_thread):
    hp = make_params(params_file=CONFIG, overrides=[f"rl.num_iterations={ITERATIONS}"])
    assert hp.dataset == "wl-small" and hp.interaction_protocol == "nip"
    assert make_params(params_file=CONFIG).rl.num_iterations == 100  # what the README's command trains
    # accuracy with time-outs wrong (docs/behaviour.md#b15), as the thresholds were calibrated
    _, train, test = train_config(CONFIG, tmp_path, "wl-small-nip", [f"rl.num_iterations={ITERATIONS}"])
    assert len(train) == ITERATIONS and test
    final = test[-1]
    assert final["test_num_episodes"] > 800
    print(f"wl-small nip: test accuracy {final['test_mean_decided_accuracy']:.4f} over {final['test_num_episodes']:.0f} "
          f"episodes; train accuracy first 10 its {sum(train[:10]) / 10:.4f}, last 10 {sum(train[-10:]) / 10:.4f}")
    assert final["test_mean_decided_accuracy"] >= THRESHOLD
    # The learning curve rises: the last 10 iterations' train accuracy is above the first 10's.
    first, last = sum(train[:10]) / 10, sum(train[-10:]) / 10
    assert last >= first + RISE, (first, last)
