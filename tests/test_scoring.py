"""numpytfmr/scoring.py: the slides' scoring functions (002): dot, scaled dot, negative
distance, bilinear, additive (Bahdanau), and additive attention.
"""
import numpy as np

from numpytfmr import (
    additive_attention_forward, additive_scores_forward, bilinear_scores_forward,
    dot_scores_forward, neg_sq_dist_scores_forward, padding_mask, scaled_dot_scores_forward,
)

from conftest import assert_attention_gradients


def test_additive_attention_gradients_with_values_batched_beyond_queries_and_keys():
    """q and K shared by two sets of values: the scores (n_q, n_k) get the weights' batch
    axis only through V, and their gradient is summed back over it."""
    rng = np.random.default_rng(23)
    q, K, V = rng.standard_normal((3, 4)), rng.standard_normal((5, 3)), rng.standard_normal((2, 5, 2))
    Wq, Wk, w = (0.6 * rng.standard_normal(s) for s in ((4, 6), (3, 6), (6,)))
    mask = rng.random((2, 3, 5)) < 0.7
    mask[..., 0] = True
    assert_attention_gradients(additive_attention_forward, {"mask": mask}, (q, K, V, Wq, Wk, w))


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
