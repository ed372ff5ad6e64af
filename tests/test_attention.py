"""Attention: scaled dot-product, the scoring functions of 002, additive attention and
multi-head attention (GQA/MQA, RoPE, KV cache).

Gradients are checked by finite differences (float64, random upstream gradients); the
notes' properties, worked examples and errata each have a test. Every warning is an
error in this file: a fully masked row must not even warn.
"""
import math

import numpy as np
import pytest

from numpytfmr import (
    additive_attention_forward, additive_scores_backward, additive_scores_forward, attention_backward, attention_forward,
    bilinear_scores_forward, causal_mask, dot_scores_forward, merge_heads, mha_backward,
    mha_forward, neg_sq_dist_scores_forward, padding_mask, scaled_dot_scores_forward,
    sinusoidal_encoding, split_heads,
)
from numpytfmr.gradcheck import check_gradients
from numpytfmr.registry import bind
from numpytfmr.registry.attention import OPS

pytestmark = pytest.mark.filterwarnings("error")


def assert_gradients(forward, kwargs, args, seed=0):
    res = check_gradients(bind(forward, kwargs), _backward_of(forward), args, seed=seed)
    assert res.passed and max(res.errors.values()) <= 1e-7, str(res)


_BACKWARDS = {spec.forward: spec.backward for spec in OPS}


def _backward_of(forward):
    return _BACKWARDS[forward]


def _mha_weights(rng, d_model, n_heads, n_kv_heads, d_head, *, biases=True, dtype=np.float64):
    s = d_model ** -0.5
    W = [rng.standard_normal((d_model, n_heads * d_head)) * s,
         rng.standard_normal((d_model, n_kv_heads * d_head)) * s,
         rng.standard_normal((d_model, n_kv_heads * d_head)) * s,
         rng.standard_normal((n_heads * d_head, d_model)) * (n_heads * d_head) ** -0.5]
    b = ([rng.standard_normal(n) * 0.3 for n in (n_heads * d_head, n_kv_heads * d_head,
                                                 n_kv_heads * d_head, d_model)]
         if biases else [None] * 4)
    return [None if a is None else a.astype(dtype) for a in W + b]


# ---------------------------------------------------------------------------------------
# finite differences beyond the registered cases (those run in tests/test_registry.py)
# ---------------------------------------------------------------------------------------

def test_registry_covers_every_requested_case():
    labels = {spec.name: " | ".join(c.label for c in spec.make_cases(np.random.default_rng(0),
                                                                     np.float64)) for spec in OPS}
    assert set(labels) == {"attention", "dot_scores", "scaled_dot_scores", "neg_sq_dist_scores",
                           "bilinear_scores", "additive_scores", "additive_attention", "mha"}
    for word in ("causal", "padding", "fully masked", "-inf bias", "d_k=6 != d_v=3",
                 "n_q=2 != n_k=5", "leading axes", "scale="):
        assert word in labels["attention"], word
    for word in ("self-attention", "cross-attention", "no biases", "GQA 6 heads / 2 kv",
                 "MQA 6 heads / 1 kv", "RoPE interleaved", "RoPE half"):
        assert word in labels["mha"], word


def test_mha_gradients_through_a_kv_cached_step():
    """The backward of a cached step: the cache is a constant, x and weights get gradients."""
    rng = np.random.default_rng(5)
    W = _mha_weights(rng, 6, 6, 2, 2)
    past = {"k": rng.standard_normal((1, 2, 3, 2)), "v": rng.standard_normal((1, 2, 3, 2))}
    x = rng.standard_normal((1, 2, 6))
    kwargs = {"n_heads": 6, "n_kv_heads": 2, "kv_cache": past, "mask": causal_mask(2, 5),
              "rope": {"layout": "half"}}
    assert_gradients(mha_forward, kwargs, (x, x.copy(), *W))


def test_mha_gradients_with_rope_options():
    rng = np.random.default_rng(6)
    W = _mha_weights(rng, 5, 2, 1, 4)
    x_q, x_kv = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 4, 5))
    rope = {"layout": "interleaved", "freqs": np.array([0.9, 0.2]),
            "positions_q": np.array([[4, 5, 6], [1, 2, 3]]), "positions_k": np.arange(4)}
    assert_gradients(mha_forward, {"n_heads": 2, "n_kv_heads": 1, "rope": rope},
                     (x_q, x_kv, *W))


def test_additive_attention_gradients_with_values_batched_beyond_queries_and_keys():
    """q and K shared by two sets of values: the scores (n_q, n_k) get the weights' batch
    axis only through V, and their gradient is summed back over it."""
    rng = np.random.default_rng(23)
    q, K, V = rng.standard_normal((3, 4)), rng.standard_normal((5, 3)), rng.standard_normal((2, 5, 2))
    Wq, Wk, w = (0.6 * rng.standard_normal(s) for s in ((4, 6), (3, 6), (6,)))
    mask = rng.random((2, 3, 5)) < 0.7
    mask[..., 0] = True
    assert_gradients(additive_attention_forward, {"mask": mask}, (q, K, V, Wq, Wk, w))


# ---------------------------------------------------------------------------------------
# masks, weights, fully masked rows
# ---------------------------------------------------------------------------------------

def test_causal_mask_by_hand():
    assert np.array_equal(causal_mask(3), np.array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], bool))
    # a KV-cached chunk of 2 queries at absolute positions 3 and 4 over 5 keys
    assert np.array_equal(causal_mask(2, 5), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool))
    assert causal_mask(1, 4).all()  # one decoding step sees every key (003 §6.2 step 3)


def test_padding_mask_shape_and_values():
    m = padding_mask(np.array([2, 0, 3]), 3)
    assert m.shape == (3, 1, 3) and m.dtype == bool
    assert np.array_equal(m[:, 0], np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]], bool))
    assert padding_mask(np.array([2, 3])[:, None], 3).shape == (2, 1, 1, 3)  # multi-head scores


def test_weight_rows_sum_to_one_and_are_exactly_zero_where_masked():
    rng = np.random.default_rng(1)
    Q, K, V = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 6, 3)), rng.standard_normal((2, 6, 2))
    mask = causal_mask(4, 6) & padding_mask(np.array([5, 3]), 6)
    out, cache = attention_forward(Q, K, V, mask=mask)
    A = cache["weights"]
    assert np.all(A[~np.broadcast_to(mask, A.shape)] == 0.0)
    np.testing.assert_allclose(A.sum(axis=-1), 1.0, rtol=0, atol=1e-14)
    assert np.all(A[np.broadcast_to(mask, A.shape)] > 0)


def test_fully_masked_row_gives_zero_output_and_zero_gradients_without_warning():
    rng = np.random.default_rng(2)
    Q, K, V = rng.standard_normal((3, 4)), rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    mask = causal_mask(3, 4)
    mask[1] = False
    bias = np.where(mask, 0.0, -np.inf)
    for kw in ({"mask": mask}, {"bias": bias}, {"mask": mask, "bias": bias}):
        out, cache = attention_forward(Q, K, V, **kw)          # warnings are errors here
        assert np.all(np.isfinite(out))
        assert np.array_equal(out[1], np.zeros(4)) and np.array_equal(cache["weights"][1], np.zeros(4))
        dQ, dK, dV = attention_backward(rng.standard_normal(out.shape), cache)
        assert np.array_equal(dQ[1], np.zeros(4))
        assert all(np.all(np.isfinite(g)) for g in (dQ, dK, dV))
    out, _ = attention_forward(Q, K, V, mask=np.zeros((3, 4), bool))  # every row empty
    assert np.array_equal(out, np.zeros_like(out))


def test_neg_inf_bias_acts_like_a_false_mask():
    rng = np.random.default_rng(3)
    Q, K, V = (rng.standard_normal((2, 4, 5)) for _ in range(3))
    M = np.where(causal_mask(4), 0.0, -np.inf)       # the notes' M (003 §5.1.2)
    out_bias, c1 = attention_forward(Q, K, V, bias=M)
    out_mask, c2 = attention_forward(Q, K, V, mask=causal_mask(4))
    np.testing.assert_allclose(out_bias, out_mask, rtol=1e-14, atol=1e-15)
    assert np.array_equal(c1["weights"] == 0, c2["weights"] == 0)


def test_large_finite_bias_does_not_overflow():
    Q = K = V = np.eye(3)
    bias = np.array([[0.0, -1e4, -1e4], [-1e4, -1e4, -1e4], [-2e4, -2e4, 5e3]])
    out, cache = attention_forward(Q, K, V, bias=bias, mask=np.array([[1, 0, 1]] * 3, bool))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(cache["weights"].sum(-1), 1.0, atol=1e-15)
    np.testing.assert_allclose(cache["weights"][2], [0, 0, 1], atol=0)


def test_broadcast_keys_equal_explicit_repeats():
    """Keys shared by a head axis (K of size 1 there) = the same keys repeated; dK sums."""
    rng = np.random.default_rng(4)
    Q, K, V = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 1, 6, 5)), rng.standard_normal((2, 1, 6, 2))
    dout = rng.standard_normal((2, 3, 4, 2))
    out, c = attention_forward(Q, K, V)
    Kr, Vr = np.repeat(K, 3, axis=1), np.repeat(V, 3, axis=1)
    out_r, c_r = attention_forward(Q, Kr, Vr)
    np.testing.assert_allclose(out, out_r, rtol=1e-13)
    g, g_r = attention_backward(dout, c), attention_backward(dout, c_r)
    np.testing.assert_allclose(g[1], g_r[1].sum(axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(g[2], g_r[2].sum(axis=1, keepdims=True), rtol=1e-12)


def test_mask_and_bias_with_batch_axes_only_the_values_have():
    """Unbatched Q, K with batched V: a (2, n_q, n_k) mask and bias still apply per item
    (the scores broadcast to the mask's and bias's shape)."""
    rng = np.random.default_rng(14)
    Q, K, V = rng.standard_normal((5, 4)), rng.standard_normal((6, 4)), rng.standard_normal((2, 6, 3))
    mask = rng.random((2, 5, 6)) > 0.3
    mask[..., 0] = True
    bias = rng.standard_normal((2, 5, 6))
    out, cache = attention_forward(Q, K, V, mask=mask, bias=bias)
    S = np.where(mask, Q @ K.T / 2.0 + bias, -np.inf)       # d_k = 4: scale 1/2
    A = np.exp(S - S.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, A @ V, rtol=1e-13)
    assert_gradients(attention_forward, {"mask": mask, "bias": bias}, (Q, K, V))


def test_default_scale_and_temperature():
    rng = np.random.default_rng(5)
    Q, K, V = rng.standard_normal((3, 7)), rng.standard_normal((4, 7)), rng.standard_normal((4, 2))
    _, c = attention_forward(Q, K, V)
    S = Q @ K.T / math.sqrt(7)
    expected = np.exp(S) / np.exp(S).sum(-1, keepdims=True)
    np.testing.assert_allclose(c["weights"], expected, rtol=1e-13)
    tau = 2.5
    _, c_tau = attention_forward(Q, K, V, scale=1 / tau)
    S = Q @ K.T / tau
    np.testing.assert_allclose(c_tau["weights"], np.exp(S) / np.exp(S).sum(-1, keepdims=True), rtol=1e-13)


# ---------------------------------------------------------------------------------------
# the notes' properties
# ---------------------------------------------------------------------------------------

def test_self_attention_is_permutation_equivariant_and_positions_break_it():
    """Attn(PX) = P Attn(X) without positions (003 §7.1); false once positions enter."""
    rng = np.random.default_rng(7)
    n, d = 5, 8
    X = rng.standard_normal((n, d))
    W = _mha_weights(rng, d, 2, 2, 4)
    P = np.eye(n)[rng.permutation(n)]
    attn = lambda X, **kw: mha_forward(X, X, *W, n_heads=2, **kw)[0]  # noqa: E731
    np.testing.assert_allclose(attn(P @ X), P @ attn(X), rtol=1e-12, atol=1e-14)
    # plain attention too, with Q = K = V = X
    np.testing.assert_allclose(attention_forward(P @ X, P @ X, P @ X)[0],
                               P @ attention_forward(X, X, X)[0], rtol=1e-12, atol=1e-14)
    # absolute positions added to the embeddings (003 §7.2) break it
    PE = sinusoidal_encoding(n, d)
    assert not np.allclose(attn(P @ X + PE), P @ attn(X + PE), atol=1e-6)
    # so does RoPE on queries and keys (003 §7.3)
    for layout in ("interleaved", "half"):
        assert not np.allclose(attn(P @ X, rope=layout), P @ attn(X, rope=layout), atol=1e-6)


@pytest.mark.parametrize("rope,n_kv_heads", [(None, 6), ("half", 2), ("interleaved", 1)])
def test_causal_outputs_up_to_t_are_bitwise_unchanged_by_later_tokens(rope, n_kv_heads):
    rng = np.random.default_rng(8)
    B, n, d, t = 2, 5, 12, 2
    W = _mha_weights(rng, d, 6, n_kv_heads, 2)
    x = rng.standard_normal((B, n, d))
    x2 = x.copy()
    x2[:, t + 1:] = rng.standard_normal((B, n - t - 1, d)) * 10   # change every later token
    kw = {"n_heads": 6, "n_kv_heads": n_kv_heads, "mask": causal_mask(n), "rope": rope}
    out, c = mha_forward(x, x, *W, **kw)
    out2, c2 = mha_forward(x2, x2, *W, **kw)
    assert np.array_equal(out[:, :t + 1], out2[:, :t + 1])
    assert np.array_equal(c["weights"][..., :t + 1, :], c2["weights"][..., :t + 1, :])
    assert not np.array_equal(out[:, t + 1:], out2[:, t + 1:])
    # and plain attention, with Q, K, V all changed after t
    Q, K, V = (rng.standard_normal((B, n, 4)) for _ in range(3))
    Q2, K2, V2 = Q.copy(), K.copy(), V.copy()
    for a in (Q2, K2, V2):
        a[:, t + 1:] += 3.0
    o = attention_forward(Q, K, V, mask=causal_mask(n))[0]
    o2 = attention_forward(Q2, K2, V2, mask=causal_mask(n))[0]
    assert np.array_equal(o[:, :t + 1], o2[:, :t + 1])


def test_worked_example_context_vector_003_5_1():
    """003 §5.1 / 000 §2.1: dot-product scores of s_{t-1} against h_1..h_3 and the context.

    Erratum: the notes print alpha = (0.3374, 0.2501, 0.4125) and c_t = (0.7499, 0.6626);
    exp(e)/sum exp(e) is (0.33759, 0.25009, 0.41233) and c_t = (0.74991, 0.66241).
    """
    s = np.array([[0.5, 0.2]])
    H = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    e, _ = dot_scores_forward(s, H)
    np.testing.assert_allclose(e, [[0.5, 0.2, 0.7]], atol=1e-15)   # e_tj = s^T h_j
    c, cache = attention_forward(s, H, H, scale=1.0)                 # plain dot product, no sqrt(d)
    total = math.exp(0.5) + math.exp(0.2) + math.exp(0.7)
    alpha = [math.exp(0.5) / total, math.exp(0.2) / total, math.exp(0.7) / total]
    np.testing.assert_allclose(cache["weights"][0], alpha, rtol=1e-14)
    np.testing.assert_allclose(c[0], [alpha[0] + alpha[2], alpha[1] + alpha[2]], rtol=1e-14)
    assert abs(c[0, 0] - 0.7499) < 5e-5 and abs(c[0, 1] - 0.6624) < 5e-5
    # the notes' printed values are off in the 4th decimal
    assert abs(cache["weights"][0, 0] - 0.3374) > 1e-4 and abs(cache["weights"][0, 2] - 0.4125) > 1e-4
    assert abs(c[0, 1] - 0.6626) > 1e-4


def test_kv_cache_worked_example_003_6_2_1():
    """003 §6.2.1 / 000 §2.5.1: keys k_i = x_i W^K and values v_i = x_i W^V of x_1..x_3.

    Erratum: 003 §6.2.1 writes k_1 as the matrix W^K times the column x_1, which is
    (5, 2), and garbles k_2, k_3; the row-vector product x_i W^K gives the printed (1, 4),
    (3, 10), (5, 16), as 000 §2.5.1 writes it.
    """
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    WQ, WK = np.eye(2), np.array([[1.0, 2.0], [0.0, 1.0]])
    WV = np.array([[0.5, -0.5], [1.0, 0.5]])
    _, cache = mha_forward(x, x, WQ, WK, WV, np.eye(2), n_heads=1)
    assert np.array_equal(cache["kv_cache"]["k"][0], [[1, 4], [3, 10], [5, 16]])
    assert np.array_equal(cache["kv_cache"]["v"][0], [[2.5, 0.5], [5.5, 0.5], [8.5, 0.5]])
    assert not np.array_equal(WK @ x[0], [1, 4])          # the notes' column form: (5, 2)
    # the next step with a made-up x_4, from the cache: alpha_{4j} = softmax_j(q_4 . k_j / sqrt(2))
    x4 = np.array([[0.5, -1.0]])
    z4, c4 = mha_forward(x4, x4, WQ, WK, WV, np.eye(2), n_heads=1, kv_cache=cache["kv_cache"])
    k = [[1, 4], [3, 10], [5, 16], list(x4[0] @ WK)]
    v = [[2.5, 0.5], [5.5, 0.5], [8.5, 0.5], list(x4[0] @ WV)]
    s = [(0.5 * kj[0] - 1.0 * kj[1]) / math.sqrt(2) for kj in k]
    a = [math.exp(si) / sum(math.exp(sj) for sj in s) for si in s]
    z = [sum(a[j] * v[j][0] for j in range(4)), sum(a[j] * v[j][1] for j in range(4))]
    np.testing.assert_allclose(z4[0], z, rtol=1e-13)
    assert c4["kv_cache"]["k"].shape == (1, 4, 2)


@pytest.mark.parametrize("n_kv_heads,rope", [(6, None), (2, "half"), (1, "interleaved"),
                                             (3, {"layout": "half", "base": 100.0})])
def test_cached_steps_equal_the_uncached_computation(n_kv_heads, rope):
    rng = np.random.default_rng(9)
    B, n, d = 2, 6, 12
    W = _mha_weights(rng, d, 6, n_kv_heads, 2)
    x = rng.standard_normal((B, n, d))
    kw = {"n_heads": 6, "n_kv_heads": n_kv_heads, "rope": rope}
    full, full_c = mha_forward(x, x, *W, mask=causal_mask(n), **kw)
    # prefill 3 tokens, then a chunk of 2, then 1 token
    out, c = mha_forward(x[:, :3], x[:, :3], *W, mask=causal_mask(3), **kw)
    outs, kv = [out], c["kv_cache"]
    for lo, hi in ((3, 5), (5, 6)):
        kv_before = {k: a.copy() for k, a in kv.items()}
        out, c = mha_forward(x[:, lo:hi], x[:, lo:hi], *W, mask=causal_mask(hi - lo, hi),
                             kv_cache=kv, **kw)
        assert all(np.array_equal(kv[k], kv_before[k]) for k in kv)   # input cache untouched
        assert c["kv_cache"] is not kv and c["kv_cache"]["k"].shape == (B, n_kv_heads, hi, 2)
        outs.append(out)
        kv = c["kv_cache"]
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(kv["k"], full_c["kv_cache"]["k"], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(c["weights"][..., -1, :], full_c["weights"][..., -1, :], atol=1e-13)


def test_gqa_with_as_many_kv_heads_as_heads_is_mha():
    rng = np.random.default_rng(10)
    W = _mha_weights(rng, 6, 3, 3, 2)
    x = rng.standard_normal((2, 4, 6))
    a, _ = mha_forward(x, x, *W, n_heads=3)
    b, _ = mha_forward(x, x, *W, n_heads=3, n_kv_heads=3)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("n_kv_heads", [2, 1, 3])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv_heads):
    """Query head h uses kv head h // (n_heads // n_kv_heads); the kv gradient sums the group."""
    rng = np.random.default_rng(11)
    H, dh, d, g = 6, 2, 6, 6 // n_kv_heads
    Wq, Wk, Wv, Wo, bq, bk, bv, bo = _mha_weights(rng, d, H, n_kv_heads, dh)
    rep = lambda W: np.repeat(W.reshape(W.shape[:-1] + (n_kv_heads, dh)), g, axis=-2).reshape(  # noqa: E731
        W.shape[:-1] + (H * dh,))
    x_q, x_kv = rng.standard_normal((2, 3, d)), rng.standard_normal((2, 4, d))
    mask = padding_mask(np.array([4, 2])[:, None], 4)
    out, c = mha_forward(x_q, x_kv, Wq, Wk, Wv, Wo, bq, bk, bv, bo, n_heads=H,
                         n_kv_heads=n_kv_heads, mask=mask, rope="half")
    out_r, c_r = mha_forward(x_q, x_kv, Wq, rep(Wk), rep(Wv), Wo, bq, rep(bk), rep(bv), bo,
                             n_heads=H, mask=mask, rope="half")
    np.testing.assert_allclose(out, out_r, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(c["weights"], c_r["weights"], rtol=1e-12, atol=1e-14)
    dout = rng.standard_normal(out.shape)
    g1, g2 = mha_backward(dout, c), mha_backward(dout, c_r)
    unrep = lambda G: G.reshape(G.shape[:-1] + (n_kv_heads, g, dh)).sum(-2).reshape(  # noqa: E731
        G.shape[:-1] + (n_kv_heads * dh,))
    for i in (0, 1, 2, 5, 6, 9):                                  # dx_q, dx_kv, dWq, dWo, dbq, dbo
        np.testing.assert_allclose(g1[i], g2[i], rtol=1e-11, atol=1e-13)
    for i in (3, 4, 7, 8):                                        # dWk, dWv, dbk, dbv
        np.testing.assert_allclose(g1[i], unrep(g2[i]), rtol=1e-11, atol=1e-13)


def test_mha_heads_are_attention_on_column_blocks():
    """003 §5.1.3: head_i = Attention(X W_i^Q, X W_i^K, X W_i^V), out = Concat(heads) W^O."""
    rng = np.random.default_rng(12)
    H, dh, d = 3, 2, 5
    Wq, Wk, Wv, Wo, *_ = _mha_weights(rng, d, H, H, dh, biases=False)
    x = rng.standard_normal((4, d))
    out, c = mha_forward(x, x, Wq, Wk, Wv, Wo, n_heads=H, mask=causal_mask(4))
    blocks = [slice(i * dh, (i + 1) * dh) for i in range(H)]
    heads = [attention_forward(x @ Wq[:, b], x @ Wk[:, b], x @ Wv[:, b], mask=causal_mask(4))
             for b in blocks]
    np.testing.assert_allclose(out, np.concatenate([h[0] for h in heads], -1) @ Wo, rtol=1e-12)
    np.testing.assert_allclose(c["weights"], np.stack([h[1]["weights"] for h in heads]), rtol=1e-12)
    assert c["weights"].shape == (H, 4, 4)


def test_split_and_merge_heads():
    x = np.arange(2 * 3 * 12.0).reshape(2, 3, 12)
    h = split_heads(x, 4)
    assert h.shape == (2, 4, 3, 3)
    assert np.array_equal(h[1, 2, 0], x[1, 0, 6:9])     # head 2 takes columns 6..8
    assert np.array_equal(merge_heads(h), x)


def test_float32_is_preserved():
    rng = np.random.default_rng(13)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    Q, K, V = f(2, 3, 4), f(2, 5, 4), f(2, 5, 3)
    bias = np.where(causal_mask(3, 5), 0.0, -np.inf).astype(np.float32)
    bias[0] = -np.inf
    out, c = attention_forward(Q, K, V, bias=bias, scale=0.5)
    assert out.dtype == c["weights"].dtype == np.float32
    assert all(g.dtype == np.float32 for g in attention_backward(np.ones_like(out), c))
    out64bias, _ = attention_forward(Q, K, V, bias=bias.astype(np.float64))  # an option: no upcast
    assert out64bias.dtype == np.float32
    W = [w.astype(np.float32) for w in _mha_weights(rng, 6, 6, 2, 2)]
    x = f(2, 3, 6)
    out, c = mha_forward(x, x, *W, n_heads=6, n_kv_heads=2, rope="half", mask=causal_mask(3))
    out2, c2 = mha_forward(x[:, :1], x[:, :1], *W, n_heads=6, n_kv_heads=2, rope="half",
                           kv_cache=c["kv_cache"])
    assert out.dtype == out2.dtype == c2["kv_cache"]["k"].dtype == np.float32
    assert all(g.dtype == np.float32 for g in mha_backward(np.ones_like(out2), c2))
    for fwd, args in ((dot_scores_forward, (Q, K)), (neg_sq_dist_scores_forward, (Q, K)),
                      (bilinear_scores_forward, (Q, K, f(4, 4))),
                      (additive_scores_forward, (Q, K, f(4, 3), f(4, 3), f(3))),
                      (additive_attention_forward, (Q, K, V, f(4, 3), f(4, 3), f(3)))):
        assert fwd(*args)[0].dtype == np.float32, fwd.__name__


def test_mixed_dtypes_compute_in_the_common_dtype_and_return_each_gradient_in_its_own():
    """float32 Q with float64 K, V: the result is float64; dQ stays float32, dK and dV float64."""
    rng = np.random.default_rng(24)
    Q = rng.standard_normal((3, 4)).astype(np.float32)
    K, V = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    out, c = attention_forward(Q, K, V, mask=causal_mask(3, 5))
    assert out.dtype == c["weights"].dtype == np.float64
    dQ, dK, dV = attention_backward(np.ones((3, 2), np.float32), c)   # dout is cast to float64
    assert (dQ.dtype, dK.dtype, dV.dtype) == (np.float32, np.float64, np.float64)
    np.testing.assert_allclose(out, attention_forward(Q.astype(np.float64), K, V,
                                                      mask=causal_mask(3, 5))[0], rtol=1e-14)


def test_backwards_refuse_a_wrong_dout_and_a_cache_of_another_op():
    """Every backward of this chapter checks dout against its forward's output and the cache's origin."""
    rng = np.random.default_rng(25)
    caches = {}
    for spec in OPS:
        case = spec.make_cases(rng, np.float64)[0]
        out, caches[spec.name] = bind(spec.forward, case.kwargs)(*case.args)
        with pytest.raises(ValueError, match=f"^{spec.name}_backward: dout has shape "
                                             r"\(1, 2, 3\); expected the forward output's shape"):
            spec.backward(np.zeros((1, 2, 3)), caches[spec.name])
        with pytest.raises(TypeError, match=f"^{spec.name}_backward: cache is a dict; expected the "
                                            f"cache returned by {spec.name}_forward"):
            spec.backward(np.zeros_like(out), dict(caches[spec.name]))
    with pytest.raises(TypeError, match="^attention_backward: cache is the cache of mha_forward"):
        attention_backward(np.zeros((2, 3, 7)), caches["mha"])
    with pytest.raises(TypeError, match="^mha_backward: cache is the cache of attention_forward"):
        mha_backward(np.zeros((2, 4, 6)), caches["attention"])
    with pytest.raises(TypeError, match="^additive_scores_backward: cache is the cache of "
                                        "additive_attention_forward"):
        additive_scores_backward(np.zeros((2, 3, 5)), caches["additive_attention"])


# ---------------------------------------------------------------------------------------
# the scoring functions of 002
# ---------------------------------------------------------------------------------------

def test_scoring_functions_closed_forms():
    rng = np.random.default_rng(14)
    Q, K = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    np.testing.assert_allclose(scaled_dot_scores_forward(Q, K)[0], Q @ K.T / 2.0, rtol=1e-14)
    S = neg_sq_dist_scores_forward(Q, K)[0]
    expanded = Q @ K.T - 0.5 * (Q * Q).sum(-1)[:, None] - 0.5 * (K * K).sum(-1)[None, :]
    np.testing.assert_allclose(S, expanded, rtol=1e-12)       # 002: q^T k - |q|^2/2 - |k|^2/2
    assert np.all(S <= 0)
    np.testing.assert_allclose(bilinear_scores_forward(Q, K, np.eye(4))[0], Q @ K.T, rtol=1e-14)
    M = rng.standard_normal((4, 6))
    K6 = rng.standard_normal((5, 6))
    np.testing.assert_allclose(bilinear_scores_forward(Q, K6, M)[0], Q @ M @ K6.T, rtol=1e-13)
    Wq, Wk, w = rng.standard_normal((4, 3)), rng.standard_normal((6, 3)), rng.standard_normal(3)
    A = additive_scores_forward(Q, K6, Wq, Wk, w)[0]
    by_hand = [[w @ np.tanh(Q[t] @ Wq + K6[s] @ Wk) for s in range(5)] for t in range(3)]
    np.testing.assert_allclose(A, by_hand, rtol=1e-13)


def test_negative_distance_weights_equal_dot_product_weights_for_equal_norm_keys():
    """002: softmax drops -|q|^2/2, so with keys of one norm the two scores give the same weights."""
    rng = np.random.default_rng(15)
    Q, K = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    K = K / np.linalg.norm(K, axis=-1, keepdims=True) * 1.3
    soft = lambda S: np.exp(S - S.max(-1, keepdims=True)) / np.exp(S - S.max(-1, keepdims=True)).sum(-1, keepdims=True)  # noqa: E731
    np.testing.assert_allclose(soft(neg_sq_dist_scores_forward(Q, K)[0]),
                               soft(dot_scores_forward(Q, K)[0]), rtol=1e-12)


def test_additive_attention_is_softmax_of_additive_scores():
    rng = np.random.default_rng(16)
    q, K, V = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 5, 2))
    Wq, Wk, w = rng.standard_normal((4, 3)), rng.standard_normal((6, 3)), rng.standard_normal(3)
    mask = padding_mask(np.array([5, 3]), 5)
    c, cache = additive_attention_forward(q, K, V, Wq, Wk, w, mask=mask)
    S = additive_scores_forward(q, K, Wq, Wk, w)[0]
    E = np.exp(S) * mask
    A = E / E.sum(-1, keepdims=True)
    np.testing.assert_allclose(cache["weights"], A, rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(c, A @ V, rtol=1e-13)


# ---------------------------------------------------------------------------------------
# errata: each shows what the notes state and the correct math
# ---------------------------------------------------------------------------------------

def test_masked_attention_formula_errata_QtK():
    """003 §5.1.2 / 000 §2.1.2 write MA = softmax((Q^T K + M)/sqrt(d_k)) V.

    With tokens as rows, Q^T K is (d_k, d_k), not the (n, n) score matrix M is added to;
    the correct form is softmax(Q K^T / sqrt(d_k) + M) V (scaling M changes nothing when M
    is 0/-inf, but would rescale a finite bias such as ALiBi).
    """
    rng = np.random.default_rng(17)
    n, d_k = 4, 3
    Q, K, V = rng.standard_normal((n, d_k)), rng.standard_normal((n, d_k)), rng.standard_normal((n, 2))
    M = np.where(causal_mask(n), 0.0, -np.inf)
    assert (Q.T @ K).shape == (d_k, d_k) != M.shape
    S = Q @ K.T / math.sqrt(d_k) + M
    with np.errstate(under="ignore"):
        A = np.exp(S - S.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    np.testing.assert_allclose(attention_forward(Q, K, V, bias=M)[0], A @ V, rtol=1e-13)


def test_temperature_errata_smaller_tau_is_sharper():
    """003 §5.1.1 lists 'Bigger tau: softer' and then 'Bigger tau: sharper'; the second is
    'Smaller tau: sharper'. The entropy of the weights grows with tau."""
    rng = np.random.default_rng(18)
    Q, K, V = rng.standard_normal((3, 5)), rng.standard_normal((6, 5)), rng.standard_normal((6, 2))
    entropy = []
    for tau in (0.25, 1.0, 4.0):
        A = attention_forward(Q, K, V, scale=1.0 / tau)[1]["weights"]
        entropy.append(-(A * np.log(A)).sum(-1))
    assert np.all(entropy[0] < entropy[1]) and np.all(entropy[1] < entropy[2])


def test_future_masking_errata_zeroing_after_softmax_is_not_equivalent():
    """004 eq. 21 and 002 'Future masking' set alpha_ij = 0 for j > i after the softmax, 'or
    equivalently' add -inf before it. They are not equivalent: zeroed rows no longer sum to 1.
    Masking before the softmax equals zeroing and then renormalising each row."""
    rng = np.random.default_rng(19)
    Q, K, V = (rng.standard_normal((4, 3)) for _ in range(3))
    A_unmasked = attention_forward(Q, K, V)[1]["weights"]
    notes = A_unmasked * causal_mask(4)                      # eq. 21 as written
    assert np.all(notes.sum(-1)[:-1] < 1 - 1e-3)
    A = attention_forward(Q, K, V, mask=causal_mask(4))[1]["weights"]
    np.testing.assert_allclose(A, notes / notes.sum(-1, keepdims=True), rtol=1e-13)


def test_bahdanau_score_errata_needs_the_tanh():
    """002 'Seq2seq meets attention' writes a(h_t, h'_s) = v^T (W h_t + W' h'_s) without the
    tanh. Then v^T W h_t is the same for every s and cancels in the softmax: the weights would
    not depend on the query at all. With the tanh (002's last slide, Bahdanau) they do."""
    rng = np.random.default_rng(20)
    K = rng.standard_normal((5, 4))
    Wq, Wk, w = rng.standard_normal((3, 6)), rng.standard_normal((4, 6)), rng.standard_normal(6)
    q1, q2 = rng.standard_normal((1, 3)), rng.standard_normal((1, 3))
    soft = lambda S: np.exp(S - S.max()) / np.exp(S - S.max()).sum()  # noqa: E731
    linear = lambda q: soft(((q @ Wq)[:, None, :] + (K @ Wk)[None]) @ w)  # noqa: E731
    np.testing.assert_allclose(linear(q1), linear(q2), rtol=1e-12)        # query-blind
    a1 = additive_attention_forward(q1, K, K, Wq, Wk, w)[1]["weights"]
    a2 = additive_attention_forward(q2, K, K, Wq, Wk, w)[1]["weights"]
    assert np.abs(a1 - a2).max() > 1e-3


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------

def test_attention_bad_input():
    Q, K, V = np.zeros((2, 5, 8)), np.zeros((2, 5, 6)), np.zeros((2, 5, 3))
    with pytest.raises(ValueError, match=r"attention_forward: K has shape \(2, 5, 6\) but Q has "
                                         r"shape \(2, 5, 8\); the axes d_k must match"):
        attention_forward(Q, K, V)
    with pytest.raises(ValueError, match=r"attention_forward: V has shape \(2, 4, 3\) but K has "
                                         r"shape \(2, 5, 8\); the axes n_k must match"):
        attention_forward(Q, Q, np.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match="attention_forward: mask has shape \\(3, 5\\)"):
        attention_forward(Q, Q, V, mask=np.ones((3, 5), bool))
    with pytest.raises(TypeError, match="attention_forward: mask has dtype float64"):
        attention_forward(Q, Q, V, mask=np.ones((5, 5)))
    with pytest.raises(ValueError, match="attention_forward: bias has shape \\(4, 5\\)"):
        attention_forward(Q, Q, V, bias=np.zeros((4, 5)))
    with pytest.raises(ValueError, match="attention_forward: bias contains NaN or \\+inf"):
        attention_forward(Q, Q, V, bias=np.full((5, 5), np.inf))
    with pytest.raises(TypeError, match="attention_forward: Q has dtype int64; expected a floating-point"):
        attention_forward(np.zeros((5, 8), int), Q, V)
    with pytest.raises(ValueError, match="attention_backward: dout has shape"):
        attention_backward(np.zeros((2, 5, 4)), attention_forward(Q, Q, V)[1])
    with pytest.raises(ValueError, match="causal_mask: n_k is 2 but n_q is 3"):
        causal_mask(3, 2)
    with pytest.raises(ValueError, match="padding_mask: lengths has values in"):
        padding_mask(np.array([5]), 4)


def test_mha_bad_input():
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 3, 6))
    Wq, Wk, Wv, Wo, *_ = _mha_weights(rng, 6, 6, 2, 2)
    with pytest.raises(ValueError, match="mha_forward: Wk has shape \\(6, 4\\); expected \\(6, 2\\)"):
        mha_forward(x, x, Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=1)         # mismatched head sizes
    with pytest.raises(ValueError, match="mha_forward: Wq has shape \\(6, 12\\); its 12 columns "
                                         "are not divisible by n_heads=5"):
        mha_forward(x, x, Wq, Wk, Wv, Wo, n_heads=5)
    with pytest.raises(ValueError, match="mha_forward: n_heads=6 is not divisible by n_kv_heads=4"):
        mha_forward(x, x, Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=4)
    with pytest.raises(ValueError, match="mha_forward: mask has shape \\(4, 4\\)"):
        mha_forward(x, x, Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=2, mask=causal_mask(4))
    with pytest.raises(ValueError, match="mha_forward: Wq has shape \\(6, 12\\) but x_q has shape "
                                         "\\(2, 3, 5\\)"):
        mha_forward(x[..., :5], x, Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=2)
    with pytest.raises(ValueError, match="mha_forward: Wk has shape \\(6, 4\\) but x_kv has shape "
                                         "\\(2, 3, 5\\); the axes d_kv must match"):
        mha_forward(x, x[..., :5], Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=2)
    with pytest.raises(ValueError, match="mha_forward: Wo has shape"):
        mha_forward(x, x, Wq, Wk, Wv, Wo[:6], n_heads=6, n_kv_heads=2)
    with pytest.raises(ValueError, match="mha_forward: bq has shape"):
        mha_forward(x, x, Wq, Wk, Wv, Wo, np.zeros(6), n_heads=6, n_kv_heads=2)
    with pytest.raises(ValueError, match="mha_forward: the leading \\(batch\\) axes of x_q .*x_kv "
                                         "\\(3, 3, 6\\) do not broadcast"):
        mha_forward(x, np.zeros((3, 3, 6)), Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=2)
    with pytest.raises(ValueError, match="mha_forward: x_kv has shape \\(1, 3, 6\\) but x_q has shape "
                                         "\\(2, 3, 6\\); the leading \\(batch\\) axes must match"):
        mha_forward(x, x[:1], Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=2)     # no broadcasting here
    with pytest.raises(ValueError, match="mha_forward: kv_cache\\['k'\\] has shape"):
        mha_forward(x, x, Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=2,
                    kv_cache={"k": np.zeros((2, 6, 1, 2)), "v": np.zeros((2, 6, 1, 2))})
    with pytest.raises(ValueError, match="mha_forward: rope has unknown keys \\['position'\\]"):
        mha_forward(x, x, Wq, Wk, Wv, Wo, n_heads=6, n_kv_heads=2, rope={"position": [0, 1, 2]})
    with pytest.raises(ValueError, match="rope_forward: x has shape .* must be even"):
        Wq3 = rng.standard_normal((6, 3))
        mha_forward(x, x, Wq3, Wq3, Wq3, rng.standard_normal((3, 6)), n_heads=1, rope="half")
    with pytest.raises(ValueError, match="split_heads: x has shape \\(2, 3, 6\\); its last axis 6 "
                                         "is not divisible by n_heads=4"):
        split_heads(x, 4)


def test_key_bias_gradient_is_zero_without_rope_and_not_with_it():
    """q_i . (k_j + bk) = q_i . k_j + q_i . bk: the second term is the same for every key j
    of row i, and the softmax ignores it, so dL/dbk = 0 (why the registry's biased cases
    without RoPE leave bk out). RoPE rotates bk differently at each position, and then it counts."""
    rng = np.random.default_rng(22)
    W = _mha_weights(rng, 6, 2, 2, 2)
    x = rng.standard_normal((2, 4, 6))
    dout = rng.standard_normal((2, 4, 6))
    for rope, zero in ((None, True), ("half", False)):
        out, c = mha_forward(x, x, *W, n_heads=2, mask=causal_mask(4), rope=rope)
        dbk, dbq = mha_backward(dout, c)[7], mha_backward(dout, c)[6]
        assert (np.abs(dbk).max() <= 1e-13 * np.abs(dbq).max()) == zero, rope
