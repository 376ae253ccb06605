"""nip's forms of the shared model group's job methods (issue #29 item 1).

``create_supervised_fine_tune_job(rollouts_per_agent, guess_replaced_rollouts, job_name)`` and
``create_dpo_fine_tune_job(timesteps_per_agent, positive_examples_per_agent,
negative_examples_per_agent, job_name)`` turn rollouts into examples through the trainer
that owns the group (its ``FineTuneBinding``) and submit one job. The real trainer's binding
is exercised end to end in ``tests/flows/test_guide_trainers.py``; here a recording binding
shows what reaches the job and what is refused.
"""

from __future__ import annotations

import pytest

from nip_core.agents.pure_text import FineTuneBinding, PureTextSharedModelGroup
from nip_core.parameters import CodeValidationAgentParameters


def group_with_binding():
    submitted = []
    group = PureTextSharedModelGroup("shared", ["prover", "verifier"], CodeValidationAgentParameters(),
                                     lambda: None)

    def sft(agent, rollouts, replace):
        if replace and agent != "verifier":
            raise ValueError(f"{agent} is not a verifier")
        return [{"messages": [agent, r, replace]} for r in rollouts]

    group.bind(FineTuneBinding(
        submit=lambda name, examples, method, job_name: submitted.append((name, examples, method, job_name)) or "job-1",
        sft_examples=sft,
        dpo_example=lambda agent, state, good, bad: {"input": [agent, state], "preferred_output": good,
                                                     "non_preferred_output": bad}))
    return group, submitted


def test_supervised_job_from_rollouts_of_each_member_and_guess_replaced_ones():
    group, submitted = group_with_binding()
    assert group.create_supervised_fine_tune_job({"prover": ["r1", "r2"], "verifier": ["r3"]},
                                                 {"verifier": ["r4"]}, job_name="mine") == "job-1"
    assert submitted == [("shared", [{"messages": ["prover", "r1", False]}, {"messages": ["prover", "r2", False]},
                                     {"messages": ["verifier", "r3", False]}, {"messages": ["verifier", "r4", True]}],
                          "supervised", "mine")]


def test_dpo_job_pairs_each_timestep_with_its_two_replies():
    group, submitted = group_with_binding()
    group.create_dpo_fine_tune_job({"verifier": ["s1", "s2"]}, {"verifier": ["good1", "good2"]},
                                   {"verifier": ["bad1", "bad2"]})
    assert submitted == [("shared", [
        {"input": ["verifier", "s1"], "preferred_output": "good1", "non_preferred_output": "bad1"},
        {"input": ["verifier", "s2"], "preferred_output": "good2", "non_preferred_output": "bad2"}], "dpo", None)]


def test_refusals_name_the_argument_and_nothing_is_submitted():
    group, submitted = group_with_binding()
    with pytest.raises(ValueError, match="rollouts_per_agent: judge not in group shared"):
        group.create_supervised_fine_tune_job({"judge": ["r"]})
    with pytest.raises(ValueError, match="prover is not a verifier"):
        group.create_supervised_fine_tune_job({"prover": ["r"]}, {"prover": ["r"]})
    with pytest.raises(ValueError, match="agent verifier: 2 timesteps, 1 positive and 2 negative"):
        group.create_dpo_fine_tune_job({"verifier": ["s1", "s2"]}, {"verifier": ["g"]}, {"verifier": ["b", "b"]})
    assert submitted == []
    unbound = PureTextSharedModelGroup("alone", ["verifier"], CodeValidationAgentParameters(), lambda: None)
    with pytest.raises(RuntimeError, match="needs the trainer that owns the group .* use create_job_from_examples"):
        unbound.create_supervised_fine_tune_job({"verifier": ["r"]})
    with pytest.raises(ValueError, match="method: 'supervised' or 'dpo', got 'rl'"):
        unbound.create_job_from_examples([], "rl", run=None, run_id="x", iteration=0)
