"""Fault injection configuration and its seeded draws."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nipflow_llm_server.server.faults import FaultConfig, FaultInjector, endpoint_group


def test_endpoint_groups():
    assert endpoint_group("/v1/chat/completions") == "chat.completions"
    assert endpoint_group("/v1/fine_tuning/jobs/ftjob-1/events") == "fine_tuning.jobs"
    assert endpoint_group("/v1/files/file-1/content") == "files"
    assert endpoint_group("/v1/models/gpt-4o") == "models"
    assert endpoint_group("/admin/faults") is None
    assert endpoint_group("/health") is None


def test_config_parsing_and_limits():
    cfg = FaultConfig.parse('{"seed": 3, "endpoints": {"*": {"rate_429": 0.1}, "files": {"rate_drop": 1.0}}}')
    assert cfg.seed == 3 and cfg.endpoints["files"].rate_drop == 1.0
    with pytest.raises(ValidationError, match="at most 1"):
        FaultConfig.parse({"endpoints": {"*": {"rate_429": 0.6, "rate_500": 0.6}}})
    with pytest.raises(ValidationError, match="unknown endpoint group"):
        FaultConfig.parse({"endpoints": {"embeddings": {"rate_429": 0.1}}})
    with pytest.raises(ValidationError):
        FaultConfig.parse({"endpoints": {"*": {"rate_4290": 0.1}}})


def test_draws_are_repeatable_and_follow_the_rates():
    cfg = FaultConfig.parse({"seed": 11, "endpoints": {"*": {"rate_429": 0.1, "rate_500": 0.1, "rate_slow": 0.5, "slow_ms": 20}}})
    first = FaultInjector(cfg)
    seq = [first.draw("chat.completions")[:2] for _ in range(2000)]
    again = FaultInjector(cfg)
    assert [again.draw("chat.completions")[:2] for _ in range(2000)] == seq
    faults = [f for f, _ in seq]
    assert 150 <= faults.count("429") <= 250 and 150 <= faults.count("500") <= 250
    assert faults.count(None) == 2000 - faults.count("429") - faults.count("500")
    assert 850 <= sum(d == 0.02 for _, d in seq) <= 1150
    assert first.status()["injected"]["chat.completions:429"] == faults.count("429")


def test_specific_rule_beats_the_default_and_no_rule_means_no_fault():
    inj = FaultInjector(FaultConfig.parse({"endpoints": {"*": {"rate_500": 1.0}, "models": {"rate_429": 0.0}}}))
    assert inj.draw("files")[0] == "500"
    assert inj.draw("models")[0] is None
    assert FaultInjector().draw("files") == (None, 0.0, None)
