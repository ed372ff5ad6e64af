"""numpytfmr/norms.py: LayerNorm and RMSNorm (004 eq. 27-28): statistics per token, hand
cases, constant rows, invariances of the gradients.
"""
import math

import numpy as np
import pytest

from numpytfmr import layernorm_backward, layernorm_forward, rmsnorm_backward, rmsnorm_forward


def test_layernorm_rows_have_mean_zero_and_variance_one():
    x = np.random.default_rng(6).standard_normal((2, 3, 7)) * 5 + 3
    out, _ = layernorm_forward(x, None, None, eps=1e-12)
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-14)
    np.testing.assert_allclose(out.var(-1), 1, rtol=1e-10)  # population variance (004 eq. 27)
    gamma, beta = np.arange(1.0, 8.0), np.linspace(-1, 1, 7)
    out2, _ = layernorm_forward(x, gamma, beta, eps=1e-12)
    np.testing.assert_allclose(out2, out * gamma + beta, rtol=1e-13)


def test_layernorm_hand_case():
    x = np.array([1.0, 2.0, 3.0, 4.0])  # mu = 2.5, population variance = 1.25
    out, _ = layernorm_forward(x, None, None, eps=1e-5)
    np.testing.assert_allclose(out, (x - 2.5) / math.sqrt(1.25 + 1e-5), rtol=1e-15)


def test_layernorm_statistics_are_per_token_not_across_tokens():
    # 004 ("Layer Norm" intro to the transformer) says LayerNorm "uses statistics across the
    # tokens within a single input sequence"; eq. 27 and "What constitutes a layer?" say the
    # statistics are per token, over its d features. Per token is right: changing one token
    # leaves every other token's output unchanged.
    x = np.random.default_rng(7).standard_normal((5, 7))
    out, _ = layernorm_forward(x, None, None)
    y = x.copy()
    y[2] = y[2] * 10 + 4
    out_y, _ = layernorm_forward(y, None, None)
    np.testing.assert_array_equal(np.delete(out_y, 2, axis=0), np.delete(out, 2, axis=0))
    across_tokens = (x - x.mean(0)) / x.std(0)
    assert not np.allclose(out, across_tokens)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layernorm_constant_row_is_finite(dtype):
    x = np.array([[2.5] * 7, [1e4] * 7], dtype=dtype)
    gamma = np.linspace(0.5, 2, 7).astype(dtype)
    beta = np.linspace(-1, 1, 7).astype(dtype)
    with np.errstate(all="raise"):
        out, cache = layernorm_forward(x, gamma, beta)
        dout = np.random.default_rng(8).standard_normal(x.shape).astype(dtype)
        dx, dg, db = layernorm_backward(dout, cache)
    # a constant row normalizes to 0, so the output is beta (float32: the mean of 1e4's rounds)
    atol = 1e-2 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, np.broadcast_to(beta, x.shape), atol=atol)
    for a in (dx, dg, db):
        assert np.all(np.isfinite(a)) and a.dtype == dtype


def test_norms_reject_an_empty_feature_axis():
    """d = 0 used to give NaN with a RuntimeWarning (0/0 means); now a ValueError naming x."""
    for fn, args in ((layernorm_forward, (None, None)), (rmsnorm_forward, (None,))):
        with pytest.raises(ValueError, match=r"x has shape \(3, 0\); expected d >= 1"):
            fn(np.zeros((3, 0)), *args)


def test_rmsnorm_hand_case_and_unit_rms():
    x = np.array([[3.0, 4.0]])
    out, _ = rmsnorm_forward(x, None, eps=1e-6)
    np.testing.assert_allclose(out, x / math.sqrt(12.5 + 1e-6), rtol=1e-15)
    x = np.random.default_rng(9).standard_normal((3, 7)) * 4
    out, _ = rmsnorm_forward(x, np.full(7, 2.0), eps=1e-14)
    np.testing.assert_allclose(np.sqrt(np.mean((out / 2) ** 2, -1)), 1, rtol=1e-12)


def test_norm_gradients_reflect_shift_and_scale_invariance():
    # LN(x + c) = LN(x) and LN(c x) = LN(x) (eps -> 0): dx is orthogonal to 1 and to x.
    # RMSNorm is only scale invariant: dx is orthogonal to x.
    rng = np.random.default_rng(14)
    x, dout = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    dx, _, _ = layernorm_backward(dout, layernorm_forward(x, rng.standard_normal(7), None, eps=1e-14)[1])
    np.testing.assert_allclose(dx.sum(-1), 0, atol=1e-13)
    np.testing.assert_allclose(np.sum(dx * x, -1), 0, atol=1e-12)
    dx, _ = rmsnorm_backward(dout, rmsnorm_forward(x, rng.standard_normal(7), eps=1e-14)[1])
    np.testing.assert_allclose(np.sum(dx * x, -1), 0, atol=1e-12)
    assert np.all(np.abs(dx.sum(-1)) > 1e-6)
