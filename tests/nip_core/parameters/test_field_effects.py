"""Every field a trainer accepts changes what it does; every field it does not read is refused (#29).

For each built-in trainer and each hyper-parameter field:

* if the trainer does not read it (``nip_core/parameters/field_use.py``), setting it away from
  its default is refused, naming the field and the trainer, before anything is opened (all
  six trainers);
* if the trainer reads it, a perturbation probe (``field_probes.py``) trains a
  tiny experiment with the field at a base value and at another value, through
  ``build_trainer`` as ``nipflow run --direct`` does, and the two runs must leave different
  fingerprints (trained weights, metrics, checkpoints, rollouts, fine-tune records, with clocks
  and ids taken out); two runs of the
  same configuration must leave the same one (:func:`test_a_probe_run_repeats_exactly`).

A probe may need other fields set first (:data:`PROBES`: the ``context``), e.g. the KL
coefficients of PPO act only with ``ppo.loss_type="kl_penalty"``; it gives the value to try
where the automatic choice does not fit. The few fields whose effect needs what the probes do
not run (a base run to start from; gradients large enough for the SOS thresholds; a server
that constrains decisions; failing fine-tune jobs; prompts, which the stand-in model reads as a
bag of words) name the
tests that show it (:data:`PROVEN_BY`), and this module checks those tests exist.

The text trainers run against the local API server's stand-in model (fine-tunes finish at
once; sampling seeded by what a model learned, so runs repeat). A perturbed text run is
compared stage by stage with its finished base run and stops at the first written-once file
that differs (``field_probes.fingerprint``), which keeps the ~100 text probes to about two
minutes on two cores.

Not probed: ``scenario`` and ``trainer`` (they choose what runs), fields refused whatever the
trainer (``unsupported_field``: ``test_refused_fields.py``), fields with one valid value, and
the run settings (``ExperimentSettings``: how a run is executed, not what it computes).
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from typing import Any

import pytest

from nip_core.parameters import HyperParameters, ParameterError
from nip_core.parameters.agents import GraphIsomorphismAgentParameters
from nip_core.parameters.base import unsupported_reason
from nip_core.parameters.field_use import reads
from tests.nip_core.parameters.field_probes import (
    agent_field_info,
    alternative,
    differences,
    field_info,
    fingerprint,
    set_path,
)
from tests.nip_core.parameters.test_every_field_used import all_leaves, is_constant

ROOT = Path(__file__).resolve().parents[3]
TD_TRAINERS = ("vanilla_ppo", "spg", "reinforce", "solo_agent")
TEXT_TRAINERS = ("pure_text_ei", "pure_text_malt")
RL_TRAINERS = ("vanilla_ppo", "spg", "reinforce")

_TINY = GraphIsomorphismAgentParameters.construct_test_params().model_dump()
_TINY_SOLO = {k: v for k, v in _TINY.items()
              if k not in ("d_node_selector", "num_node_selector_layers", "d_value", "num_value_layers")}
_GI = dict(scenario="graph_isomorphism", dataset="probe", d_representation=4, nip_protocol=dict(max_message_rounds=4),
           dataset_options=dict(max_train_size=24, max_test_size=8))
_TD_RL = dict(frames_per_batch=16, num_iterations=2, minibatch_size=8, num_epochs=1, num_test_iterations=1,
              num_normalization_steps=5)
# four rounds and 12 rollouts: enough verifier examples for a fine-tune job in each of the two
# iterations (a group with fewer than 10 gets none), about 1 s (EI) and 4 s (MALT) a run
_TEXT = dict(scenario="code_validation", dataset="nipflow-cv", nip_protocol={"max_message_rounds": 4},
             rl={"num_iterations": 2, "rollouts_per_iteration": 12},
             dataset_options={"max_train_size": 12, "max_test_size": 4})

BASES: dict[str, dict[str, Any]] = {
    "vanilla_ppo": dict(_GI, trainer="vanilla_ppo", agents={"_default": _TINY}, rl=_TD_RL),
    "spg": dict(_GI, trainer="spg", agents={"_default": _TINY}, rl=_TD_RL),
    "reinforce": dict(_GI, trainer="reinforce", agents={"_default": _TINY}, rl=_TD_RL),
    "solo_agent": dict(_GI, trainer="solo_agent", agents={"_default": _TINY_SOLO},
                       solo_agent=dict(num_epochs=2, batch_size=8), dataset_options=dict(max_train_size=24)),
    # every rollout selected: a fine-tune job for the verifier's group in each iteration
    "pure_text_ei": dict(_TEXT, trainer="pure_text_ei", pure_text_ei={"reward_threshold": -1.0}),
    "pure_text_malt": dict(_TEXT, trainer="pure_text_malt"),
}

_SCHEDULE = "agents._default.update_schedule"
_CONTIGUOUS = {"kind": "contiguous_periodic", "period": 2, "start": 0, "stop": 1}
_ALTERNATING = {"kind": "alternating_periodic", "period": 2, "first_agent_num_rounds": 1, "first_agent": True}
_SEPARATE_BODIES = {"rl.use_shared_body": False}
_WITH_CRITIC = {"reinforce.use_advantage_and_critic": True}
_THREE_ITERATIONS = {"rl.num_iterations": 3}
_PRETRAIN = {"pretrain_agents": True}
_SLOW_BODY = {"agents._default.body_lr_factor": {"actor": 0.5, "critic": 0.5}}
_TESTED = {"text_rl.test_scheme": "last"}
_DECIDE_AT_ONCE = {"nip_protocol.max_message_rounds": 2}
_GUESSES_REPLACED = {"text_rl.verifier_guess_replacement_proportion": 0.5}


def _two_prover_probes(protocol: str, name: str) -> list["Probe"]:
    """Probes of a debate/MNIP field: with that protocol chosen (MALT in two rounds, EI in four:
    MALT's tree grows with the rounds), ``prover0_first`` with sequential provers."""
    td = {"interaction_protocol": protocol}
    ei, malt = ({**td, f"{protocol}_protocol.max_message_rounds": n} for n in (4, 2))
    if name == "prover0_first":
        td, ei, malt = ({**c, f"{protocol}_protocol.sequential": True} for c in (td, ei, malt))
    value = {"max_message_rounds": (4, 3, 3), "prover0_first": (False, False, False)}.get(name, (None,) * 3)
    return [Probe(value[0], td, trainers=TD_TRAINERS), Probe(value[1], ei, trainers=("pure_text_ei",)),
            Probe(value[2], malt, trainers=("pure_text_malt",))]


class Probe:
    """How to show a field's effect: ``context`` set on both runs, then ``path`` set to ``value``."""

    def __init__(self, value: Any = None, context: dict[str, Any] | None = None, path: str | None = None,
                 trainers: tuple[str, ...] | None = None):
        self.value, self.context, self.path, self.trainers = value, context or {}, path, trainers


#: field (as ``all_leaves`` names it) -> its probe, where the automatic one does not do
PROBES: dict[str, list[Probe]] = {
    "dataset": [Probe("probe-alt")],
    "rl.num_iterations": [Probe(3)],
    "rl.num_test_iterations": [Probe(2, trainers=TD_TRAINERS), Probe(2, _TESTED, trainers=TEXT_TRAINERS)],
    "rl.num_normalization_steps": [Probe(6)],
    "rl.frames_per_batch": [Probe(24, trainers=TD_TRAINERS),
                            # the text trainers' fallback for rl.rollouts_per_iteration
                            Probe(8, {"rl.rollouts_per_iteration": None, "rl.frames_per_batch": 12},
                                  trainers=TEXT_TRAINERS)],
    "rl.rollouts_per_iteration": [Probe(2, {"rl.frames_per_batch": None, "rl.rollouts_per_iteration": 4})],
    "rl.minibatch_size": [Probe(4)],
    "text_rl.fine_tune_n_epochs": [Probe(1, trainers=TEXT_TRAINERS)],
    "nip_protocol.max_message_rounds": [Probe(8, trainers=TD_TRAINERS), Probe(3, trainers=TEXT_TRAINERS)],
    "test_size": [Probe(0.5, _PRETRAIN, trainers=RL_TRAINERS),
                  Probe(0.5, trainers=("solo_agent",))],
    "solo_agent.num_epochs": [Probe(3, trainers=("solo_agent",)), Probe(3, _PRETRAIN, trainers=RL_TRAINERS)],
    "solo_agent.batch_size": [Probe(4, trainers=("solo_agent",)), Probe(4, _PRETRAIN, trainers=RL_TRAINERS)],
    "solo_agent.learning_rate": [Probe(None, trainers=("solo_agent",)), Probe(None, _PRETRAIN, trainers=RL_TRAINERS)],
    "solo_agent.body_lr_factor_override": [Probe(True, {"agents._default.body_lr_factor": {"actor": 0.5}},
                                                 trainers=("solo_agent",)),
                                           Probe(True, {**_PRETRAIN, **_SLOW_BODY}, trainers=RL_TRAINERS)],
    **{f"agents.*.{group}.{part}": [Probe(0.5, _SEPARATE_BODIES, trainers=("vanilla_ppo", "spg")),
                                    Probe(0.5, {**_SEPARATE_BODIES, **_WITH_CRITIC}, trainers=("reinforce",))]
       for group in ("agent_lr_factor", "body_lr_factor", "gnn_lr_factor") for part in ("critic",)},
    **{f"agents.*.{group}.actor": [Probe(0.5, _SEPARATE_BODIES, trainers=("vanilla_ppo", "spg")),
                                   Probe(0.5, trainers=("reinforce", "solo_agent"))]
       for group in ("agent_lr_factor", "body_lr_factor", "gnn_lr_factor")},
    **{f"agents.*.{name}": [Probe(None, _WITH_CRITIC, trainers=("reinforce",))]
       for name in ("d_value", "include_round_in_value")},
    **{f"rl.{name}": [Probe(None, _WITH_CRITIC, trainers=("reinforce",))]
       for name in ("loss_critic_type", "clip_value", "lmbda", "use_shared_body")},
    "agents.*.update_schedule.kind": [Probe(_CONTIGUOUS, path=_SCHEDULE)],
    "agents.*.update_schedule.period": [
        Probe(3, {**_THREE_ITERATIONS, _SCHEDULE: _CONTIGUOUS}, path=f"{_SCHEDULE}.period"),
        Probe(3, {**_THREE_ITERATIONS, _SCHEDULE: _ALTERNATING}, path=f"{_SCHEDULE}.period")],
    "agents.*.update_schedule.start": [Probe(1, {_SCHEDULE: {**_CONTIGUOUS, "stop": 2}})],
    "agents.*.update_schedule.stop": [Probe(2, {_SCHEDULE: _CONTIGUOUS})],
    "agents.*.update_schedule.first_agent_num_rounds": [Probe(2, {_SCHEDULE: _ALTERNATING})],
    "agents.*.update_schedule.first_agent": [Probe(False, {_SCHEDULE: _ALTERNATING})],
    "agents.*.num_heads": [Probe(1)],
    "agents.*.d_transformer": [Probe(4)],
    # make_mlp builds at least two layers: 1 and 2 are the same network (3 is not)
    **{f"agents.*.num_{head}_layers": [Probe(3, trainers=("vanilla_ppo", "spg", "solo_agent")),
                                       Probe(3, _WITH_CRITIC, trainers=("reinforce",))]
       for head in ("node_selector", "decider", "value")},
    **{f"ppo.{name}": [Probe(None, {"ppo.loss_type": "kl_penalty"})]
       for name in ("kl_beta", "kl_decrement", "kl_increment")},
    "ppo.kl_target": [Probe(10.0, {"ppo.loss_type": "kl_penalty"})],  # the KL on the other side of it
    "spg.additional_lola_term": [Probe(None, {"spg.variant": "lola"})],
    "spg.ihvp_variant": [Probe(None, {"spg.variant": "spg"})],
    "spg.ihvp_rank": [Probe(1, {"spg.variant": "spg"})],
    "spg.ihvp_rho": [Probe(10.0, {"spg.variant": "spg"})],
    "spg.ihvp_num_iterations": [Probe(1, {"spg.variant": "spg", "spg.ihvp_variant": "conj_grad"})],
    "spg.stackelberg_sequence": [Probe([["prover"], ["verifier"]])],
    "rl.betas": [Probe([0.5, 0.9])],
    "rl.momentum": [Probe(0.5, {"rl.optimizer": "sgd"})],
    **{f"{protocol}_protocol.{name}": _two_prover_probes(protocol, name)
       for protocol in ("debate", "mnip")
       for name in ("max_message_rounds", "min_message_rounds", "sequential", "prover0_first",
                    "randomize_channel_order")},
    **{f"zk_protocol.{name}": [Probe(None, {"protocol_common.zero_knowledge": True})]
       for name in ("simulator_reward_coefficient", "aux_prover_reward_coefficient")},
    # text trainers
    "agents.*.model_name": [Probe("gpt-4.1-mini-2025-04-14")],
    "agents.*.shared_model_group": [Probe("everyone")],
    # replies cut at 16 tokens (the default is 1.5 x max_response_words)
    "agents.*.max_tokens_per_message": [Probe(None, trainers=TD_TRAINERS), Probe(16, trainers=TEXT_TRAINERS)],
    # in two rounds the untrained verifier must decide at once: some replies cannot be parsed
    # and are sampled again; some episodes end without a decision
    "agents.*.num_invalid_generation_retries": [Probe(0, _DECIDE_AT_ONCE)],
    # ... and with no second try, a verifier that gave up ends its episode without a decision
    "protocol_common.verifier_terminated_penalty": [
        Probe(None, trainers=TD_TRAINERS),
        Probe(None, {**_DECIDE_AT_ONCE, "agents._default.num_invalid_generation_retries": 0}, trainers=TEXT_TRAINERS)],
    # the second iteration's fine-tune shows in the third iteration's rollouts (MALT's verifier
    # has fewer than 10 examples in its second iteration unless the first one's are added)
    "agents.*.fine_tune_from_scratch": [
        Probe(None, {**_THREE_ITERATIONS, "text_rl.fine_tune_on_all_previous_rollouts": True})],
    "text_rl.fine_tune_on_all_previous_rollouts": [Probe(None, _THREE_ITERATIONS)],
    # fewer test pairs than a test batch's episodes (8 of 2 steps each when every verifier
    # decides at once, as spg's does on some CPU kinds: one more pair than 8 is then never drawn)
    "dataset_options.max_test_size": [Probe(3, trainers=TD_TRAINERS), Probe(None, _TESTED, trainers=TEXT_TRAINERS)],
    "text_rl.test_on_whole_dataset": [Probe(None, _TESTED)],
    "text_rl.verifier_guess_replacement_annealing": [Probe(None, {**_GUESSES_REPLACED, **_THREE_ITERATIONS})],
    "text_rl.verifier_guess_replacement_annealing_rate": [
        Probe(None, {**_GUESSES_REPLACED, **_THREE_ITERATIONS, "text_rl.verifier_guess_replacement_annealing": "linear"})],
    # a sample as large as the rollouts: enough examples for a job (the default half gives 6 < 10)
    "pure_text_ei.weighting_sample_size_factor": [Probe(1.0, {"pure_text_ei.rollout_selection_method": "weighted_sampling"})],
    **{f"pure_text_ei.weighting_{name}": [Probe(value, {"pure_text_ei.rollout_selection_method": "weighted_sampling",
                                                        "pure_text_ei.weighting_sample_size_factor": 1.0})]
       # rewards of -1 and 1 shifted by any minimum in between weigh the same: one below them
       for name, value in (("minimum", -2.0), ("use_replacement", None), ("epsilon", None))},
}

_MERGE = "tests/nip_core/trainers/test_pure_text_rerun.py::test_merge_keeps_only_the_preserved_fields_and_the_base_run_group"
_RERUN = {t: "tests/nip_core/trainers/test_rerun_tests_tensordict.py::"
             "test_a_rerun_tests_the_base_runs_checkpoint_without_training" for t in RL_TRAINERS}

#: (trainer, field) -> the tests that show the effect with what the probes do not run (a
#: language-model engine; a base run to start from)
PROVEN_BY: dict[tuple[str, str], tuple[str, ...]] = {
    **{(t, path): (_MERGE, *([_RERUN[t]] if t in _RERUN else [])) for t in TD_TRAINERS
       for path in ("base_run.base_run_type", "base_run.run_id")},
    # the tiny probes' second-order terms stay far below the SOS thresholds (p = 1 either way)
    **{("spg", f"spg.sos_{name}"): ("tests/nip_core/trainers/test_spg.py::test_sos_update_rules",
                                    "tests/nip_core/trainers/test_spg.py::test_the_trainer_hands_its_sos_factors_to_the_update")
       for name in ("scaling_factor", "threshold_factor")},
    # text trainers: the rerun of a base run's models; a structured-output server; failing jobs
    **{(t, path): (_MERGE, "tests/nip_core/trainers/test_pure_text_rerun.py::test_rerun_tests_replays_the_base_runs_models")
       for t in TEXT_TRAINERS for path in ("base_run.base_run_type", "base_run.run_id")},
    **{(t, "agents.*.decision_constraint"): (
        "tests/llm_server/engines/test_structured_output.py::"
        "test_a_verifiers_decision_turn_is_held_to_its_form_where_the_server_offers_it",) for t in TEXT_TRAINERS},
    # the stand-in model reads a prompt as a bag of words: the order of the channels shows in
    # the prompts, not in what it answers
    **{(t, f"{protocol}_protocol.randomize_channel_order"): (
        "tests/nip_core/scenarios/code_validation/test_text_protocols.py::"
        "test_the_verifier_sees_the_provers_channels_shuffled_only_when_asked",)
       for t in TEXT_TRAINERS for protocol in ("debate", "mnip")},
    **{(t, "text_rl.fine_tune_max_attempts"): (
        "tests/nip_core/trainers/test_pure_text_ei.py::test_a_job_that_ends_badly_on_its_last_attempt_stops_the_run_with_its_error",
        "tests/nip_core/trainers/test_pure_text_ei.py::test_a_cancelled_job_is_retried_by_the_await_stage")
       for t in TEXT_TRAINERS},
}

#: the fields that choose what runs rather than how
IDENTITY = ("scenario", "trainer")


def _scenario(trainer: str) -> str:
    return BASES[trainer]["scenario"]


def probed_fields(trainer: str) -> dict[str, bool]:
    """``{field: read by the trainer}`` over every probed field of the trainer's scenario."""
    from nip_core.parameters.agents import AGENT_PARAMS_BY_SCENARIO

    agent_fields = AGENT_PARAMS_BY_SCENARIO[_scenario(trainer)].model_fields
    out: dict[str, bool] = {}
    for path, leaves in all_leaves().items():
        if path.startswith("settings.") or path in IDENTITY:
            continue
        if path.startswith("agents.*.") and path.split(".")[2] not in agent_fields:
            continue  # another scenario's agents
        if path == "agents.*.update_schedule.kind":
            pass  # a union's discriminator: each kind is a value to try
        elif any(unsupported_reason(leaf.info) for leaf in leaves) or all(is_constant(leaf.info) for leaf in leaves):
            continue
        if path == "dataset" and _scenario(trainer) == "code_validation":
            continue  # one registered dataset: no other valid value
        out[path] = reads(trainer, path)
    return out


def probes_for(trainer: str, path: str) -> list[Probe]:
    """The probes of ``path`` for ``trainer`` (the automatic one when :data:`PROBES` has none)."""
    return [p for p in PROBES.get(path, [Probe()]) if p.trainers is None or trainer in p.trainers] or [Probe()]


def resolved(trainer: str, path: str, probe: Probe) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base configuration (with the probe's context) and the perturbed one."""
    scenario = _scenario(trainer)
    concrete = probe.path or path.replace("agents.*.", "agents._default.")
    base = BASES[trainer]
    for key, value in probe.context.items():
        base = set_path(base, key, value)
    value = probe.value
    if value is None:
        info, default = (agent_field_info(scenario, concrete) if concrete.startswith("agents.")
                         else field_info(concrete))
        current = _get(base, concrete, default)
        value = alternative(info, current)
    return base, set_path(base, concrete, value)


def _get(config: dict[str, Any], path: str, default: Any) -> Any:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


# --- the two checks ----------------------------------------------------------------------


def _cases(read: bool) -> list[Any]:
    cases = []
    for trainer in BASES:
        for path, is_read in probed_fields(trainer).items():
            if is_read == read:
                cases.append(pytest.param(trainer, path, id=f"{trainer}:{path}",
                                          marks=[pytest.mark.slow] if read else []))
    return cases


@pytest.fixture(scope="module")
def probe_env(tmp_path_factory):
    """A data directory with the probes' two tiny graph-isomorphism datasets."""
    from nip_core.scenarios.graph_isomorphism.named_datasets import NAMED_DATASETS, register_named_dataset
    from nip_core.scenarios.graph_isomorphism.named_datasets import named_dataset_config

    test = {split: named_dataset_config("test", split) for split in ("train", "test")}
    for name, seed in (("probe", 11), ("probe-alt", 13)):
        register_named_dataset(name, {split: config.model_copy(update={"seed": seed + i})
                                      for i, (split, config) in enumerate(test.items())}, overwrite=True)
    root = tmp_path_factory.mktemp("probes")
    with contextlib.ExitStack() as servers:
        yield {"data": root / "data", "root": root, "bases": {}, "servers": servers}
    for name in ("probe", "probe-alt"):
        NAMED_DATASETS.pop(name, None)


def _api_url(env, trainer: str) -> str | None:
    """The local API server of the text probes (started on first use, fine-tunes at once)."""
    if trainer not in TEXT_TRAINERS:
        return None
    if "api_url" not in env:
        from nipflow_llm_server.testing import local_api_server

        env["api_url"] = env["servers"].enter_context(local_api_server(env["root"] / "api", job_time_scale=0.0)).base_url
    return env["api_url"]


def _fingerprint(env, trainer: str, config: dict[str, Any], reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a run of ``config`` leaves behind; a perturbed text run stops at its first difference from ``reference``."""
    import json
    import tempfile

    key = json.dumps(config, sort_keys=True, default=str)
    if key in env["bases"]:
        return env["bases"][key]
    work = Path(tempfile.mkdtemp(dir=env["root"]))
    out = fingerprint(config, work, data_dir=env["data"], api_url=_api_url(env, trainer), reference=reference)
    if "stopped_at" not in out:
        env["bases"][key] = out
    return out


@pytest.mark.parametrize("trainer, path", _cases(read=True))
def test_a_field_the_trainer_reads_changes_what_it_does(trainer, path, probe_env):
    if (trainer, path) in PROVEN_BY:
        for test in PROVEN_BY[trainer, path]:
            file, name = test.split("::")
            tree = ast.parse((ROOT / file).read_text())
            assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, test
        return
    tried = []
    for probe in probes_for(trainer, path):
        base, changed = resolved(trainer, path, probe)
        a = _fingerprint(probe_env, trainer, base)
        b = _fingerprint(probe_env, trainer, changed, reference=a)
        diff = differences(a, b)
        tried.append((probe.context, diff[:5]))
        assert diff, (f"{trainer}: {path} set to another value changed nothing the run left behind "
                      f"(context {probe.context}); refuse it for {trainer} in nip_core/parameters/field_use.py "
                      f"or make it act")


@pytest.mark.parametrize("trainer, path", _cases(read=False))
def test_a_field_the_trainer_does_not_read_is_refused_naming_it(trainer, path):
    probe = probes_for(trainer, path)[0]
    generic = path if not path.startswith("agents.*.update_schedule") else "agents.*.update_schedule"
    concrete = (probe.path or path.replace("agents.*.", "agents._default.")).split(".update_schedule")[0]
    errors = []
    # with the probe's context, or without it where the context alone is refused for another reason
    for candidate in (probe, Probe(probe.value, path=probe.path)):
        _, changed = resolved(trainer, path, candidate)
        with pytest.raises(ParameterError) as caught:
            HyperParameters.from_dict(changed)
        errors.append(str(caught.value))
        if f"the {trainer} trainer does not read {generic} (read by" in str(caught.value):
            assert any(p.startswith(concrete) for p, _ in caught.value.problems)
            return
    pytest.fail(f"{path} is not refused for {trainer} by name: {errors}")


def test_the_counts_of_fields_proven_each_way():
    """The note's figures: per trainer, fields read (each probed) and fields refused."""
    counts = {t: (sum(v for v in probed_fields(t).values()), sum(not v for v in probed_fields(t).values()))
              for t in BASES}
    # every trainer reads its scenario's core (seed, protocol, agents) and refuses another trainer's group
    for trainer, (read, refused) in counts.items():
        assert read >= 20 and refused >= 10, (trainer, read, refused)
    assert counts["vanilla_ppo"][0] > counts["reinforce"][0] > counts["solo_agent"][0]


@pytest.mark.slow
@pytest.mark.parametrize("trainer", [*TD_TRAINERS, *TEXT_TRAINERS])
def test_a_probe_run_repeats_exactly(trainer, probe_env):
    """Two runs of the same configuration leave the same fingerprint: a difference is the field's.

    A text run compared stage by stage with a finished run of the same configuration runs to
    its end: no written-once file of a run in progress differs from the finished run's.
    """
    import tempfile

    def run(reference=None):
        return fingerprint(BASES[trainer], Path(tempfile.mkdtemp(dir=probe_env["root"])), data_dir=probe_env["data"],
                           api_url=_api_url(probe_env, trainer), reference=reference)

    first = run()
    again = run(first) if trainer in TEXT_TRAINERS else run()
    assert first["run"] and "stopped_at" not in again and not differences(first, again)
