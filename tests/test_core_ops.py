"""Core ops: gradients against finite differences, closed forms, hand cases, extremes, bad input."""
import copy
import math
import re

import numpy as np
import pytest

from numpytfmr import (
    cross_entropy_backward, cross_entropy_forward, dropout_backward, dropout_forward,
    embedding_backward, embedding_forward, ffn_backward, ffn_forward, gelu_backward, gelu_forward,
    layernorm_backward, layernorm_forward, linear_backward, linear_forward, log_softmax_backward,
    log_softmax_forward, relu_backward, relu_forward, rmsnorm_backward, rmsnorm_forward,
    softmax_backward, softmax_forward,
)
from numpytfmr.activations import erf, erfc
from numpytfmr.registry import bind
from numpytfmr.registry.core import OPS

SPECS = {spec.name: spec for spec in OPS}
ALL_CASES = [(spec.name, i) for spec in OPS
             for i, _ in enumerate(spec.make_cases(np.random.default_rng(0), np.float64))]


def _case(name, i, dtype=np.float64, seed=0):
    return SPECS[name].make_cases(np.random.default_rng(seed), dtype)[i]


def _as_tuple(grads):
    return grads if isinstance(grads, tuple) else (grads,)


def test_every_core_op_is_registered():
    assert set(SPECS) == {"linear", "relu", "gelu", "softmax", "log_softmax", "cross_entropy",
                          "layernorm", "rmsnorm", "embedding", "dropout", "ffn", "silu",
                          "swiglu_ffn"}
    gelu_cases = SPECS["gelu"].make_cases(np.random.default_rng(0), np.float64)
    gelu_forms = {c.kwargs.get("approximate") for c in gelu_cases}
    assert gelu_forms == {"none", "tanh"}


# ----------------------------------------------------------------------------------------
# dtypes, purity: every case of every op (gradients: tests/test_registry.py)

@pytest.mark.parametrize("name,i", ALL_CASES)
def test_float32_in_float32_out(name, i):
    spec, case = SPECS[name], _case(name, i, np.float32)
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    assert np.asarray(out).dtype == np.float32
    dout = np.random.default_rng(5).standard_normal(np.shape(out)).astype(np.float32)
    grads = _as_tuple(spec.backward(dout, cache))
    assert len(grads) == len(case.args)
    for a, g in zip(case.args, grads):
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            assert g is not None and g.dtype == np.float32 and g.shape == a.shape
            assert np.all(np.isfinite(g))
        else:
            assert g is None  # absent optional inputs and integer ids take no gradient


@pytest.mark.parametrize("name,i", ALL_CASES)
def test_inputs_dout_and_cache_are_not_modified(name, i):
    spec, case = SPECS[name], _case(name, i)
    args = [a.copy() if isinstance(a, np.ndarray) else a for a in case.args]
    out, cache = bind(spec.forward, case.kwargs)(*args)
    for a, b in zip(args, case.args):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
    dout = np.random.default_rng(1).standard_normal(np.shape(out))
    dout_before, cache_before = dout.copy(), copy.deepcopy(cache)
    grads = _as_tuple(spec.backward(dout, cache))
    assert np.array_equal(dout, dout_before)
    for key, value in cache_before.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(cache[key], value, equal_nan=True), key
    for a, b in zip(args, case.args):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
    for g in grads:  # a gradient never aliases dout (a caller may add into it in place)
        assert g is None or not np.shares_memory(g, dout)


@pytest.mark.parametrize("name,i", ALL_CASES)
def test_outputs_and_gradients_are_finite_without_overflow(name, i):
    spec, case = SPECS[name], _case(name, i)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out, cache = bind(spec.forward, case.kwargs)(*case.args)
        grads = _as_tuple(spec.backward(np.ones(np.shape(out)), cache))
    assert np.all(np.isfinite(out))
    assert all(g is None or np.all(np.isfinite(g)) for g in grads)


# ----------------------------------------------------------------------------------------
# erf / erfc

def test_erf_matches_math_erf_on_a_dense_grid_with_tails():
    x = np.concatenate([np.linspace(-30.0, 30.0, 60001),
                        np.geomspace(1e-300, 30.0, 4001), -np.geomspace(1e-300, 30.0, 4001),
                        [0.0, 0.46875, 0.46875 + 1e-15, 4.0, 4.0 + 1e-14, 26.5, 1e300, -1e300]])
    ref = np.array([math.erf(v) for v in x])
    got = erf(x)
    nz = ref != 0
    assert np.max(np.abs(got[nz] - ref[nz]) / np.abs(ref[nz])) <= 1e-14
    assert np.all(got[~nz] == 0)


def test_erfc_has_relative_accuracy_in_the_tail():
    x = np.concatenate([np.linspace(-6.0, 26.5, 40001), [0.0, 0.46875, 4.0, 10.0, 20.0, 26.0]])
    ref = np.array([math.erfc(v) for v in x])
    got = erfc(x)
    assert np.max(np.abs(got - ref) / ref) <= 1e-14
    assert np.all(erfc(np.array([27.5, 40.0, 1e300])) == 0)
    assert np.all(erfc(np.array([-27.5, -1e300])) == 2)


def test_erf_float32_keeps_dtype_and_float32_accuracy():
    x = np.linspace(-6, 6, 2001).astype(np.float32)
    got = erf(x)
    assert got.dtype == np.float32
    ref = np.array([math.erf(float(v)) for v in x])
    assert np.max(np.abs(got - ref)) <= 1e-6


# ----------------------------------------------------------------------------------------
# ReLU and GELU

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


# ----------------------------------------------------------------------------------------
# softmax, log-softmax

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


# ----------------------------------------------------------------------------------------
# cross-entropy

def test_cross_entropy_equals_minus_log_p_on_a_hand_case():
    logits = np.log(np.array([[1.0, 2.0, 3.0], [4.0, 1.0, 1.0]]))  # p = [1,2,3]/6 and [4,1,1]/6
    loss, cache = cross_entropy_forward(logits, np.array([2, 0]))
    assert loss.shape == () and loss.dtype == np.float64
    assert float(loss) == pytest.approx(-(math.log(3 / 6) + math.log(4 / 6)) / 2, rel=1e-15)
    dz, none = cross_entropy_backward(1.0, cache)
    assert none is None
    np.testing.assert_allclose(dz, (np.array([[1, 2, 3], [4, 1, 1]]) / 6 - np.eye(3)[[2, 0]]) / 2,
                               rtol=1e-14, atol=1e-16)


def test_cross_entropy_is_the_mean_negative_log_likelihood_and_log_perplexity():
    # 003 eq. 2.1 prints L_CE = -E[P_theta(w_i | w_<i)]; the log is missing. Eq. 2.2 and
    # PPL = exp(L_CE) hold only with it: L_CE = -E[log P_theta].
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((2, 5, 7))
    t = rng.integers(0, 7, size=(2, 5))
    loss, _ = cross_entropy_forward(logits, t)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    p_t = np.take_along_axis(p, t[..., None], -1)[..., 0]
    assert float(loss) == pytest.approx(-np.mean(np.log(p_t)), rel=1e-14)
    assert math.exp(float(loss)) == pytest.approx(np.prod(p_t) ** (-1 / p_t.size), rel=1e-12)
    assert float(loss) != pytest.approx(-np.mean(p_t), rel=1e-3)  # the formula as printed


def test_label_smoothing_targets_on_a_hand_case():
    # K = 4, eps = 0.2, target 1: q' = (1 - eps) one_hot + eps / K = [0.05, 0.85, 0.05, 0.05] (003 §3.7)
    logits = np.array([[0.3, -1.2, 2.0, 0.1]])
    loss, cache = cross_entropy_forward(logits, np.array([1]), label_smoothing=0.2)
    q = np.array([0.05, 0.85, 0.05, 0.05])
    logp = logits[0] - np.log(np.sum(np.exp(logits[0])))
    assert float(loss) == pytest.approx(-np.sum(q * logp), rel=1e-14)
    dz, _ = cross_entropy_backward(1.0, cache)
    np.testing.assert_allclose(np.exp(logp) - dz[0], q, rtol=1e-14)  # dz = p - q'
    assert q.sum() == pytest.approx(1.0)  # 003 §3.7.1: q' is a distribution
    # eps = 1: the target is ignored, q' is uniform
    loss1, _ = cross_entropy_forward(logits, np.array([1]), label_smoothing=1.0)
    loss1b, _ = cross_entropy_forward(logits, np.array([3]), label_smoothing=1.0)
    assert float(loss1) == pytest.approx(-np.mean(logp), rel=1e-14) and float(loss1) == float(loss1b)


def test_ignore_index_excludes_positions():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((2, 4, 5))
    t = rng.integers(0, 5, size=(2, 4))
    t_ign = t.copy()
    t_ign[0, 1] = t_ign[1, 3] = -1
    keep = t_ign != -1
    for eps in (0.0, 0.3):
        loss, cache = cross_entropy_forward(logits, t_ign, ignore_index=-1, label_smoothing=eps)
        ref, ref_cache = cross_entropy_forward(logits[keep], t[keep], label_smoothing=eps)
        assert float(loss) == pytest.approx(float(ref), rel=1e-14)  # mean over the 6 kept only
        dz, _ = cross_entropy_backward(1.0, cache)
        dref, _ = cross_entropy_backward(1.0, ref_cache)
        assert np.all(dz[~keep] == 0)
        np.testing.assert_allclose(dz[keep], dref, rtol=1e-14)
    # an ignore_index inside [0, K) ignores that class's positions
    loss, _ = cross_entropy_forward(logits, t, ignore_index=int(t[0, 0]))
    m = t != t[0, 0]
    assert float(loss) == pytest.approx(float(cross_entropy_forward(logits[m], t[m])[0]), rel=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cross_entropy_all_positions_ignored_gives_zero(dtype):
    logits = np.random.default_rng(5).standard_normal((2, 3, 5)).astype(dtype)
    with np.errstate(all="raise"):
        loss, cache = cross_entropy_forward(logits, np.full((2, 3), -100), ignore_index=-100,
                                            label_smoothing=0.1)
        dz, _ = cross_entropy_backward(np.asarray(1.0, dtype), cache)
    assert loss.dtype == dtype and float(loss) == 0.0
    assert dz.dtype == dtype and np.all(dz == 0)


# ----------------------------------------------------------------------------------------
# LayerNorm, RMSNorm

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


# ----------------------------------------------------------------------------------------
# linear, embedding, FFN

def test_linear_hand_case_and_batch_axes_summed_in_dW():
    x = np.random.default_rng(10).standard_normal((2, 3, 4))
    W = np.random.default_rng(11).standard_normal((4, 5))
    b = np.arange(5.0)
    out, cache = linear_forward(x, W, b)
    loop = np.array([[[sum(x[i, j, k] * W[k, m] for k in range(4)) + b[m] for m in range(5)]
                      for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(out, loop, rtol=1e-13)
    dout = np.random.default_rng(12).standard_normal(out.shape)
    dx, dW, db = linear_backward(dout, cache)
    dW_loop = sum(np.outer(x[i, j], dout[i, j]) for i in range(2) for j in range(3))
    np.testing.assert_allclose(dW, dW_loop, rtol=1e-13)
    np.testing.assert_allclose(db, dout.sum((0, 1)), rtol=1e-13)
    np.testing.assert_allclose(dx, dout @ W.T, rtol=1e-13)
    assert linear_backward(dout, linear_forward(x, W)[1])[2] is None


def test_embedding_lookup_and_repeated_ids_accumulate():
    table = np.arange(12.0).reshape(4, 3)
    ids = np.array([[1, 3, 1], [1, 0, 3]])
    out, cache = embedding_forward(ids, table)
    np.testing.assert_array_equal(out, table[ids])
    none, dtable = embedding_backward(np.ones((2, 3, 3)), cache)
    assert none is None
    np.testing.assert_array_equal(dtable, [[1, 1, 1], [3, 3, 3], [0, 0, 0], [2, 2, 2]])
    out[0, 0, 0] = 99.0  # the output is a copy, not a view of the table
    assert table[1, 0] == 3.0


def test_ffn_is_linear_activation_linear():
    rng = np.random.default_rng(13)
    x, W1, b1 = rng.standard_normal((2, 3, 7)), rng.standard_normal((7, 11)), rng.standard_normal(11)
    W2, b2 = rng.standard_normal((11, 7)), rng.standard_normal(7)
    h = x @ W1 + b1
    acts = {"relu": np.maximum(h, 0), "gelu": gelu_forward(h)[0],
            "gelu_tanh": gelu_forward(h, approximate="tanh")[0]}
    for name, a in acts.items():
        out, cache = ffn_forward(x, W1, b1, W2, b2, activation=name)
        np.testing.assert_allclose(out, a @ W2 + b2, rtol=1e-13)
        grads = ffn_backward(np.ones_like(out), cache)
        assert len(grads) == 5 and all(g.shape == v.shape for g, v in zip(grads, (x, W1, b1, W2, b2)))
    _, cache = ffn_forward(x, W1, None, W2, None)
    grads = ffn_backward(np.ones((2, 3, 7)), cache)
    assert grads[2] is None and grads[4] is None


# ----------------------------------------------------------------------------------------
# dropout

def test_dropout_keeps_the_mean_and_drops_a_fraction_p():
    x = np.full((400, 500), 2.0)
    p = 0.3
    out, cache = dropout_forward(x, p=p, rng=np.random.default_rng(0))
    zeros = np.mean(out == 0)
    assert abs(zeros - p) < 0.005  # std of the fraction is sqrt(p(1-p)/2e5) = 0.001
    assert abs(out.mean() - 2.0) < 0.02  # inverted dropout: E[out] = x
    np.testing.assert_array_equal(out[out != 0], 2.0 / (1 - p))
    dx = dropout_backward(np.ones_like(x), cache)
    np.testing.assert_array_equal(dx == 0, out == 0)  # the same mask
    np.testing.assert_array_equal(dx[dx != 0], 1 / (1 - p))


def test_dropout_eval_mode_and_p_zero_are_identity():
    x = np.random.default_rng(1).standard_normal((3, 5))
    for kwargs in ({"p": 0.5, "train": False}, {"p": 0.0}):
        out, cache = dropout_forward(x, rng=np.random.default_rng(0), **kwargs)
        np.testing.assert_array_equal(out, x)
        assert out is not x
        dout = np.ones_like(x)
        np.testing.assert_array_equal(dropout_backward(dout, cache), dout)
    out, _ = dropout_forward(x, p=0.5, rng=None, train=False)
    np.testing.assert_array_equal(out, x)


def test_dropout_same_seed_same_mask_and_float32_same_mask():
    x = np.random.default_rng(2).standard_normal((4, 9))
    a, _ = dropout_forward(x, p=0.4, rng=np.random.default_rng(7))
    b, _ = dropout_forward(x, p=0.4, rng=np.random.default_rng(7))
    c, _ = dropout_forward(x, p=0.4, rng=np.random.default_rng(8))
    d, _ = dropout_forward(x.astype(np.float32), p=0.4, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a == 0, c == 0)
    np.testing.assert_array_equal(a == 0, d == 0)
    assert d.dtype == np.float32


# ----------------------------------------------------------------------------------------
# bad input

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 7))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: linear_forward(np.ones((2, 5)), np.ones((6, 3))), ValueError,
     r"linear_forward: W has shape \(6, 3\) but x has shape \(2, 5\); the axes d_in must match"),
    (lambda: linear_forward(X, np.ones((7, 3)), np.ones(4)), ValueError,
     r"b has shape \(4,\) but W has shape \(7, 3\); the axes d_out must match"),
    (lambda: linear_forward(X, np.ones(7)), ValueError, r"W has shape \(7,\)"),
    (lambda: linear_forward(np.ones((2, 7), dtype=int), np.ones((7, 3))), TypeError, r"linear_forward: x .*int"),
    (lambda: relu_forward(np.arange(3)), TypeError, r"relu_forward: x .*int"),
    (lambda: gelu_forward(X, approximate="fast"), ValueError, r"gelu_forward: approximate is 'fast'"),
    (lambda: gelu_forward(np.arange(3)), TypeError, r"gelu_forward: x"),
    (lambda: softmax_forward(X, axis=3), ValueError, r"softmax_forward: axis is 3"),
    (lambda: softmax_forward(X, axis=1.0), TypeError, r"softmax_forward: axis"),
    (lambda: log_softmax_forward(np.arange(3)), TypeError, r"log_softmax_forward: x"),
    (lambda: cross_entropy_forward(X, np.full((2, 3), 7)), ValueError,
     r"cross_entropy_forward: targets has values in \[7, 7\]; expected class ids in \[0, 7\)"),
    (lambda: cross_entropy_forward(X, np.full((2, 3), -1)), ValueError, r"targets has values in \[-1, -1\]"),
    (lambda: cross_entropy_forward(X, np.zeros((2, 3))), TypeError, r"targets has dtype float64"),
    (lambda: cross_entropy_forward(X, np.zeros((3, 2), dtype=int)), ValueError,
     r"targets has shape \(3, 2\) but logits has shape \(2, 3, 7\)"),
    (lambda: cross_entropy_forward(X, np.zeros((2, 3), dtype=int), label_smoothing=1.5), ValueError,
     r"label_smoothing is 1.5"),
    (lambda: cross_entropy_forward(X, np.zeros((2, 3), dtype=int), ignore_index=0.5), TypeError,
     r"ignore_index is 0.5"),
    (lambda: cross_entropy_forward(np.zeros((2, 3), dtype=int), np.zeros(2, dtype=int)), TypeError, r"logits"),
    (lambda: layernorm_forward(X, np.ones(6), None), ValueError,
     r"layernorm_forward: gamma has shape \(6,\) but x has shape \(2, 3, 7\); the axes d must match"),
    (lambda: layernorm_forward(X, None, np.ones((1, 7))), ValueError, r"beta has shape \(1, 7\)"),
    (lambda: layernorm_forward(X, None, None, eps=0.0), ValueError, r"eps is 0.0"),
    (lambda: layernorm_forward(np.ones((2, 7), dtype=np.int32), None, None), TypeError, r"x has dtype int32"),
    (lambda: rmsnorm_forward(X, np.ones(8)), ValueError, r"rmsnorm_forward: gamma has shape \(8,\)"),
    (lambda: embedding_forward(np.array([0, 5]), np.ones((5, 3))), ValueError,
     r"embedding_forward: ids has values in \[0, 5\]; expected values in \[0, 5\)"),
    (lambda: embedding_forward(np.array([-1, 2]), np.ones((5, 3))), ValueError, r"ids has values in \[-1, 2\]"),
    (lambda: embedding_forward(np.array([0.0, 1.0]), np.ones((5, 3))), TypeError,
     r"embedding_forward: ids has dtype float64; expected an integer array"),
    (lambda: embedding_forward(np.array([0, 1]), np.ones((5, 3), dtype=int)), TypeError, r"table"),
    (lambda: embedding_forward(np.array([0, 1]), np.ones(5)), ValueError, r"table has shape \(5,\)"),
    (lambda: dropout_forward(X, p=1.0, rng=np.random.default_rng(0)), ValueError,
     r"dropout_forward: p is 1.0; expected a value in \[0.0, 1.0\)"),
    (lambda: dropout_forward(X, p=-0.1, rng=np.random.default_rng(0)), ValueError, r"p is -0.1"),
    (lambda: dropout_forward(X, p=0.1, rng=np.random.RandomState(0)), TypeError, r"dropout_forward: rng"),
    (lambda: dropout_forward(X, p=0.1, rng=None), TypeError, r"rng"),
    (lambda: dropout_forward(np.arange(4), p=0.1, rng=np.random.default_rng(0)), TypeError, r"x"),
    (lambda: ffn_forward(X, np.ones((7, 5)), None, np.ones((4, 7)), None), ValueError,
     r"ffn_forward: W2 has shape \(4, 7\) but W1 has shape \(7, 5\)"),
    (lambda: ffn_forward(X, np.ones((6, 5)), None, np.ones((5, 7)), None), ValueError,
     r"ffn_forward: x has shape \(2, 3, 7\) but W1 has shape \(6, 5\)"),
    (lambda: ffn_forward(X, np.ones((7, 5)), np.ones(4), np.ones((5, 7)), None), ValueError, r"b1 has shape \(4,\)"),
    (lambda: ffn_forward(X, np.ones((7, 5)), None, np.ones((5, 7)), None, activation="swish"), ValueError,
     r"ffn_forward: activation is 'swish'; expected one of 'relu', 'gelu', 'gelu_tanh'"),
])
def test_bad_input_raises_with_the_argument_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ----------------------------------------------------------------------------------------
# the contract layer on the core ops: dout and cache checked, empty axes refused

@pytest.mark.parametrize("name", sorted(SPECS))
def test_dout_of_the_wrong_shape_is_refused_naming_dout(name):
    spec, case = SPECS[name], _case(name, 0)
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    bad = np.ones(np.shape(out) + (2,))
    with pytest.raises(ValueError, match=rf"^{name}_backward: dout has shape {re.escape(str(bad.shape))}; "
                                         rf"expected the forward output's shape"):
        spec.backward(bad, cache)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_cache_from_another_op_is_refused_naming_cache(name):
    spec, case = SPECS[name], _case(name, 0)
    out, _ = bind(spec.forward, case.kwargs)(*case.args)
    other = "relu" if name != "relu" else "silu"
    other_case = _case(other, 0)
    _, foreign = bind(SPECS[other].forward, other_case.kwargs)(*other_case.args)
    with pytest.raises(TypeError, match=rf"^{name}_backward: cache is the cache of {other}_forward; "
                                        rf"expected the cache returned by {name}_forward"):
        spec.backward(np.ones(np.shape(out)), foreign)
    with pytest.raises(TypeError, match=rf"^{name}_backward: cache is a dict"):
        spec.backward(np.ones(np.shape(out)), dict(foreign))


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
