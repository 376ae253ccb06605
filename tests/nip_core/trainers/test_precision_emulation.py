"""bf16 autocast's products in float32 on bf16 values, for CPUs without native bf16 (precision.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import _get_current_function_mode_stack

from nip_core.trainers import precision as precision_module
from nip_core.trainers.precision import Float32Bf16Products, precision_context
from tests.nip_core.trainers.gi_helpers import make_trainer, params_of, tiny_params
from tests.nip_core.trainers.test_precision_device import AGENT

PRODUCTS = {
    "mm": (lambda a, b, c: torch.mm(a[0], b[0]), "2d"),
    "bmm": (lambda a, b, c: torch.bmm(a, b), "3d"),
    "Tensor.bmm": (lambda a, b, c: a.bmm(b), "3d"),
    "matmul": (lambda a, b, c: torch.matmul(a, b), "3d"),
    "@": (lambda a, b, c: a @ b, "3d"),
    "baddbmm": (lambda a, b, c: torch.baddbmm(c, a, b), "3d"),
    "addmm": (lambda a, b, c: torch.addmm(c[0], a[0], b[0]), "2d"),
    "linear": (lambda a, b, c: F.linear(a, b[0].T, c[0, 0]), "3d"),
}


def _operands(exact: bool, seed: int = 0):
    """(2, 5, 24) @ (2, 24, 7) plus (2, 1, 7), float32 leaves. ``exact``: multiples of 1/8 below 4,
    bf16 numbers whose products and sums float32 holds exactly, so every order of the sums agrees."""
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 5, 24), (2, 24, 7), (2, 1, 7))
    if exact:
        tensors = [torch.randint(-31, 32, s, generator=g).float() / 8 for s in shapes]
    else:
        tensors = [torch.randn(s, generator=g) for s in shapes]
    return [t.requires_grad_() for t in tensors]


def _run(name, operands, emulate):
    fn, _ = PRODUCTS[name]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if emulate:
            with Float32Bf16Products():
                out = fn(*operands)
        else:
            out = fn(*operands)
    grads = torch.autograd.grad(out.float().square().sum(), operands, allow_unused=True)
    return out, grads


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_products_equal_autocasts_bf16_products_where_every_sum_is_exact(name):
    operands = _operands(exact=True)
    native, native_grads = _run(name, operands, emulate=False)
    emulated, emulated_grads = _run(name, operands, emulate=True)
    assert emulated.dtype == native.dtype == torch.bfloat16
    assert torch.equal(emulated, native)
    for got, want in zip(emulated_grads, native_grads, strict=True):
        assert (got is None) == (want is None)
        if got is not None:  # float32 leaves, gradients rounded through bf16 as autocast's
            assert got.dtype == torch.float32 and torch.equal(got, want)


@pytest.mark.parametrize("name", ["bmm", "baddbmm", "linear"])
def test_products_round_their_operands_and_result_to_bf16_as_autocast_does(name):
    operands = _operands(exact=False)
    native, _ = _run(name, operands, emulate=False)
    emulated, grads = _run(name, operands, emulate=True)
    # the same arithmetic up to the order of the float32 sums: at most one bf16 step apart
    step = native.float().abs().clamp_min(1e-3) * 2.0 ** -7
    assert ((emulated.float() - native.float()).abs() <= step).all()
    assert (emulated == native).float().mean() > 0.9
    with torch.no_grad():  # float32 operands (not rounded first) give other bf16 results
        unrounded = PRODUCTS[name][0](*operands).bfloat16()
    assert not torch.equal(emulated, unrounded)
    assert all(torch.equal(g, g.bfloat16().float()) for g in grads if g is not None)


def test_other_functions_and_float64_products_pass_through():
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    x = torch.randn(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16), Float32Bf16Products():
        double = a @ b  # autocast leaves float64 alone, and so does the mode
        summed = torch.add(x, 1)
        plain = torch.mm(x, x.T)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = torch.mm(x, x.T)
    assert double.dtype == torch.float64 and torch.equal(double, a @ b)
    assert summed.dtype == torch.float32 and torch.equal(summed, x + 1)
    assert plain.dtype == torch.bfloat16 and (plain.float() - native.float()).abs().max() <= native.abs().max() / 64
    with Float32Bf16Products():  # without autocast nothing changes
        assert torch.equal(torch.mm(x, x.T), x @ x.T) and torch.mm(x, x.T).dtype == torch.float32


@pytest.mark.parametrize("native", [True, False])
def test_precision_context_computes_bf16_products_in_float32_only_without_native_bf16(monkeypatch, native):
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: native)
    with precision_context("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu")
        modes = [type(mode) for mode in _get_current_function_mode_stack()]
    assert (Float32Bf16Products in modes) != native
    with precision_context("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu") and not _get_current_function_mode_stack()
    assert not _get_current_function_mode_stack()  # left as found


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16", "float32-products"])
def test_bf16_resume_is_bit_identical_either_way_bf16_products_run(tmp_path, monkeypatch, native):
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: native)
    hp = tiny_params(agents={"_default": AGENT}, rl=dict(precision="bf16"))
    straight = make_trainer(hp, tmp_path / "a")
    straight.run_iterations(0, 3)
    first = make_trainer(hp, tmp_path / "b")
    first.run_iterations(0, 2)
    del first
    second = make_trainer(hp, tmp_path / "b")
    second.run_iterations(2, 3)
    a, b = params_of(straight), params_of(second)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert straight.run.metadata()["precision"]["used"] == "bf16"
