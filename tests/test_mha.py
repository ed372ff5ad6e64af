"""numpytfmr/mha.py: multi-head attention (003 §5.1.3): heads as column blocks, GQA/MQA as
repeated key/value heads, RoPE inside, the KV cache (003 §6.2) and its worked example.
"""
import math

import numpy as np
import pytest

from numpytfmr import (
    attention_forward, causal_mask, merge_heads, mha_backward, mha_forward, padding_mask,
    split_heads,
)

from conftest import assert_attention_gradients, mha_weights


def test_mha_gradients_through_a_kv_cached_step():
    """The backward of a cached step: the cache is a constant, x and weights get gradients."""
    rng = np.random.default_rng(5)
    W = mha_weights(rng, 6, 6, 2, 2)
    past = {"k": rng.standard_normal((1, 2, 3, 2)), "v": rng.standard_normal((1, 2, 3, 2))}
    x = rng.standard_normal((1, 2, 6))
    kwargs = {"n_heads": 6, "n_kv_heads": 2, "kv_cache": past, "mask": causal_mask(2, 5),
              "rope": {"layout": "half"}}
    assert_attention_gradients(mha_forward, kwargs, (x, x.copy(), *W))


def test_mha_gradients_with_rope_options():
    rng = np.random.default_rng(6)
    W = mha_weights(rng, 5, 2, 1, 4)
    x_q, x_kv = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 4, 5))
    rope = {"layout": "interleaved", "freqs": np.array([0.9, 0.2]),
            "positions_q": np.array([[4, 5, 6], [1, 2, 3]]), "positions_k": np.arange(4)}
    assert_attention_gradients(mha_forward, {"n_heads": 2, "n_kv_heads": 1, "rope": rope},
                     (x_q, x_kv, *W))


@pytest.mark.parametrize("rope,n_kv_heads", [(None, 6), ("half", 2), ("interleaved", 1)])
def test_causal_outputs_up_to_t_are_bitwise_unchanged_by_later_tokens(rope, n_kv_heads):
    rng = np.random.default_rng(8)
    B, n, d, t = 2, 5, 12, 2
    W = mha_weights(rng, d, 6, n_kv_heads, 2)
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
    W = mha_weights(rng, d, 6, n_kv_heads, 2)
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
    W = mha_weights(rng, 6, 3, 3, 2)
    x = rng.standard_normal((2, 4, 6))
    a, _ = mha_forward(x, x, *W, n_heads=3)
    b, _ = mha_forward(x, x, *W, n_heads=3, n_kv_heads=3)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("n_kv_heads", [2, 1, 3])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv_heads):
    """Query head h uses kv head h // (n_heads // n_kv_heads); the kv gradient sums the group."""
    rng = np.random.default_rng(11)
    H, dh, d, g = 6, 2, 6, 6 // n_kv_heads
    Wq, Wk, Wv, Wo, bq, bk, bv, bo = mha_weights(rng, d, H, n_kv_heads, dh)
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
    Wq, Wk, Wv, Wo, *_ = mha_weights(rng, d, H, H, dh, biases=False)
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


def test_mha_bad_input():
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 3, 6))
    Wq, Wk, Wv, Wo, *_ = mha_weights(rng, 6, 6, 2, 2)
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
    W = mha_weights(rng, 6, 2, 2, 2)
    x = rng.standard_normal((2, 4, 6))
    dout = rng.standard_normal((2, 4, 6))
    for rope, zero in ((None, True), ("half", False)):
        out, c = mha_forward(x, x, *W, n_heads=2, mask=causal_mask(4), rope=rope)
        dbk, dbq = mha_backward(dout, c)[7], mha_backward(dout, c)[6]
        assert (np.abs(dbk).max() <= 1e-13 * np.abs(dbq).max()) == zero, rope
