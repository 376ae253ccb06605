"""PureTextEnvironment: reset, protocol-driven steps, padding; NestedArrayDict basics."""

from __future__ import annotations

import numpy as np
import pytest

from nip_core.environments.nested_array_dict import NestedArrayDict, stack_nested_array_dicts
from nip_core.environments.pure_text_env import DuplicateSenderError
from nip_core.parameters import HyperParameters
from nip_core.protocols import build_protocol_handler
from nip_core.scenarios.code_validation.dataset import CodeValidationDataset
from nip_core.scenarios.code_validation.environment import CodeValidationEnvironment


def make_env(max_rounds: int = 4) -> CodeValidationEnvironment:
    hp = HyperParameters(scenario="code_validation", trainer="pure_text_ei", dataset="test",
                         nip_protocol={"max_message_rounds": max_rounds})
    return CodeValidationEnvironment(build_protocol_handler(hp))


def scripted(replies: dict[int, tuple[str, str | None, int]]):
    """Actor: round -> (agent, message, decision)."""

    def act(state):
        a = np.full(2, 2, dtype=np.int64)
        msg = np.empty((2, 1), dtype=object)
        raw = np.empty(2, dtype=object)
        agent, text, decision = replies[int(state["round"])]
        i = ["prover", "verifier"].index(agent)
        # a decision is not a message: only the raw reply records it
        msg[i, 0], raw[i], a[i] = (text if decision == 2 else None), text, decision
        return {"message": msg, "raw_message": raw, "decision": a}

    return act


def datapoint():
    return CodeValidationDataset.from_name("test", "train")[0]


def test_reset_fills_datapoint_fields_and_empty_history():
    env, dp = make_env(), datapoint()
    s = env.reset(dp, seed=70000, datapoint_id=3)
    assert int(s["seed"]) == 70000 % 2**16 and int(s["datapoint_id"]) == 3 and int(s["y"]) == dp.y
    assert s["question"][()] == dp.question and int(s["prover_stance"]) == dp.prover_stance
    assert s["message_history"].shape == (4, 1) and all(m is None for m in s["message_history"].flat)
    assert (s["message_agent_id"] == -1).all()


def test_episode_records_messages_then_pads_after_the_decision():
    env, dp = make_env(), datapoint()
    decision = int(dp.y)
    act = scripted({0: ("verifier", "Question for Expert: why?", 2), 1: ("prover", "Answer: because", 2),
                    2: ("verifier", "Decision: x", decision)})
    rollout = env.run_episode(env.reset(dp, seed=1), act)
    assert rollout.batch_size == (4,)
    assert rollout["padding"].tolist() == [False, False, False, True]
    assert rollout["next.done"].tolist() == [False, False, True, True]
    final = rollout["next.message_history"][3]
    assert final[:, 0].tolist() == ["Question for Expert: why?", "Answer: because", None, None]
    assert rollout["next.message_agent_id"][3][:, 0].tolist() == [1, 0, -1, -1]
    assert rollout["next.raw_message_history"][3][2].tolist() == [None, "Decision: x"]
    # verifier correct: +1 verifier reward; padding gives zero reward
    assert rollout["next.agents.reward"][2, 1] == 1.0
    assert rollout["next.agents.reward"][3].tolist() == [0.0, 0.0]


def test_two_senders_on_one_channel_is_an_error():
    env = make_env()
    s = env.reset(datapoint(), seed=1)
    msg = np.empty((2, 1), dtype=object)
    msg[0, 0], msg[1, 0] = "a", "b"
    with pytest.raises(DuplicateSenderError, match="channel 'main'"):
        env.step(s, {"message": msg, "raw_message": np.empty(2, dtype=object), "decision": np.full(2, 2)})


def test_nested_array_dict_index_stack_and_json_round_trip():
    a = NestedArrayDict({("agents", "x"): np.arange(6).reshape(3, 2), "t": np.array(["a", None, "c"], dtype=object)},
                        batch_size=(3,))
    assert a["agents.x"].shape == (3, 2) and a[("agents", "x")][1].tolist() == [2, 3]
    assert a[1:]["t"].tolist() == [None, "c"]
    s = stack_nested_array_dicts([a, a])
    assert s.batch_size == (2, 3)
    assert NestedArrayDict.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="key 'bad'"):
        a["bad"] = np.zeros(2)
