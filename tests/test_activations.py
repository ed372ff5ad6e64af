"""numpytfmr/activations.py: ReLU, GELU (exact and tanh), SiLU, softmax and log-softmax:
hand cases, closed forms, extremes and float32. (erf and erfc: tests/test_special.py.)
"""
import math

import numpy as np
import pytest

from numpytfmr import (
    cross_entropy_backward, cross_entropy_forward, gelu_backward, gelu_forward,
    log_softmax_backward, log_softmax_forward, relu_backward, relu_forward,
    softmax_backward, softmax_forward,
)
from numpytfmr.special import erfc


def test_relu_hand_case_and_zero_gradient_at_the_kink():
    x = np.array([-2.0, -0.0, 0.0, 0.5, 3.0])
    out, cache = relu_forward(x)
    assert np.array_equal(out, [0, 0, 0, 0.5, 3.0])
    assert np.array_equal(relu_backward(np.full(5, 2.0), cache), [0, 0, 0, 2.0, 2.0])


def test_gelu_known_values():
    out, _ = gelu_forward(np.array([0.0, 1.0, -1.0, 2.0]))
    # x Phi(x) with Phi(1) = 0.8413447460685429, Phi(2) = 0.9772498680518208 (normal tables)
    assert out[0] == 0.0
    np.testing.assert_allclose(out[1:], [0.8413447460685429, -(1 - 0.8413447460685429),
                                         2 * 0.9772498680518208], rtol=1e-15)
    x = np.linspace(-8, 8, 1601)
    ref = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    out, _ = gelu_forward(x)
    # Phi(-8) amplifies the rounding of x/sqrt(2) by 2 (x^2/2) = 64, in ours and in the reference
    np.testing.assert_allclose(out, ref, rtol=3e-14, atol=0)


def test_gelu_tanh_closed_form_and_closeness_to_exact():
    x = np.linspace(-6, 6, 1201)
    c = math.sqrt(2 / math.pi)
    u = [c * (v + 0.044715 * v**3) for v in x]
    out, _ = gelu_forward(x, approximate="tanh")
    # GPT-2's formula x/2 (1 + tanh u); it cancels for negative x, so compare absolutely ...
    gpt2 = [0.5 * v * (1 + math.tanh(w)) for v, w in zip(x, u)]
    np.testing.assert_allclose(out, gpt2, rtol=1e-14, atol=1e-15)
    # ... and relatively against the identical x / (1 + exp(-2u)), which does not cancel
    np.testing.assert_allclose(out, [v / (1 + math.exp(-2 * w)) for v, w in zip(x, u)], rtol=1e-13)
    exact, _ = gelu_forward(x)
    assert np.max(np.abs(out - exact)) < 1e-3  # the tanh form is an approximation of x Phi(x)


@pytest.mark.parametrize("form", ["none", "tanh"])
def test_gelu_extremes_are_finite_without_warnings(form):
    x = np.array([-1e300, -1e10, -50.0, -40.0, -38.5, -30.0, 30.0, 50.0, 1e10, 1e300])
    with np.errstate(all="raise"):
        out, cache = gelu_forward(x, approximate=form)
        dx = gelu_backward(np.full(x.shape, 0.7), cache)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(dx))
    np.testing.assert_array_equal(out[-4:], x[-4:])  # gelu(x) = x for large x
    assert np.all(np.abs(out[:3]) <= 1e-300)
    np.testing.assert_array_equal(dx[-4:], 0.7)
    assert np.all(np.abs(dx[:3]) <= 1e-300)
    if form == "none":  # the exact form keeps relative precision in the tail: x Phi(x) at -30
        assert out[5] == pytest.approx(-30 * 0.5 * math.erfc(30 / math.sqrt(2)), rel=1e-13)


def test_gelu_float32_matches_float64():
    x = np.linspace(-10, 10, 2001)
    for form in ("none", "tanh"):
        o64, c64 = gelu_forward(x, approximate=form)
        o32, c32 = gelu_forward(x.astype(np.float32), approximate=form)
        assert o32.dtype == np.float32
        np.testing.assert_allclose(o32, o64, rtol=1e-5, atol=1e-6)
        g32 = gelu_backward(np.ones(x.shape, np.float32), c32)
        np.testing.assert_allclose(g32, gelu_backward(np.ones(x.shape), c64), rtol=1e-5, atol=1e-6)


def test_gelu_float32_is_accurate_to_float32_precision():
    """float32 GELU against the float64 one at the same points: relative error <= 1e-6 for
    |x| <= 4, and everywhere within 2^-20 plus the float32 rounding of x^2 in exp(-x^2/2)
    (x^2 2^-23) -- so the negative tail keeps its relative precision down to Phi(x) ~ 1e-36."""
    x32 = np.linspace(-14.0, 14.0, 400_001, dtype=np.float32)
    x = x32.astype(np.float64)
    out32, c32 = gelu_forward(x32)
    out64, c64 = gelu_forward(x)
    assert out32.dtype == np.float32
    normal = 0.5 * erfc(-x / math.sqrt(2)) > 2.0 ** -120   # Phi(x) far from float32 subnormals
    rel = np.abs(out32[normal] - out64[normal]) / np.maximum(np.abs(out64[normal]), 1e-300)
    assert np.max(rel[np.abs(x[normal]) <= 4]) <= 1e-6
    assert np.all(rel <= 2.0 ** -20 + x[normal] ** 2 * 2.0 ** -23)
    assert np.all(np.abs(out32[~normal]) <= 1e-35)
    # the derivative Phi + x phi, to the same precision (absolute: it crosses zero near -0.75)
    d32 = gelu_backward(np.ones_like(x32), c32)
    d64 = gelu_backward(np.ones_like(x), c64)
    assert d32.dtype == np.float32
    assert np.max(np.abs(d32 - d64)) <= 1e-6


def test_gelu_float32_elementwise_noncontiguous_input_and_extremes():
    """float32 GELU is elementwise: a long array of odd size gives the same values as its
    pieces one at a time; a transposed (non-contiguous) input keeps its shape; huge and
    tiny inputs give 0 or x without a warning."""
    rng = np.random.default_rng(3)
    x = (3 * rng.standard_normal(2 * 65536 + 7)).astype(np.float32)
    out, cache = gelu_forward(x)
    pieces = [gelu_forward(p)[0] for p in np.array_split(x, 7)]
    np.testing.assert_array_equal(out, np.concatenate(pieces))
    xt = x[:1200].reshape(30, 40).T
    out_t, _ = gelu_forward(xt)
    assert out_t.shape == (40, 30)
    np.testing.assert_array_equal(out_t, gelu_forward(np.ascontiguousarray(xt))[0])
    extremes = np.array([-3e38, -1e20, -50, -20, -0.0, 0.0, 1e-30, 20, 50, 1e20, 3e38], np.float32)
    with np.errstate(all="raise"):
        out, cache = gelu_forward(extremes)
        dx = gelu_backward(np.full(extremes.shape, 0.7, np.float32), cache)
    assert np.all(out[:4] == 0) and out[4] == 0 and out[5] == 0
    np.testing.assert_array_equal(out[-4:], extremes[-4:])   # gelu(x) = x for large x
    np.testing.assert_array_equal(dx[-4:], np.float32(0.7))
    assert np.all(dx[:4] == 0)


def test_softmax_hand_case_and_rows_sum_to_one_on_any_axis():
    out, _ = softmax_forward(np.log([[1.0, 2.0, 3.0]]))
    np.testing.assert_allclose(out, [[1 / 6, 2 / 6, 3 / 6]], rtol=1e-15)
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    for axis in (0, 1, 2, -1, -3):
        out, _ = softmax_forward(x, axis=axis)
        np.testing.assert_allclose(out.sum(axis=axis), 1.0, rtol=1e-15)
        assert np.all(out > 0)
        shifted, _ = softmax_forward(x + 100.0, axis=axis)  # shift invariance
        np.testing.assert_allclose(shifted, out, rtol=1e-12)
        logp, _ = log_softmax_forward(x, axis=axis)
        np.testing.assert_allclose(np.exp(logp), out, rtol=1e-14)


def test_softmax_gradient_sums_to_zero_along_the_axis():
    x = np.random.default_rng(1).standard_normal((4, 6))
    out, cache = softmax_forward(x, axis=0)
    dx = softmax_backward(np.random.default_rng(2).standard_normal(x.shape), cache)
    np.testing.assert_allclose(dx.sum(axis=0), 0, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_softmax_family_with_logits_of_1e4_is_finite_without_warnings(dtype):
    x = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], dtype=dtype)
    dout = np.array([[0.3, -1.0, 2.0], [1.0, 0.5, -0.5]], dtype=dtype)
    with np.errstate(all="raise"):
        p, cp = softmax_forward(x)
        logp, cl = log_softmax_forward(x)
        dp = softmax_backward(dout, cp)
        dl = log_softmax_backward(dout, cl)
        loss, cc = cross_entropy_forward(x, np.array([1, 2]), label_smoothing=0.1)
        dz, _ = cross_entropy_backward(np.asarray(1.0, dtype), cc)
    for a in (p, logp, dp, dl, loss, dz):
        assert a.dtype == dtype and np.all(np.isfinite(a))
    np.testing.assert_array_equal(p[0], [1, 0, 0])
    np.testing.assert_allclose(p[1], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(logp[0], [0, -2e4, -1e4], rtol=1e-7)
    # loss: row 0 target 1 -> 0.9 * 2e4 + 0.1/3 * 3e4; row 1 (uniform) -> log 3
    assert float(loss) == pytest.approx((0.9 * 2e4 + 0.1 / 3 * 3e4 + math.log(3)) / 2, rel=1e-6)


@pytest.mark.parametrize("forward", [softmax_forward, log_softmax_forward])
def test_softmax_over_an_empty_axis_is_refused(forward):
    with pytest.raises(ValueError, match=rf"{forward.__name__}: x has shape \(3, 0\), empty along axis"):
        forward(np.zeros((3, 0)))
    out, _ = forward(np.zeros((0, 4)))          # an empty batch is fine: nothing to normalize
    assert out.shape == (0, 4)
    with pytest.raises(ValueError, match=rf"{forward.__name__}: axis is -1 but x has shape \(\)"):
        forward(np.float64(1.0))


def test_gelu_float32_forward_and_gradient_are_float32_for_both_forms():
    x = np.linspace(-60, 60, 241, dtype=np.float32)
    for form in ("none", "tanh"):
        out, cache = gelu_forward(x, approximate=form)
        dx = gelu_backward(np.ones_like(x), cache)
        assert out.dtype == np.float32 and dx.dtype == np.float32
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(dx))
