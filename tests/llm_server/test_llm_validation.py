"""Line-by-line validation of fine-tuning files."""

from __future__ import annotations

import json

import pytest

from nipflow_llm_server.server.validation import (
    FORMAT_CHAT,
    FORMAT_PREFERENCE,
    TrainingFileError,
    parse_training_file,
    training_examples,
)
from tests.llm_server.llm_helpers import dpo_examples, jsonl, sft_examples


def test_chat_and_preference_files_parse():
    assert parse_training_file(jsonl(sft_examples(3))).format == FORMAT_CHAT
    parsed = parse_training_file(jsonl(dpo_examples(3)))
    assert parsed.format == FORMAT_PREFERENCE and len(parsed.examples) == 3


def test_preference_input_may_be_a_bare_message_list():
    ex = dpo_examples(1)[0]
    ex["input"] = ex["input"]["messages"]
    assert parse_training_file(jsonl([ex])).format == FORMAT_PREFERENCE


@pytest.mark.parametrize(
    ("bad_line", "fragment"),
    [
        ("{not json", "invalid JSON"),
        (json.dumps([1, 2]), "JSON object"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}]}), "at least one assistant"),
        (json.dumps({"messages": [{"role": "robot", "content": "hi"}]}), "invalid role 'robot'"),
        (json.dumps({"messages": [{"role": "assistant", "content": 3}]}), "'content' must be"),
        (json.dumps({"messages": [{"role": "user", "content": "a", "weight": 1}, {"role": "assistant", "content": "b"}]}), "'weight' is only allowed"),
        (json.dumps({"prompt": "a", "completion": "b"}), "expected a chat example"),
    ],
)
def test_errors_name_the_line(bad_line, fragment):
    lines = [json.dumps(e) for e in sft_examples(2)] + [bad_line]
    with pytest.raises(TrainingFileError) as info:
        parse_training_file("\n".join(lines).encode())
    assert info.value.line == 3
    assert str(info.value).startswith("line 3: ")
    assert fragment in str(info.value)


def test_bad_preference_outputs_and_mixed_files():
    ex = dpo_examples(1)[0]
    ex["preferred_output"] = [{"role": "user", "content": "x"}]
    with pytest.raises(TrainingFileError, match="line 1: 'preferred_output' must hold an assistant"):
        parse_training_file(jsonl([ex]))
    mixed = jsonl(sft_examples(1)) + jsonl(dpo_examples(1))
    with pytest.raises(TrainingFileError, match="line 2: preference example in a file of chat examples"):
        parse_training_file(mixed)
    with pytest.raises(TrainingFileError, match="no examples"):
        parse_training_file(b"\n\n")


def test_job_checks_method_and_example_count():
    assert len(training_examples(jsonl(sft_examples(10)), "supervised")) == 10
    with pytest.raises(TrainingFileError) as info:
        training_examples(jsonl(sft_examples(10)), "dpo")
    assert info.value.code == "invalid_training_file" and "line 1" in str(info.value)
    with pytest.raises(TrainingFileError) as info:
        training_examples(jsonl(sft_examples(9)), "supervised")
    assert info.value.code == "invalid_n_examples"
    assert "has 9 example(s), but must have at least 10" in str(info.value)
    # a validation file may be small
    assert len(training_examples(jsonl(sft_examples(2)), "supervised", role="validation")) == 2
