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
    additive_attention_forward, additive_scores_backward, additive_scores_forward,
    attention_backward, attention_forward, bilinear_scores_forward, causal_mask,
    dot_scores_forward, mha_backward, mha_forward, neg_sq_dist_scores_forward, padding_mask,
    sinusoidal_encoding,
)
from numpytfmr.registry import bind
from numpytfmr.registry.attention import OPS

from conftest import assert_attention_gradients, mha_weights


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
    assert_attention_gradients(attention_forward, {"mask": mask, "bias": bias}, (Q, K, V))


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


def test_self_attention_is_permutation_equivariant_and_positions_break_it():
    """Attn(PX) = P Attn(X) without positions (003 §7.1); false once positions enter."""
    rng = np.random.default_rng(7)
    n, d = 5, 8
    X = rng.standard_normal((n, d))
    W = mha_weights(rng, d, 2, 2, 4)
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
    W = [w.astype(np.float32) for w in mha_weights(rng, 6, 6, 2, 2)]
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
