"""One LoRA fine-tune of the built-in real model changes what it does on held-out prompts.

Untrained, SmolLM2-135M-Instruct answers nipflow's ``solo_verifier`` prompt with English and
code, not with the ``Decision:`` line the verifier must end with. One supervised job through
the local server (the API path a pure-text trainer takes: file upload, job, fine-tuned model)
on verifier prompts of the training split, each answered with its correct decision, teaches it
the form: on prompts of the *test* split, sampled greedily and without any constraint, the
share of replies that ``parse_reply`` accepts as a decision rises.

Calibrated with the job seeds 0, 1 and 2 (AMD EPYC, 2 cores; see ``CALIBRATION``): before
training 0 of the 12 held-out replies is a valid decision (greedy: the same for every seed);
after one job every seed gives 12/12. The test asserts at least 9/12 after, and at most 2/12
before, so a seed spread of 3 replies on either side still passes and a job that teaches
nothing fails.
"""

from __future__ import annotations

import pytest

from nip_core.parameters import HyperParameters
from nip_core.protocols import build_protocol_handler
from nip_core.scenarios.code_validation.dataset import CodeValidationDataset
from nip_core.scenarios.code_validation.environment import CodeValidationEnvironment
from nip_core.scenarios.code_validation.text_protocols import InvalidResponseError, build_chat_messages, parse_reply
from nip_core.trainers.pure_text_rollouts import history_of
from nipflow_llm_server.engines import smollm2
from nipflow_llm_server.testing import local_api_server
from tests.llm_server.llm_helpers import jsonl, wait_for_job

TRAIN_PROMPTS = 16  # the smallest set that taught the form with every calibration seed
HELD_OUT = 12
#: job seed -> (valid decisions before, after) out of HELD_OUT, measured with this file's settings
CALIBRATION = {0: (0, 12), 1: (0, 12), 2: (0, 12)}


def verifier_prompts(split: str, n: int) -> list[tuple[list[dict[str, str]], int]]:
    """The first ``n`` ``solo_verifier`` prompts of ``split`` as the trainer builds them, and their labels."""
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="nipflow-cv",
                         interaction_protocol="solo_verifier")
    handler = build_protocol_handler(hp)
    data = CodeValidationDataset.from_name(hp.dataset, split, max_size=n)
    env = CodeValidationEnvironment(handler, data)
    words = hp.agent_params("verifier").max_response_words
    out = []
    for k in range(len(data)):
        state = env.reset(data[k], seed=k, datapoint_id=k)
        out.append((build_chat_messages(handler, "solo_verifier", "verifier", history_of(state),
                                        max_response_words=words, until_round=0), int(data[k].y)))
    return out


def valid_decisions(client, model: str, prompts) -> int:
    """Greedy, unconstrained replies to ``prompts`` that the verifier's parser takes as a decision."""
    handler = build_protocol_handler(HyperParameters(scenario="code_validation", trainer="pure_text_ei",
                                                     dataset="nipflow-cv", interaction_protocol="solo_verifier"))
    channels = list(handler.message_channel_names)
    valid = 0
    for messages, _ in prompts:
        reply = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=8)
        try:
            parse_reply(handler, "verifier", reply.choices[0].message.content or "", channels,
                        may_decide=True, must_decide=True)
            valid += 1
        except InvalidResponseError:
            pass
    return valid


def learn_the_decision_form(tmp_path, seed: int) -> tuple[int, int]:
    """(valid decisions before, after) one job on ``TRAIN_PROMPTS`` answered training prompts."""
    examples = [{"messages": [*messages, {"role": "assistant",
                                          "content": "Decision: accept" if y == 1 else "Decision: reject"}]}
                for messages, y in verifier_prompts("train", TRAIN_PROMPTS)]
    held_out = verifier_prompts("test", HELD_OUT)
    with local_api_server(tmp_path, engine="transformers", startup_timeout=120.0, job_time_scale=0.02,
                          engine_options={"device": "cpu", "base_models": [smollm2.NAME]}) as server:
        client = server.client(max_retries=0, timeout=300.0)
        before = valid_decisions(client, smollm2.NAME, held_out)
        upload = client.files.create(file=("train.jsonl", jsonl(examples)), purpose="fine-tune")
        job = client.fine_tuning.jobs.create(model=smollm2.NAME, training_file=upload.id, seed=seed,
                                             method={"type": "supervised", "supervised": {
                                                 "hyperparameters": {"n_epochs": 2}}})
        job = wait_for_job(client, job.id, timeout=900.0)
        assert job.status == "succeeded", job.error
        after = valid_decisions(client, job.fine_tuned_model, held_out)
    return before, after


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.long(150)
def test_one_lora_job_teaches_the_real_model_the_decision_form(tmp_path, smollm2_data_dir, monkeypatch):
    monkeypatch.setenv("NIPFLOW_DATA_DIR", str(smollm2_data_dir))
    before, after = learn_the_decision_form(tmp_path, seed=0)
    assert before <= 2 and after >= 9, (before, after)
