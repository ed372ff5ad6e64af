"""LoRA (000 §2.7): the adapted linear layer, its init, merging and parameter counts."""
import math

import numpy as np
import pytest

from numpytfmr.linear import linear_forward
from numpytfmr.lora import (
    lora_init,
    lora_linear_backward,
    lora_linear_forward,
    lora_merge,
    lora_parameter_count,
    lora_scale,
    lora_unmerge,
)
from numpytfmr.registry import bind, posttraining

SPEC = {s.name: s for s in posttraining.OPS}["lora_linear"]
CASES = SPEC.make_cases(np.random.default_rng(0), np.float64)


def _inputs(rng, lead=(2, 3), d_in=7, d_out=5, r=3, dtype=np.float64):
    x = rng.standard_normal(lead + (d_in,)).astype(dtype)
    W = rng.standard_normal((d_in, d_out)).astype(dtype)
    A = rng.standard_normal((d_in, r)).astype(dtype)
    B = rng.standard_normal((r, d_out)).astype(dtype)
    b = rng.standard_normal(d_out).astype(dtype)
    return x, W, A, B, b


def _branch_mask(cache):
    """The dropout mask of the LoRA branch as multiplied into x: kept / (1 - p)."""
    return cache["drop"]["mask"] * cache["drop"]["scale"]


# ---------------------------------------------------------------- gradients

# (finite differences of every registered case: tests/test_registry.py)

def test_registered_cases_have_a_nonzero_B():
    assert all(np.any(c.args[3] != 0) for c in CASES), \
        "B must be non-zero, or any formula for dA would pass the gradient check"


@pytest.mark.parametrize("bias", [True, False])
def test_frozen_weight_and_bias_get_no_gradient(bias):
    x, W, A, B, b = _inputs(np.random.default_rng(1))
    out, cache = lora_linear_forward(x, W, A, B, b if bias else None, alpha=4.0)
    grads = lora_linear_backward(np.ones_like(out), cache)
    assert len(grads) == 5
    assert grads[1] is None and grads[4] is None
    assert all(g is not None for g in (grads[0], grads[2], grads[3]))


def test_dA_is_zero_at_init_and_dB_is_not():
    # With B = 0, dA = s x^T dy B^T = 0: only B moves on the first step.
    rng = np.random.default_rng(2)
    x, W, _, _, b = _inputs(rng)
    A, B = lora_init(7, 5, 3, rng=rng)
    out, cache = lora_linear_forward(x, W, A, B, b, alpha=8.0)
    dx, _, dA, dB, _ = lora_linear_backward(rng.standard_normal(out.shape), cache)
    assert np.all(dA == 0)
    assert np.all(dB != 0)


def test_gradient_formulas_by_hand():
    # y = x W + s (x A) B  ->  dx = dy W^T + s dy B^T A^T, dA = s x^T dy B^T, dB = s (xA)^T dy
    rng = np.random.default_rng(3)
    x, W, A, B, _ = _inputs(rng, lead=(4,))
    dy = rng.standard_normal((4, 5))
    s = 6.0 / 3
    _, cache = lora_linear_forward(x, W, A, B, alpha=6.0)
    dx, _, dA, dB, _ = lora_linear_backward(dy, cache)
    np.testing.assert_allclose(dx, dy @ W.T + s * dy @ B.T @ A.T, rtol=1e-13)
    np.testing.assert_allclose(dA, s * x.T @ dy @ B.T, rtol=1e-13)
    np.testing.assert_allclose(dB, s * (x @ A).T @ dy, rtol=1e-13)


# ---------------------------------------------------------------- forward

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kw", [{}, {"rank_stabilized": True}, {"dropout": 0.4, "rng": 5}],
                         ids=["plain", "rslora", "dropout"])
def test_equals_base_layer_bitwise_at_init(dtype, bias, kw):
    rng = np.random.default_rng(4)
    x, W, _, _, b = _inputs(rng, lead=(2, 3), dtype=dtype)
    A, B = lora_init(7, 5, 3, rng=rng, dtype=dtype)
    b = b if bias else None
    out, _ = bind(lora_linear_forward, {**kw, "alpha": 16.0})(x, W, A, B, b)
    base = x @ W if b is None else x @ W + b
    assert out.dtype == dtype
    assert np.array_equal(out, base)                 # adding exact zeros: bit for bit


def test_forward_is_the_notes_formula():
    # h W' = h W + (alpha/r) h A B  (000 §2.7.2), plus the bias
    x, W, A, B, b = _inputs(np.random.default_rng(5))
    out, _ = lora_linear_forward(x, W, A, B, b, alpha=6.0)
    np.testing.assert_allclose(out, x @ (W + (6.0 / 3) * A @ B) + b, rtol=1e-12, atol=1e-12)


def test_rank_stabilized_scale():
    assert lora_scale(16, 4) == 4.0
    assert lora_scale(16, 4, rank_stabilized=True) == 8.0
    x, W, A, B, _ = _inputs(np.random.default_rng(6), r=4)
    base = x @ W
    out, _ = lora_linear_forward(x, W, A, B, alpha=16.0, rank_stabilized=True)
    np.testing.assert_allclose(out - base, 8.0 * (x @ A) @ B, rtol=1e-12, atol=1e-12)
    out, _ = lora_linear_forward(x, W, A, B, alpha=16.0)
    np.testing.assert_allclose(out - base, 4.0 * (x @ A) @ B, rtol=1e-12, atol=1e-12)


def test_merged_and_unmerged_layers_agree():
    x, W, A, B, b = _inputs(np.random.default_rng(7))
    for kw in ({}, {"rank_stabilized": True}):
        out, _ = lora_linear_forward(x, W, A, B, b, alpha=5.0, **kw)
        W_merged = lora_merge(W, A, B, alpha=5.0, **kw)
        np.testing.assert_allclose(x @ W_merged + b, out, rtol=0, atol=1e-12)
        W_back = lora_unmerge(W_merged, A, B, alpha=5.0, **kw)
        np.testing.assert_allclose(W_back, W, rtol=0, atol=1e-14)
        np.testing.assert_allclose(x @ W_back + b, x @ W + b, rtol=0, atol=1e-12)


def test_merge_does_not_modify_inputs():
    x, W, A, B, b = _inputs(np.random.default_rng(8))
    saved = [a.copy() for a in (x, W, A, B, b)]
    W2 = lora_merge(W, A, B, alpha=2.0)
    lora_unmerge(W2, A, B, alpha=2.0)
    out, cache = lora_linear_forward(x, W, A, B, b, alpha=2.0, dropout=0.5,
                                     rng=np.random.default_rng(0))
    dout = np.ones_like(out)
    lora_linear_backward(dout, cache)
    assert np.all(dout == 1)
    for a, s in zip((x, W, A, B, b), saved):
        assert np.array_equal(a, s)


def test_dropout_acts_on_the_branch_only():
    p = 0.5
    x, W, A, B, b = _inputs(np.random.default_rng(9), lead=(40, 3))
    out, cache = lora_linear_forward(x, W, A, B, b, alpha=3.0, dropout=p,
                                     rng=np.random.default_rng(1))
    mask = _branch_mask(cache)
    assert set(np.unique(mask)) == {0.0, 1.0 / (1 - p)}   # inverted dropout
    assert 0.4 < np.mean(mask == 0) < 0.6
    # the frozen part is the undropped x W + b; only the branch sees the mask
    branch = (3.0 / 3) * ((x * mask) @ A) @ B
    np.testing.assert_allclose(out, x @ W + b + branch, rtol=1e-12, atol=1e-12)
    # the same seed gives the same mask; another seed another one
    out2, _ = lora_linear_forward(x, W, A, B, b, alpha=3.0, dropout=p,
                                  rng=np.random.default_rng(1))
    out3, _ = lora_linear_forward(x, W, A, B, b, alpha=3.0, dropout=p,
                                  rng=np.random.default_rng(2))
    assert np.array_equal(out, out2) and not np.allclose(out, out3)
    # backward: the frozen path's dx is undropped, the branch's is masked
    dy = np.random.default_rng(3).standard_normal(out.shape)
    dx = lora_linear_backward(dy, cache)[0]
    np.testing.assert_allclose(dx - dy @ W.T, (dy @ B.T @ A.T) * mask, rtol=1e-12, atol=1e-12)


def test_dropout_off_when_not_training():
    x, W, A, B, b = _inputs(np.random.default_rng(10))
    ref, _ = lora_linear_forward(x, W, A, B, b, alpha=2.0)
    out, cache = lora_linear_forward(x, W, A, B, b, alpha=2.0, dropout=0.9, train=False)
    assert np.array_equal(out, ref) and cache["drop"]["mask"] is None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_float32_in_float32_out(case):
    args32 = tuple(a.astype(np.float32) if a is not None else None for a in case.args)
    out, cache = bind(SPEC.forward, case.kwargs)(*args32)
    assert out.dtype == np.float32
    grads = SPEC.backward(np.ones_like(out), cache)
    assert all(g.dtype == np.float32 for g in grads if g is not None)


# ---------------------------------------------------------------- init and counts

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_init_kaiming_uniform(dtype):
    A, B = lora_init(400, 30, 8, rng=np.random.default_rng(0), dtype=dtype)
    assert A.shape == (400, 8) and B.shape == (8, 30)
    assert A.dtype == dtype and B.dtype == dtype
    assert np.all(B == 0)
    bound = 1 / math.sqrt(400)                       # kaiming_uniform_(a=sqrt(5)): 1/sqrt(fan_in)
    assert np.max(np.abs(A)) <= bound
    assert np.max(np.abs(A)) > 0.98 * bound
    # U(-c, c) has standard deviation c / sqrt(3)
    assert abs(np.std(A) - bound / math.sqrt(3)) < 0.05 * bound


def test_init_gaussian_and_seeding():
    A, B = lora_init(2000, 10, 4, rng=np.random.default_rng(0), init="gaussian")
    assert abs(np.std(A) - 1 / 4) < 0.01 and abs(np.mean(A)) < 0.01 and np.all(B == 0)
    A1, _ = lora_init(7, 5, 3, rng=np.random.default_rng(42))
    A2, _ = lora_init(7, 5, 3, rng=np.random.default_rng(42))
    assert np.array_equal(A1, A2)


def test_parameter_count_formula():
    # 000 §2.7.2: d x r (from A) + r x k (from B), against d x k for full fine-tuning
    for d, k, r in ((7, 5, 3), (4096, 4096, 8), (768, 3072, 16)):
        c = lora_parameter_count(d, k, r)
        assert c["lora"] == d * r + r * k
        assert c["full"] == d * k
        assert c["fraction"] == pytest.approx((d * r + r * k) / (d * k))
    A, B = lora_init(7, 5, 3, rng=np.random.default_rng(0))
    assert A.size + B.size == lora_parameter_count(7, 5, 3)["lora"]
    c = lora_parameter_count(4096, 4096, 8)
    assert (c["lora"], c["full"], c["fraction"]) == (65_536, 16_777_216, 1 / 256)


def test_parameter_count_gpt3_budget_from_the_lora_paper():
    # Hu et al. (2021) §7.1: an 18M-parameter budget on GPT-3 175B (d_model 12288, 96 layers)
    # is r = 8 on one attention weight type, or r = 4 on two types.
    one_type = 96 * lora_parameter_count(12288, 12288, 8)["lora"]
    two_types = 2 * 96 * lora_parameter_count(12288, 12288, 4)["lora"]
    assert one_type == two_types == 18_874_368
    assert 18e6 <= one_type < 19e6


# ---------------------------------------------------------------- bad input

def _bad(**over):
    x, W, A, B, b = _inputs(np.random.default_rng(11))
    args = {"x": x, "W": W, "A": A, "B": B, "b": b}
    kw = {"alpha": 2.0}
    for k, val in over.items():
        (args if k in args else kw)[k] = val
    return lambda: lora_linear_forward(args["x"], args["W"], args["A"], args["B"], args["b"], **kw)


@pytest.mark.parametrize("over, exc, words", [
    ({"A": np.ones((6, 3))}, ValueError, "A has shape (6, 3)"),
    ({"B": np.ones((3, 4))}, ValueError, "B has shape (3, 4)"),
    ({"B": np.ones((2, 5))}, ValueError, "B has shape (2, 5)"),
    ({"A": np.ones((7, 0)), "B": np.ones((0, 5))}, ValueError, "A has shape (7, 0); expected r >= 1"),
    ({"x": np.ones((2, 6))}, ValueError, "x has shape (2, 6)"),
    ({"b": np.ones(4)}, ValueError, "b has shape (4,)"),
    ({"W": np.ones((7, 5, 1))}, ValueError, "W has shape"),
    ({"x": np.ones((2, 7), dtype=int)}, TypeError, "x has dtype int"),
    ({"alpha": 0.0}, ValueError, "alpha"),
    ({"alpha": -1.0}, ValueError, "alpha"),
    ({"alpha": "8"}, TypeError, "alpha"),
    ({"dropout": 1.0}, ValueError, "dropout"),
    ({"dropout": -0.1}, ValueError, "dropout"),
    ({"dropout": 0.1}, TypeError, "rng"),
])
def test_bad_input(over, exc, words):
    with pytest.raises(exc) as info:
        _bad(**over)()
    msg = str(info.value)
    assert msg.startswith("lora_linear_forward: ") and words in msg, msg


def test_bad_input_helpers():
    W, A, B = np.ones((7, 5)), np.ones((7, 3)), np.ones((3, 5))
    with pytest.raises(ValueError, match=r"^lora_merge: B has shape"):
        lora_merge(W, A, np.ones((3, 4)), alpha=1.0)
    with pytest.raises(ValueError, match=r"^lora_unmerge: A has shape .* W_merged"):
        lora_unmerge(W, np.ones((6, 3)), B, alpha=1.0)
    with pytest.raises(ValueError, match=r"^lora_merge: alpha"):
        lora_merge(W, A, B, alpha=0)
    with pytest.raises(ValueError, match=r"^lora_parameter_count: r"):
        lora_parameter_count(7, 5, 0)
    with pytest.raises(TypeError, match=r"^lora_init: rng"):
        lora_init(7, 5, 3, rng=None)
    with pytest.raises(TypeError, match=r"^lora_init: dtype"):
        lora_init(7, 5, 3, rng=np.random.default_rng(0), dtype=np.int64)
    with pytest.raises(ValueError, match=r"^lora_init: init"):
        lora_init(7, 5, 3, rng=np.random.default_rng(0), init="zeros")
    with pytest.raises(ValueError, match=r"^lora_linear_backward: dout has shape"):
        _, cache = lora_linear_forward(np.ones((2, 7)), W, A, B, alpha=1.0)
        lora_linear_backward(np.ones((2, 4)), cache)


# ---------------------------------------------------------------- the contract layer

def test_backward_refuses_a_foreign_cache():
    x, W, A, B, b = _inputs(np.random.default_rng(12))
    out, _ = lora_linear_forward(x, W, A, B, b, alpha=2.0)
    _, foreign = linear_forward(x, W, b)
    with pytest.raises(TypeError, match=r"^lora_linear_backward: cache is the cache of linear_forward"):
        lora_linear_backward(np.ones_like(out), foreign)
