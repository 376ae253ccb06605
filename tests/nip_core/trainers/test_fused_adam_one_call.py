"""FusedAdam(W): one kernel call per settings, bit-identical to torch's fused step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nip_core.trainers.optim import FusedAdam, FusedAdamW, clip_grad_norm


def _groups(seed: int) -> list[dict]:
    """Five groups: three learning rates (two groups share one), a weight decay, amsgrad."""
    generator = torch.Generator().manual_seed(seed)

    def params(*shapes):
        return [nn.Parameter(torch.randn(*shape, generator=generator)) for shape in shapes]

    return [
        {"params": params((4, 3), (3,)), "lr": 1e-2},
        {"params": params((5,), (2, 2)), "lr": 3e-3},
        {"params": params((6, 2)), "lr": 1e-2},  # the settings of the first group
        {"params": params((3, 3)), "lr": 1e-3, "weight_decay": 0.1},
        {"params": params((7,)), "lr": 2e-3, "amsgrad": True},
    ]


def _run(cls, steps: int, seed: int = 0, kwargs: dict | None = None, skip: int | None = None):
    """Parameters and optimiser state after ``steps`` steps on the same gradients; parameter ``skip``
    (an index over all parameters) has no gradient at the odd steps."""
    groups = _groups(seed)
    optimizer = cls(groups, betas=(0.9, 0.99), eps=1e-5, fused=True, **(kwargs or {}))
    params = [p for g in groups for p in g["params"]]
    generator = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        for index, p in enumerate(params):
            grad = torch.randn(p.shape, generator=generator)
            p.grad = None if index == skip and step % 2 else grad
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return params, optimizer


@pytest.mark.parametrize(("fast", "reference"), [(FusedAdam, torch.optim.Adam), (FusedAdamW, torch.optim.AdamW)])
def test_the_one_call_step_is_bit_identical_to_torchs_fused_step(fast, reference):
    for skip in (None, 2):
        ours, ours_opt = _run(fast, 5, skip=skip)
        theirs, theirs_opt = _run(reference, 5, skip=skip)
        for p, q in zip(ours, theirs):
            assert torch.equal(p, q)
        for p, q in zip(ours, theirs):
            for key, value in theirs_opt.state[q].items():
                assert torch.equal(ours_opt.state[p][key], value), key
    # a parameter without a gradient is not stepped: its count stays behind the others'
    ours, ours_opt = _run(fast, 4, skip=2)
    assert ours_opt.state[ours[2]]["step"].item() == 2.0
    assert ours_opt.state[ours[0]]["step"].item() == 4.0


def _stepped_once() -> tuple[FusedAdam, list[nn.Parameter]]:
    """A fused FusedAdam over :func:`_groups` after its first step (torch's own: it creates the state)."""
    groups = _groups(0)
    optimizer = FusedAdam(groups, betas=(0.9, 0.99), eps=1e-5, fused=True)
    params = [p for g in groups for p in g["params"]]
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    return optimizer, params


def test_groups_of_equal_settings_share_one_kernel_call(monkeypatch):
    optimizer, params = _stepped_once()
    calls = []
    kernel = torch._fused_adam_
    monkeypatch.setattr(torch, "_fused_adam_", lambda params, *a, **k: (calls.append(len(params)), kernel(params, *a, **k)))
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    # five groups, four settings: groups 0 and 2 (lr 1e-2, same betas, eps, decay) in one call
    assert sorted(calls) == [1, 1, 2, 3]
    assert all(optimizer.state[p]["step"].item() == 2.0 for p in params)


def test_a_closure_a_scaler_or_a_non_fused_group_takes_torchs_step():
    optimizer, _ = _stepped_once()
    assert optimizer._one_call_plan() is not None
    optimizer.grad_scale = torch.ones(())
    assert optimizer._one_call_plan() is None
    del optimizer.grad_scale
    optimizer.param_groups[1]["lr"] = torch.tensor(1e-3)
    assert optimizer._one_call_plan() is None
    optimizer.param_groups[1]["lr"] = 1e-3
    loop = FusedAdam(_groups(1), lr=1e-3)  # not fused: torch's loop
    for p in (p for g in loop.param_groups for p in g["params"]):
        p.grad = torch.ones_like(p)
    loop.step()
    assert loop._one_call_plan() is None
    seen = []
    assert optimizer.step(closure=lambda: seen.append(1) or 0.5) == 0.5 and seen == [1]


@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # clipping, and a coefficient clamped to 1
def test_clip_grad_norm_is_bit_identical_to_torchs(max_norm):
    generator = torch.Generator().manual_seed(3)
    shapes = [(4, 3), (3,), (16, 64), (64,), (1,)]
    ours = [nn.Parameter(torch.zeros(s)) for s in shapes]
    theirs = [nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, q in zip(ours, theirs):
        p.grad = torch.randn(p.shape, generator=generator)
        q.grad = p.grad.clone()
    ours[1].grad = theirs[1].grad = None  # a parameter without a gradient
    clip_grad_norm(ours, max_norm)
    torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    for p, q in zip(ours, theirs):
        assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)
    assert max_norm > 1 or not torch.equal(ours[0].grad, torch.zeros(4, 3))
    # mixed dtypes: torch's function itself
    mixed = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    for p in mixed:
        p.grad = torch.full_like(p, 2.0)
    clip_grad_norm(mixed, 1.0)
    norm = torch.sqrt(torch.tensor(24.0, dtype=torch.float64))
    for p in mixed:
        torch.testing.assert_close(p.grad, torch.full_like(p, float(2.0 / (norm + 1e-6))))
    clip_grad_norm([nn.Parameter(torch.zeros(2))], 1.0)  # no gradient at all: nothing to do
