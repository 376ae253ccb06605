"""The GI update's hand-written kernels equal what they replace (docs/performance.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nip_core.agents.mlp import FastTanh, two_layer_mlp
from nip_core.scenarios.graph_isomorphism.agents.attention import _Attention, attention_core
from nip_core.scenarios.graph_isomorphism.agents.body import attention_mask
from nip_core.trainers.optim import build_optimizer


def _attention_inputs(dtype, lead=(3, 2), L=7, dh=4):
    torch.manual_seed(0)
    q, k, v = (torch.randn(*lead, L, dh, dtype=dtype, requires_grad=True) for _ in range(3))
    blocked = torch.rand(lead[0], 1, L, L) < 0.4
    blocked[..., :2] = False  # every query sees at least two keys
    mask = torch.zeros(lead[0], 1, L, L, dtype=dtype).masked_fill(blocked, float("-inf"))
    return q, k, v, mask


def _reference_attention(q, k, v, mask):
    scores = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5 + mask.double()
    return torch.softmax(scores, -1) @ v.double()


def test_float32_attention_takes_the_transposed_kernel_and_matches_softmax_attention():
    q, k, v, mask = _attention_inputs(torch.float32)
    out = attention_core(q, k, v, mask, 0.0)
    assert type(out.grad_fn).__name__ == "_AttentionBackward"
    expected = _reference_attention(q, k, v, mask)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    grad = torch.randn(out.shape, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), grad.float())
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_attention_with_dropout_or_other_dtypes_runs_the_plain_composition():
    q, k, v, mask = _attention_inputs(torch.float64)
    out = attention_core(q, k, v, mask, 0.0)
    assert type(out.grad_fn).__name__ != "_AttentionBackward"
    torch.testing.assert_close(out, _reference_attention(q, k, v, mask))
    q, k, v, mask = _attention_inputs(torch.float32)
    assert type(attention_core(q, k, v, mask, 0.5).grad_fn).__name__ != "_AttentionBackward"


def test_attention_kernel_is_twice_differentiable():
    """SPG differentiates the policy's gradient again."""
    q, k, v, mask = _attention_inputs(torch.float64, lead=(2, 2), L=5, dh=3)
    assert torch.autograd.gradcheck(_Attention.apply, (q, k, v, mask))
    assert torch.autograd.gradgradcheck(_Attention.apply, (q, k, v, mask))


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_two_layer_mlp_equals_the_sequential_mlp(activation):
    torch.manual_seed(0)
    act = FastTanh() if activation == "tanh" else nn.ReLU()
    mlp = nn.Sequential(nn.Linear(5, 9), act, nn.Linear(9, 3)).double()
    x = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    folded = two_layer_mlp(x, *mlp)
    plain = mlp(x)
    torch.testing.assert_close(folded, plain, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(plain)
    params = (x, *mlp.parameters())
    for g, w in zip(torch.autograd.grad(folded, params, grad), torch.autograd.grad(plain, params, grad)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    small = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: two_layer_mlp(t, *mlp), (small,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_attention_mask_blocks_own_graph_node_pairs_and_absent_keys(dtype):
    N = 3
    L = 2 + 2 * N
    same_graph = torch.zeros(L, L, dtype=torch.bool)
    same_graph[2:2 + N, 2:2 + N] = same_graph[2 + N:, 2 + N:] = True
    node_mask = torch.tensor([[[True, True, False], [True, False, False]],
                              [[True, True, True], [True, True, True]]])
    mask = attention_mask(same_graph, node_mask, dtype)
    assert mask.shape == (2, 1, L, L) and mask.dtype == dtype
    # the mask as a boolean or of the two conditions, filled: what the sum replaced
    key_absent = torch.cat([torch.zeros(2, 2, dtype=torch.bool), ~node_mask.reshape(2, 2 * N)], dim=1)
    blocked = same_graph.unsqueeze(0) | key_absent.unsqueeze(1)
    expected = torch.zeros(blocked.shape, dtype=dtype).masked_fill_(blocked, float("-inf")).unsqueeze(1)
    assert torch.equal(mask, expected)
    assert mask[0, 0, 0, 4] == float("-inf") and mask[0, 0, 2, 3] == float("-inf")  # absent key; own graph
    assert mask[0, 0, 2, 5] == 0 and mask[1, 0, 0, 7] == 0 and not mask.isnan().any()


def test_adam_is_fused_and_a_checkpoint_of_the_loop_resumes_as_the_loop():
    rl = SimpleNamespace(optimizer="adam", betas=(0.9, 0.999), optimizer_eps=1e-5, weight_decay=0.0)
    params = [nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(3))]
    optimizer = build_optimizer([{"params": params, "lr": 1e-2}], rl)
    assert optimizer.param_groups[0]["fused"] is True
    loop = torch.optim.Adam([nn.Parameter(p.detach().clone()) for p in params], lr=1e-2, eps=1e-5)
    for p, q in zip(params, loop.param_groups[0]["params"]):
        p.grad = torch.ones_like(p)
        q.grad = torch.ones_like(q)
    optimizer.step()
    loop.step()
    for p, q in zip(params, loop.param_groups[0]["params"]):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    resumed = build_optimizer([{"params": params, "lr": 1e-2}], rl)
    resumed.load_state_dict(loop.state_dict())
    assert not resumed.param_groups[0]["fused"]  # bit-identical continuation of a loop-written run
