"""Memory-efficient attention: flash attention, sliding-window attention, linear attention.

Flash attention must equal attention_forward (forward and gradients, 1e-12 in float64) for
every shape, block size, mask and bias, and must use far less memory (measured with
tracemalloc, which sees NumPy's allocations; nothing is timed). Sliding-window attention
must equal attention_forward with sliding_window_mask (1e-12) without any n x n array.
Linear attention is checked against its quadratic form, a per-position loop and PyTorch
autograd, for any chunk size. Every RuntimeWarning is an error in this file: a fully
masked row must not even warn.
"""
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from numpytfmr.attention import attention_backward, attention_forward, causal_mask, padding_mask
from numpytfmr.efficient import (
    flash_attention_backward, flash_attention_forward, linear_attention_backward,
    linear_attention_forward, sliding_window_attention_backward,
    sliding_window_attention_forward, sliding_window_mask,
)
from numpytfmr.registry.efficient import OPS

# NumPy's overflow / invalid-value / divide warnings are RuntimeWarnings. (Not every warning:
# on a failure Hypothesis' report imports a module that emits a DeprecationWarning, which
# would otherwise turn a clear failure report into an internal error.)
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

FLASH, SLIDING, LINEAR = OPS


def _phi(x):
    """elu(x) + 1, written out independently of the module."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def assert_close(a, b, tol=1e-12):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _flash_vs_standard(Q, K, V, dout, block_size, **kwargs):
    """Assert flash attention equals attention_forward/backward, forward and gradients."""
    out, cache = attention_forward(Q, K, V, **kwargs)
    f_out, f_cache = flash_attention_forward(Q, K, V, block_size=block_size, **kwargs)
    assert f_out.shape == out.shape and f_out.dtype == out.dtype
    assert_close(f_out, out)
    for g_f, g, name in zip(flash_attention_backward(dout, f_cache),
                            attention_backward(dout, cache), "QKV"):
        assert g_f.shape == g.shape, name
        assert_close(g_f, g)
    return f_out, f_cache


# ---------------------------------------------------------------------------------------
# the standard attention, every registered case (their finite differences run in
# tests/test_registry.py)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("i,case", list(enumerate(FLASH.make_cases(np.random.default_rng(1),
                                                                    np.float64))),
                         ids=lambda x: x.label if hasattr(x, "label") else str(x))
def test_flash_registered_case_equals_attention(i, case):
    Q, K, V = case.args
    kwargs = dict(case.kwargs)
    block_size = kwargs.pop("block_size", 128)
    out, _ = attention_forward(Q, K, V, **kwargs)
    dout = np.random.default_rng(i).standard_normal(out.shape)
    _flash_vs_standard(Q, K, V, dout, block_size, **kwargs)


def test_registry_covers_every_requested_case():
    labels = {spec.name: " | ".join(c.label for c in spec.make_cases(np.random.default_rng(0),
                                                                     np.float64)) for spec in OPS}
    for word in ("plain", "causal", "padding mask", "fully masked", "-inf bias", "distance bias",
                 "n_q=2 != n_k=5", "block 3 (n=7 not divisible)", "d_k=6 != d_v=3",
                 "leading axes", "sliding window"):
        assert word in labels["flash_attention"], word
    for word in ("non-causal", "causal (2, 6, 5)", "leading axes", "n_q=2 < n_k=5", "(2, 5, 7)",
                 "chunks of 3 (n=7 not divisible)", "a state before the first query"):
        assert word in labels["linear_attention"], word
    for word in ("window 2, block 3", "window 3 > block 2", "non-causal", "n_q=3 < n_k=7",
                 "leading axes", "window 0", "window >= n"):
        assert word in labels["sliding_window_attention"], word


# ---------------------------------------------------------------------------------------
# flash attention == standard attention, many shapes
# ---------------------------------------------------------------------------------------

@st.composite
def _flash_problems(draw):
    lead_q, lead_kv = draw(st.sampled_from([((), ()), ((2,), (2,)), ((2, 3), (2, 1)),
                                            ((1, 2), (3, 1)), ((3,), ())]))
    n_q, n_k = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    d_k, d_v = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    block_size = draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    Q = rng.standard_normal(lead_q + (n_q, d_k))
    K = rng.standard_normal(lead_kv + (n_k, d_k))
    V = rng.standard_normal(lead_kv + (n_k, d_v))
    batch = np.broadcast_shapes(lead_q, lead_kv)
    kwargs = {}
    kind = draw(st.sampled_from(["none", "causal", "window", "random", "padding"]))
    if kind in ("causal", "window") and n_k < n_q:
        kind = "random"
    if kind == "causal":
        kwargs["mask"] = causal_mask(n_q, n_k)
    elif kind == "window":
        kwargs["mask"] = sliding_window_mask(n_q, n_k, window=draw(st.integers(0, 4)),
                                             causal=draw(st.booleans()))
    elif kind == "random":
        mask = rng.random(batch + (n_q, n_k)) < 0.6
        mask[..., rng.integers(n_q), :] = False          # at least one fully masked row
        kwargs["mask"] = mask
    elif kind == "padding" and batch:
        kwargs["mask"] = padding_mask(rng.integers(0, n_k + 1, size=batch), n_k)
    bias_kind = draw(st.sampled_from(["none", "finite", "neg_inf"]))
    if bias_kind == "finite":
        kwargs["bias"] = rng.standard_normal((n_q, n_k))
    elif bias_kind == "neg_inf":
        kwargs["bias"] = np.where(rng.random((1, n_k)) < 0.3, -np.inf, 0.0)
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.floats(0.1, 3.0))
    return Q, K, V, block_size, kwargs


@settings(max_examples=150, deadline=None)
@given(_flash_problems())
def test_flash_equals_attention_for_any_shape_block_and_mask(problem):
    Q, K, V, block_size, kwargs = problem
    out, _ = attention_forward(Q, K, V, **kwargs)
    dout = np.random.default_rng(0).standard_normal(out.shape)
    _flash_vs_standard(Q, K, V, dout, block_size, **kwargs)


@pytest.mark.parametrize("block_size", [1, 2, 3, 5, 8, 13, 64])
def test_flash_equals_attention_multi_head_causal(block_size):
    rng = np.random.default_rng(block_size)
    Q, K, V = (rng.standard_normal((2, 3, 13, 4)) for _ in range(3))
    dout = rng.standard_normal((2, 3, 13, 4))
    _flash_vs_standard(Q, K, V, dout, block_size, mask=causal_mask(13))


def test_flash_large_scores_stay_finite_and_exact():
    """Scores of +-1e3 across tiles: the running maximum keeps every exp() <= 1."""
    rng = np.random.default_rng(3)
    Q = 40.0 * rng.standard_normal((2, 9, 8))
    K = 40.0 * rng.standard_normal((2, 9, 8))
    V = rng.standard_normal((2, 9, 3))
    out, cache = flash_attention_forward(Q, K, V, block_size=2)
    assert np.isfinite(out).all() and np.isfinite(cache["lse"]).all()
    ref, _ = attention_forward(Q, K, V)
    assert_close(out, ref, 1e-10)


def test_flash_lse_is_the_row_log_sum_exp():
    """weights = exp(S - L): the stored L reproduces attention_forward's weights."""
    rng = np.random.default_rng(4)
    Q, K, V = (rng.standard_normal(s) for s in ((3, 6, 4), (3, 7, 4), (3, 7, 2)))
    mask = causal_mask(6, 7)
    _, cache = flash_attention_forward(Q, K, V, mask=mask, block_size=3)
    _, ref = attention_forward(Q, K, V, mask=mask)
    S = np.where(mask, Q @ np.swapaxes(K, -1, -2) / 2.0, -np.inf)
    assert_close(np.exp(S - cache["lse"]), ref["weights"])
    assert "weights" not in cache


def test_flash_fully_masked_rows_give_zero_output_and_gradients():
    rng = np.random.default_rng(5)
    Q, K, V = (rng.standard_normal((2, 5, 3)) for _ in range(3))
    mask = causal_mask(5).copy()
    mask[[1, 4]] = False
    out, cache = flash_attention_forward(Q, K, V, mask=mask, block_size=2)
    assert np.all(out[:, [1, 4]] == 0.0) and np.isfinite(out).all()
    assert np.all(np.isneginf(cache["lse"][:, [1, 4]]))
    dQ, dK, dV = flash_attention_backward(rng.standard_normal(out.shape), cache)
    assert np.all(dQ[:, [1, 4]] == 0.0)
    assert all(np.isfinite(g).all() for g in (dQ, dK, dV))
    # every query fully masked (a padding length of 0): all zeros, still no NaN
    out, cache = flash_attention_forward(Q, K, V, mask=np.zeros((5, 5), bool), block_size=2)
    assert np.all(out == 0.0)
    assert all(np.all(g == 0.0) for g in flash_attention_backward(np.ones_like(out), cache))
    # the same through a bias of -inf (the notes' M) instead of a mask
    out, cache = flash_attention_forward(Q, K, V, bias=np.where(mask, 0.0, -np.inf), block_size=3)
    assert np.all(out[:, [1, 4]] == 0.0)
    assert all(np.isfinite(g).all() for g in flash_attention_backward(np.ones_like(out), cache))


def test_flash_tiles_a_band_mask_rules_out_leave_the_result_exact():
    """A band mask at block 2 rules out whole tiles (every score -inf); the result is still exact."""
    rng = np.random.default_rng(6)
    Q, K, V = (rng.standard_normal((2, 16, 4)) for _ in range(3))
    mask = sliding_window_mask(16, window=3)
    _flash_vs_standard(Q, K, V, rng.standard_normal((2, 16, 4)), 2, mask=mask)


def test_flash_cache_holds_no_n_by_n_array():
    n, d = 96, 4
    rng = np.random.default_rng(7)
    Q, K, V = (rng.standard_normal((2, n, d)) for _ in range(3))
    _, cache = flash_attention_forward(Q, K, V, mask=causal_mask(n), block_size=16)
    arrays = [a for k, a in cache.items() if isinstance(a, np.ndarray) and k != "mask"]
    assert max(a.size for a in arrays) <= 2 * n * d < n * n
    assert set(cache) >= {"Q", "K", "V", "out", "lse"}


def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_flash_peak_memory_is_a_fraction_of_standard_attention():
    """Forward + backward at n = 1024, d = 16: the standard op holds several n x n arrays
    (8 MB each in float64); flash holds only 128 x 128 tiles. Deterministic, not timed."""
    n, d = 1024, 16
    rng = np.random.default_rng(8)
    Q, K, V, dout = (rng.standard_normal((n, d)) for _ in range(4))

    def standard():
        _, cache = attention_forward(Q, K, V)
        attention_backward(dout, cache)

    def flash():
        _, cache = flash_attention_forward(Q, K, V)
        flash_attention_backward(dout, cache)

    peak_standard, peak_flash = _peak_bytes(standard), _peak_bytes(flash)
    assert peak_standard >= n * n * 8                  # at least one n x n float64 array
    assert peak_flash < peak_standard / 4, (peak_flash, peak_standard)
    assert peak_flash < n * n * 8 / 4                  # less than a quarter of ONE n x n array


def test_flash_float32_stays_float32():
    rng = np.random.default_rng(9)
    Q, K, V = (rng.standard_normal((2, 5, 3)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((5, 5))                 # float64 bias must not upcast
    out, cache = flash_attention_forward(Q, K, V, bias=bias, mask=causal_mask(5), block_size=2)
    assert out.dtype == np.float32 and cache["lse"].dtype == np.float32
    grads = flash_attention_backward(np.ones((2, 5, 3)), cache)  # float64 dout: cast
    assert all(g.dtype == np.float32 for g in grads)
    ref, _ = attention_forward(Q, K, V, bias=bias, mask=causal_mask(5))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_flash_does_not_modify_its_inputs():
    rng = np.random.default_rng(10)
    Q, K, V = (rng.standard_normal((2, 4, 3)) for _ in range(3))
    bias, mask = rng.standard_normal((4, 4)), causal_mask(4)
    copies = [a.copy() for a in (Q, K, V, bias, mask)]
    out, cache = flash_attention_forward(Q, K, V, bias=bias, mask=mask, block_size=3)
    dout = rng.standard_normal(out.shape)
    d_copy, out_copy, lse_copy = dout.copy(), out.copy(), cache["lse"].copy()
    flash_attention_backward(dout, cache)
    for a, c in zip((Q, K, V, bias, mask, dout, cache["out"], cache["lse"]),
                    copies + [d_copy, out_copy, lse_copy]):
        assert np.array_equal(a, c)


@pytest.mark.parametrize("kwargs,args,exc,words", [
    ({"block_size": 0}, None, ValueError, "block_size is 0"),
    ({"block_size": 2.5}, None, TypeError, "block_size"),
    ({"mask": np.ones((4, 4))}, None, TypeError, "mask has dtype float64"),
    ({"mask": np.ones((3, 4), bool)}, None, ValueError, "mask has shape (3, 4)"),
    ({"bias": np.zeros((5, 4))}, None, ValueError, "bias has shape (5, 4)"),
    ({"bias": np.full((4, 4), np.nan)}, None, ValueError, "bias contains NaN"),
    ({"scale": "big"}, None, TypeError, "scale"),
    ({}, ((2, 4, 3), (2, 4, 5), (2, 4, 3)), ValueError, "the axes d_k must match"),
    ({}, ((2, 4, 3), (2, 4, 3), (2, 5, 3)), ValueError, "V has shape (2, 5, 3)"),
    ({}, ((2, 4, 3), (3, 4, 3), (3, 4, 3)), ValueError, "do not broadcast"),
    ({}, ((4,), (4, 3), (4, 3)), ValueError, "Q has shape (4,)"),
])
def test_flash_bad_input_is_refused_with_a_clear_message(kwargs, args, exc, words):
    shapes = args or ((2, 4, 3), (2, 4, 3), (2, 4, 3))
    arrays = [np.zeros(s) for s in shapes]
    with pytest.raises(exc) as info:
        flash_attention_forward(*arrays, **kwargs)
    assert str(info.value).startswith("flash_attention_forward:")
    assert words in str(info.value)


def test_flash_refuses_integer_inputs_and_a_wrong_dout():
    with pytest.raises(TypeError, match="^flash_attention_forward: Q"):
        flash_attention_forward(np.ones((3, 2), int), np.ones((3, 2)), np.ones((3, 2)))
    out, cache = flash_attention_forward(np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="^flash_attention_backward: dout has shape"):
        flash_attention_backward(np.ones((2, 2)), cache)


def test_backwards_refuse_the_cache_of_the_other_attention():
    """flash and standard attention both cache Q, K, V: each backward still takes only its own."""
    Q = K = V = np.eye(3)
    dout = np.ones((3, 3))
    _, flash_cache = flash_attention_forward(Q, K, V)
    _, std_cache = attention_forward(Q, K, V)
    _, lin_cache = linear_attention_forward(Q, K, V)
    with pytest.raises(TypeError, match="^attention_backward: cache is the cache of "
                                        "flash_attention_forward; expected the cache returned by "
                                        "attention_forward"):
        attention_backward(dout, flash_cache)
    with pytest.raises(TypeError, match="^flash_attention_backward: cache is the cache of "
                                        "attention_forward"):
        flash_attention_backward(dout, std_cache)
    with pytest.raises(TypeError, match="^linear_attention_backward: cache is a dict"):
        linear_attention_backward(dout, dict(lin_cache))
    with pytest.raises(ValueError, match=r"^linear_attention_backward: dout has shape \(3, 2\); "
                                         r"expected the forward output's shape \(3, 3\)"):
        linear_attention_backward(np.ones((3, 2)), lin_cache)


# ---------------------------------------------------------------------------------------
# sliding-window mask
# ---------------------------------------------------------------------------------------

def test_sliding_window_mask_is_the_band_written_out():
    expected = np.array([[1, 0, 0, 0, 0],
                         [1, 1, 0, 0, 0],
                         [1, 1, 1, 0, 0],
                         [0, 1, 1, 1, 0],
                         [0, 0, 1, 1, 1]], bool)
    assert np.array_equal(sliding_window_mask(5, window=2), expected)
    symmetric = np.array([[1, 1, 0, 0],
                          [1, 1, 1, 0],
                          [0, 1, 1, 1],
                          [0, 0, 1, 1]], bool)
    assert np.array_equal(sliding_window_mask(4, window=1, causal=False), symmetric)
    assert np.array_equal(sliding_window_mask(4, window=0), np.eye(4, dtype=bool))


@pytest.mark.parametrize("n_q,n_k,window", [(1, 1, 0), (3, 3, 1), (4, 9, 2), (6, 6, 5), (2, 7, 0)])
def test_sliding_window_mask_properties(n_q, n_k, window):
    m = sliding_window_mask(n_q, n_k, window=window)
    i, j = np.nonzero(np.ones((n_q, n_k)))
    p = n_k - n_q + i
    assert np.array_equal(m[i, j], (p - window <= j) & (j <= p))
    assert np.array_equal(m, sliding_window_mask(n_k, window=window)[n_k - n_q:])  # cached step
    assert np.all(m.sum(-1) <= window + 1) and not np.any(m & ~causal_mask(n_q, n_k))
    assert np.array_equal(sliding_window_mask(n_q, n_k, window=n_k), causal_mask(n_q, n_k))
    full = sliding_window_mask(n_k, window=window, causal=False)
    assert np.array_equal(full, full.T)


def test_sliding_window_attention_sees_only_the_window():
    """Changing a value outside the window leaves the output unchanged."""
    rng = np.random.default_rng(11)
    Q, K, V = (rng.standard_normal((8, 3)) for _ in range(3))
    mask = sliding_window_mask(8, window=2)
    out, _ = flash_attention_forward(Q, K, V, mask=mask, block_size=3)
    V2 = V.copy()
    V2[0] += 10.0                                    # key 0 is outside the window of queries >= 3
    out2, _ = flash_attention_forward(Q, K, V2, mask=mask, block_size=3)
    assert np.array_equal(out[3:], out2[3:]) and not np.allclose(out[:3], out2[:3])


@pytest.mark.parametrize("args,kwargs,exc,words", [
    ((4,), {"window": -1}, ValueError, "window is -1"),
    ((4,), {"window": 1.5}, TypeError, "window"),
    ((4,), {"window": True}, TypeError, "window"),
    ((4, 3), {"window": 1}, ValueError, "n_k is 3 but n_q is 4"),
    ((0,), {"window": 1}, ValueError, "n_q is 0"),
    ((4,), {"window": 1, "causal": "yes"}, TypeError, "causal"),
])
def test_sliding_window_mask_bad_input(args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        sliding_window_mask(*args, **kwargs)
    assert str(info.value).startswith("sliding_window_mask:") and words in str(info.value)


def test_sliding_window_mask_needs_window():
    with pytest.raises(TypeError):
        sliding_window_mask(4)


# ---------------------------------------------------------------------------------------
# sliding-window attention, band by band
# ---------------------------------------------------------------------------------------

def _sliding_vs_standard(Q, K, V, dout, *, window, causal=True, scale=None, block_size=128):
    """Assert sliding_window_attention equals attention_forward with the dense band mask."""
    n_q, n_k = Q.shape[-2], K.shape[-2]
    mask = sliding_window_mask(n_q, n_k, window=window, causal=causal)
    out, cache = attention_forward(Q, K, V, mask=mask, scale=scale)
    s_out, s_cache = sliding_window_attention_forward(Q, K, V, window=window, causal=causal,
                                                      scale=scale, block_size=block_size)
    assert s_out.shape == out.shape and s_out.dtype == out.dtype
    assert_close(s_out, out)
    for g_s, g, name in zip(sliding_window_attention_backward(dout, s_cache),
                            attention_backward(dout, cache), "QKV"):
        assert g_s.shape == g.shape, name
        assert_close(g_s, g)
    return s_cache


@pytest.mark.parametrize("i,case", list(enumerate(SLIDING.make_cases(np.random.default_rng(2),
                                                                      np.float64))),
                         ids=lambda x: x.label if hasattr(x, "label") else str(x))
def test_sliding_window_registered_case_equals_masked_attention(i, case):
    Q, K, V = case.args
    out, _ = sliding_window_attention_forward(Q, K, V, **case.kwargs)
    dout = np.random.default_rng(i).standard_normal(out.shape)
    _sliding_vs_standard(Q, K, V, dout, **case.kwargs)


@st.composite
def _sliding_problems(draw):
    lead_q, lead_kv = draw(st.sampled_from([((), ()), ((2,), (2,)), ((2, 3), (2, 1)),
                                            ((1, 2), (3, 1)), ((3,), ())]))
    n_q = draw(st.integers(1, 12))
    n_k = n_q + draw(st.integers(0, 5))
    d_k, d_v = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    Q = rng.standard_normal(lead_q + (n_q, d_k))
    K = rng.standard_normal(lead_kv + (n_k, d_k))
    V = rng.standard_normal(lead_kv + (n_k, d_v))
    kwargs = {"window": draw(st.integers(0, 14)), "causal": draw(st.booleans()),
              "block_size": draw(st.integers(1, 13))}
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.floats(0.1, 3.0))
    return Q, K, V, kwargs


@settings(max_examples=150, deadline=None)
@given(_sliding_problems())
def test_sliding_window_equals_masked_attention_for_any_shape_window_and_block(problem):
    Q, K, V, kwargs = problem
    out, _ = sliding_window_attention_forward(Q, K, V, **kwargs)
    dout = np.random.default_rng(0).standard_normal(out.shape)
    _sliding_vs_standard(Q, K, V, dout, **kwargs)


def test_sliding_window_holds_no_n_by_n_array():
    """At n = 2048, window 32, block 64: every array the op creates (cache included) is a
    band of at most n (block + window) entries; the peak of forward + backward stays far
    below ONE n x n array. Deterministic, not timed."""
    n, d, window, block = 2048, 8, 32, 64
    rng = np.random.default_rng(19)
    Q, K, V, dout = (rng.standard_normal((n, d)) for _ in range(4))
    _, cache = sliding_window_attention_forward(Q, K, V, window=window, block_size=block)
    sizes = [a.size for a in cache["band"]]
    assert max(sizes) <= block * (block + window) and sum(sizes) <= n * (block + window)

    def sliding():
        _, c = sliding_window_attention_forward(Q, K, V, window=window, block_size=block)
        sliding_window_attention_backward(dout, c)

    peak = _peak_bytes(sliding)
    assert peak < n * n * 8 / 8, peak                  # an eighth of one n x n float64 array
    assert peak < 8 * n * (block + window + 4 * d) * 8  # a few bands and (n, d) arrays


def test_sliding_window_output_ignores_keys_outside_the_window():
    rng = np.random.default_rng(20)
    Q, K, V = (rng.standard_normal((9, 3)) for _ in range(3))
    out, _ = sliding_window_attention_forward(Q, K, V, window=2, block_size=4)
    K2, V2 = K.copy(), V.copy()
    K2[0] += 5.0
    V2[0] -= 7.0                                     # key 0 is in the window of queries 0, 1, 2
    out2, _ = sliding_window_attention_forward(Q, K2, V2, window=2, block_size=4)
    assert np.array_equal(out[3:], out2[3:]) and not np.allclose(out[:3], out2[:3])


def test_sliding_window_float32_stays_float32():
    rng = np.random.default_rng(21)
    Q, K, V = (rng.standard_normal((2, 7, 3)).astype(np.float32) for _ in range(3))
    out, cache = sliding_window_attention_forward(Q, K, V, window=2, block_size=3)
    assert out.dtype == np.float32 and all(A.dtype == np.float32 for A in cache["band"])
    grads = sliding_window_attention_backward(np.ones((2, 7, 3)), cache)   # float64 dout: cast
    assert all(g.dtype == np.float32 for g in grads)
    ref, _ = attention_forward(Q, K, V, mask=sliding_window_mask(7, window=2))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs,shapes,exc,words", [
    ({"window": -1}, None, ValueError, "window is -1"),
    ({"window": 1.5}, None, TypeError, "window is 1.5"),
    ({"window": True}, None, TypeError, "window is True"),
    ({"window": 2, "block_size": 0}, None, ValueError, "block_size is 0"),
    ({"window": 2, "causal": "yes"}, None, TypeError, "causal"),
    ({"window": 2}, ((2, 5, 3), (2, 4, 3), (2, 4, 3)), ValueError, "n_k >= n_q"),
    ({"window": 2}, ((2, 4, 3), (2, 4, 2), (2, 4, 3)), ValueError, "the axes d_k must match"),
])
def test_sliding_window_bad_input(kwargs, shapes, exc, words):
    shapes = shapes or ((2, 4, 3), (2, 4, 3), (2, 4, 3))
    with pytest.raises(exc) as info:
        sliding_window_attention_forward(*(np.zeros(s) for s in shapes), **kwargs)
    assert str(info.value).startswith("sliding_window_attention_forward:")
    assert words in str(info.value)


def test_sliding_window_needs_window():
    with pytest.raises(TypeError, match="window"):
        sliding_window_attention_forward(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 2)))


# ---------------------------------------------------------------------------------------
# linear attention
# ---------------------------------------------------------------------------------------

def test_linear_attention_non_causal_equals_its_quadratic_form():
    """out = (A V) / (A 1 + eps) with A = phi(Q) phi(K)^T, the n x n form it avoids."""
    rng = np.random.default_rng(12)
    Q, K, V = (rng.standard_normal(s) for s in ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 2)))
    A = _phi(Q) @ np.swapaxes(_phi(K), -1, -2)        # (2, 3, 5, 7)
    expected = (A @ V) / (A.sum(-1, keepdims=True) + 1e-6)
    out, _ = linear_attention_forward(Q, K, V)
    assert_close(out, expected)


def test_linear_attention_causal_equals_masked_quadratic_form_and_a_loop():
    rng = np.random.default_rng(13)
    n_q, n_k = 4, 7
    Q, K, V = (rng.standard_normal(s) for s in ((2, n_q, 3), (2, n_k, 3), (2, n_k, 5)))
    out, _ = linear_attention_forward(Q, K, V, causal=True, eps=0.01)
    A = (_phi(Q) @ np.swapaxes(_phi(K), -1, -2)) * causal_mask(n_q, n_k)
    assert_close(out, (A @ V) / (A.sum(-1, keepdims=True) + 0.01))
    # the recurrent ("RNN") view: one state S, z updated key by key
    S = np.zeros((2, 3, 5))
    z = np.zeros((2, 3))
    loop = np.zeros((2, n_q, 5))
    for p in range(n_k):
        S = S + _phi(K[:, p])[:, :, None] * V[:, p][:, None, :]
        z = z + _phi(K[:, p])
        i = p - (n_k - n_q)
        if i >= 0:
            q = _phi(Q[:, i])
            loop[:, i] = np.einsum("bd,bde->be", q, S) / (np.sum(q * z, -1, keepdims=True) + 0.01)
    assert_close(out, loop)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 64])
@pytest.mark.parametrize("n_q,n_k", [(7, 7), (3, 8), (1, 4)])
def test_linear_attention_causal_chunks_give_the_same_output_and_gradients(chunk_size, n_q, n_k):
    """Any chunk size: the masked quadratic form's output and the same gradients as one
    chunk holding every query (1e-12, float64)."""
    rng = np.random.default_rng(22)
    Q = rng.standard_normal((2, 1, n_q, 3))
    K, V = rng.standard_normal((2, 2, n_k, 3)), rng.standard_normal((2, 2, n_k, 4))
    dout = rng.standard_normal((2, 2, n_q, 4))
    out, cache = linear_attention_forward(Q, K, V, causal=True, chunk_size=chunk_size)
    A = (_phi(Q) @ np.swapaxes(_phi(K), -1, -2)) * causal_mask(n_q, n_k)
    assert_close(out, (A @ V) / (A.sum(-1, keepdims=True) + 1e-6))
    one, one_cache = linear_attention_forward(Q, K, V, causal=True, chunk_size=n_q)
    for g, g_one in zip(linear_attention_backward(dout, cache),
                        linear_attention_backward(dout, one_cache)):
        assert_close(g, g_one)


def test_linear_attention_causal_memory_is_linear_in_n():
    """Forward + backward, d = 64, chunk 64: no (n, d, d) prefix states and no n x n array.
    The peak is a small multiple of the (n, d) inputs and doubles with n. Deterministic,
    not timed."""
    d = 64
    rng = np.random.default_rng(23)
    peaks = {}
    for n in (1024, 2048):
        Q, K, V, dout = (rng.standard_normal((n, d)) for _ in range(4))

        def causal():
            _, c = linear_attention_forward(Q, K, V, causal=True)
            linear_attention_backward(dout, c)

        peaks[n] = _peak_bytes(causal)
        assert peaks[n] < 24 * n * d * 8, peaks    # ~two dozen (n, d) float64 arrays at most
        assert peaks[n] < n * d * d * 8 / 2        # under half of the (n, d, d) states alone
    assert peaks[2048] < 2.2 * peaks[1024], peaks


def test_linear_attention_chunk_size_is_checked():
    Q = np.zeros((4, 3))
    with pytest.raises(ValueError, match="^linear_attention_forward: chunk_size is 0"):
        linear_attention_forward(Q, Q, Q, causal=True, chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size"):
        linear_attention_forward(Q, Q, Q, causal=True, chunk_size=2.0)


def test_linear_attention_causal_output_ignores_future_keys():
    rng = np.random.default_rng(14)
    Q, K, V = (rng.standard_normal((6, 3)) for _ in range(3))
    out, _ = linear_attention_forward(Q, K, V, causal=True)
    K2, V2 = K.copy(), V.copy()
    K2[4:] += 1.0
    V2[4:] -= 2.0
    out2, _ = linear_attention_forward(Q, K2, V2, causal=True)
    assert np.array_equal(out[:4], out2[:4]) and not np.allclose(out[4:], out2[4:])


def test_linear_attention_weights_are_a_convex_combination():
    """With eps -> 0 each output row is a weighted mean of values: inside their range."""
    rng = np.random.default_rng(15)
    Q, K, V = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    out, _ = linear_attention_forward(Q, K, V, eps=1e-12)
    assert np.all(out <= V.max(-2, keepdims=True) + 1e-12)
    assert np.all(out >= V.min(-2, keepdims=True) - 1e-12)
    const = np.broadcast_to(np.arange(4.0), (2, 6, 4))
    out, _ = linear_attention_forward(Q, K, const, eps=1e-12)
    assert_close(out, const, 1e-10)


def test_linear_attention_extreme_inputs_stay_finite():
    rng = np.random.default_rng(16)
    Q, K, V = (800.0 * rng.standard_normal((5, 3)) for _ in range(3))
    for causal in (False, True):
        out, cache = linear_attention_forward(Q, K, V, causal=causal)
        grads = linear_attention_backward(np.ones_like(out), cache)
        assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_float32_stays_float32(causal):
    rng = np.random.default_rng(17)
    Q, K, V = (rng.standard_normal((2, 5, 3)).astype(np.float32) for _ in range(3))
    out, cache = linear_attention_forward(Q, K, V, causal=causal)
    assert out.dtype == np.float32
    grads = linear_attention_backward(np.ones((2, 5, 3)), cache)
    assert all(g.dtype == np.float32 for g in grads)
    ref, _ = linear_attention_forward(*(a.astype(np.float64) for a in (Q, K, V)), causal=causal)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args,kwargs,exc,words", [
    (((2, 4, 3), (2, 4, 3), (2, 4, 3)), {"causal": 1}, TypeError, "causal is 1"),
    (((2, 4, 3), (2, 4, 3), (2, 4, 3)), {"eps": 0.0}, ValueError, "eps is 0.0"),
    (((2, 4, 3), (2, 4, 3), (2, 4, 3)), {"eps": -1.0}, ValueError, "eps"),
    (((2, 5, 3), (2, 4, 3), (2, 4, 3)), {"causal": True}, ValueError, "n_k >= n_q"),
    (((2, 4, 3), (2, 4, 2), (2, 4, 3)), {}, ValueError, "the axes d_k must match"),
    (((2, 4, 3), (2, 4, 3), (2, 3, 3)), {}, ValueError, "V has shape (2, 3, 3)"),
    (((3,), (4, 3), (4, 3)), {}, ValueError, "Q has shape (3,)"),
])
def test_linear_attention_bad_input(args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        linear_attention_forward(*(np.zeros(s) for s in args), **kwargs)
    assert str(info.value).startswith("linear_attention_forward:") and words in str(info.value)


# ---------------------------------------------------------------------------------------
# PyTorch autograd (linear attention has no torch op; build it from torch primitives)
# ---------------------------------------------------------------------------------------

@pytest.mark.torch
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_gradients_match_torch(causal):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(18)
    n_q, n_k = (4, 6) if causal else (5, 3)
    arrays = [rng.standard_normal((2, 2, n_q, 3)), rng.standard_normal((2, 1, n_k, 3)),
              rng.standard_normal((2, 1, n_k, 4))]
    out, cache = linear_attention_forward(*arrays, causal=causal)
    dout = rng.standard_normal(out.shape)
    grads = linear_attention_backward(dout, cache)

    Qt, Kt, Vt = (torch.tensor(a, requires_grad=True) for a in arrays)
    fq, fk = torch.nn.functional.elu(Qt) + 1, torch.nn.functional.elu(Kt) + 1
    A = fq @ fk.transpose(-1, -2)
    if causal:
        A = A * torch.tensor(causal_mask(n_q, n_k), dtype=A.dtype)
    out_t = (A @ Vt) / (A.sum(-1, keepdim=True) + 1e-6)
    out_t.backward(torch.tensor(dout))
    np.testing.assert_allclose(out, out_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    for g, t in zip(grads, (Qt, Kt, Vt)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)
