"""Registry entries for attention (attention.py, scoring.py, mha.py).

Every case is small (a few hundred numbers per input at most) so that the full
finite-difference check of all of them stays fast. Queries and keys are drawn so that
scores are O(1): softmax inputs far from saturation keep finite differences accurate.
"""
import numpy as np

from ..attention import attention_backward, attention_forward, causal_mask, padding_mask
from ..mha import mha_backward, mha_forward
from ..scoring import (
    additive_attention_backward, additive_attention_forward,
    additive_scores_backward, additive_scores_forward,
    bilinear_scores_backward, bilinear_scores_forward,
    dot_scores_backward, dot_scores_forward,
    neg_sq_dist_scores_backward, neg_sq_dist_scores_forward,
    scaled_dot_scores_backward, scaled_dot_scores_forward,
)
from . import Case, OpSpec


def _normal(rng, dtype, *shape, std=1.0):
    return (std * rng.standard_normal(shape)).astype(dtype)


def _row_blocked(n_q, n_k, row):
    """A causal mask whose query ``row`` may attend to nothing."""
    m = causal_mask(n_q, n_k)
    m[row] = False
    return m


# ---------------------------------------------------------------------------------------
# scaled dot-product attention
# ---------------------------------------------------------------------------------------

def _attention_cases(rng, dtype):
    r = lambda *s: _normal(rng, dtype, *s)  # noqa: E731
    neg_inf_bias = np.where(_row_blocked(4, 4, 1), 0.0, -np.inf).astype(dtype)  # the notes' M
    alibi_like = (-0.5 * np.abs(np.arange(3)[:, None] - np.arange(5)[None, :])).astype(dtype)
    return [
        Case((r(2, 3, 7), r(2, 3, 7), r(2, 3, 7)), {}, "plain (2, 3, 7)"),
        Case((r(2, 4, 5), r(2, 4, 5), r(2, 4, 5)), {"mask": causal_mask(4)}, "causal mask"),
        Case((r(3, 2, 5), r(3, 4, 5), r(3, 4, 3)),
             {"mask": padding_mask(np.array([4, 2, 3]), 4)}, "padding mask (3, 1, 4)"),
        Case((r(2, 4, 3), r(2, 4, 3), r(2, 4, 3)), {"mask": _row_blocked(4, 4, 2)},
             "fully masked row"),
        Case((r(2, 4, 3), r(2, 4, 3), r(2, 4, 2)), {"bias": neg_inf_bias},
             "-inf bias (notes' M), one row all -inf"),
        Case((r(3, 5), r(5, 5), r(5, 5)), {"bias": alibi_like}, "finite distance bias"),
        Case((r(2, 3, 6), r(2, 4, 6), r(2, 4, 3)), {}, "d_k=6 != d_v=3"),
        Case((r(2, 2, 4), r(2, 5, 4), r(2, 5, 4)), {"mask": causal_mask(2, 5)},
             "n_q=2 != n_k=5, cached-step causal mask"),
        Case((r(2, 2, 3, 4), r(2, 2, 3, 4), r(2, 2, 3, 4)), {"mask": causal_mask(3)},
             "leading axes (2, 2)"),
        Case((r(2, 2, 3, 4), r(2, 1, 4, 4), r(2, 1, 4, 3)), {},
             "K, V broadcast over a head axis"),
        Case((r(3, 7), r(4, 7), r(4, 7)), {"scale": 0.5}, "scale=0.5 (temperature 2)"),
    ]


# ---------------------------------------------------------------------------------------
# scoring functions of 002
# ---------------------------------------------------------------------------------------

def _qk_cases(rng, dtype, std=1.0):
    r = lambda *s: _normal(rng, dtype, *s, std=std)  # noqa: E731
    return [
        Case((r(3, 7), r(4, 7)), {}, "Q (3, 7), K (4, 7)"),
        Case((r(2, 3, 5), r(2, 4, 5)), {}, "batch (2,)"),
        Case((r(2, 2, 1, 3), r(2, 2, 5, 3)), {}, "batch (2, 2), one query"),
        Case((r(2, 3, 4), r(4, 4)), {}, "keys shared over the batch"),
    ]


def _scaled_dot_cases(rng, dtype):
    cases = _qk_cases(rng, dtype)
    cases.append(Case((_normal(rng, dtype, 2, 3, 5), _normal(rng, dtype, 2, 4, 5)),
                      {"scale": 0.25}, "scale=0.25"))
    return cases


def _bilinear_cases(rng, dtype):
    r = lambda *s: _normal(rng, dtype, *s, std=0.5)  # noqa: E731
    return [
        Case((r(3, 4), r(5, 7), r(4, 7)), {}, "d_q=4, d_k=7"),
        Case((r(2, 3, 5), r(2, 4, 3), r(5, 3)), {}, "batch (2,), d_q=5, d_k=3"),
        Case((r(2, 2, 2, 3), r(2, 2, 3, 6), r(3, 6)), {}, "batch (2, 2)"),
    ]


def _additive_score_cases(rng, dtype):
    r = lambda *s: _normal(rng, dtype, *s, std=0.6)  # noqa: E731
    return [
        Case((r(3, 4), r(5, 7), r(4, 6), r(7, 6), r(6)), {}, "d_q=4, d_k=7, d_h=6"),
        Case((r(2, 3, 5), r(2, 4, 3), r(5, 4), r(3, 4), r(4)), {}, "batch (2,)"),
        Case((r(2, 2, 2, 3), r(2, 2, 3, 3), r(3, 5), r(3, 5), r(5)), {}, "batch (2, 2)"),
    ]


def _additive_attention_cases(rng, dtype):
    r = lambda *s: _normal(rng, dtype, *s, std=0.6)  # noqa: E731
    return [
        Case((r(2, 3, 4), r(2, 5, 7), r(2, 5, 7), r(4, 6), r(7, 6), r(6)), {},
             "Bahdanau: V = encoder states, d_q=4, d_k=7"),
        Case((r(3, 5), r(4, 3), r(4, 2), r(5, 4), r(3, 4), r(4)), {}, "no batch, d_v=2"),
        Case((r(2, 2, 3), r(2, 4, 3), r(2, 4, 3), r(3, 5), r(3, 5), r(5)),
             {"mask": padding_mask(np.array([4, 2]), 4)}, "source padding mask"),
        Case((r(2, 3, 3), r(2, 4, 3), r(2, 4, 2), r(3, 4), r(3, 4), r(4)),
             {"mask": _row_blocked(3, 4, 0)}, "fully masked row"),
    ]


# ---------------------------------------------------------------------------------------
# multi-head attention
# ---------------------------------------------------------------------------------------

def _mha_args(rng, dtype, batch, n_q, n_k, d_model, n_heads, n_kv_heads, d_head, *,
              biases, same_x=False):
    """x_q, x_kv and weights ~ N(0, 1/fan_in), so the scores stay O(1).

    biases: True (bq, bk, bv, bo), "no bk" (bq, bv, bo) or False (none).
    """
    x_q = _normal(rng, dtype, *batch, n_q, d_model)
    x_kv = x_q.copy() if same_x else _normal(rng, dtype, *batch, n_k, d_model)
    s_in, s_out = d_model ** -0.5, (n_heads * d_head) ** -0.5
    Wq = _normal(rng, dtype, d_model, n_heads * d_head, std=s_in)
    Wk = _normal(rng, dtype, d_model, n_kv_heads * d_head, std=s_in)
    Wv = _normal(rng, dtype, d_model, n_kv_heads * d_head, std=s_in)
    Wo = _normal(rng, dtype, n_heads * d_head, d_model, std=s_out)
    b = [_normal(rng, dtype, n, std=0.3) for n in
         (n_heads * d_head, n_kv_heads * d_head, n_kv_heads * d_head, d_model)]
    if biases == "no bk":
        # Without RoPE the key bias adds q_i . bk to every score of row i, which the softmax
        # ignores: its gradient is exactly 0 and only rounding noise is left to compare.
        b[1] = None
    elif not biases:
        b = [None] * 4
    return (x_q, x_kv, Wq, Wk, Wv, Wo, *b)


def _mha_cases(rng, dtype):
    a = lambda *p, **k: _mha_args(rng, dtype, *p, **k)  # noqa: E731
    heads_mask = np.ones((2, 3, 3), dtype=bool)
    heads_mask[1, 2] = False                                  # head 1, query 2: no key
    return [
        Case(a((2,), 4, 4, 6, 2, 2, 3, biases="no bk", same_x=True),
             {"n_heads": 2, "mask": causal_mask(4)}, "self-attention, causal, biases bq bv bo"),
        Case(a((2,), 3, 5, 6, 2, 2, 2, biases=False),
             {"n_heads": 2}, "cross-attention n_q=3, n_k=5, no biases"),
        Case(a((2,), 2, 4, 5, 3, 3, 2, biases="no bk"),
             {"n_heads": 3, "mask": padding_mask(np.array([4, 3]), 4)[:, None]},
             "cross-attention, padding mask (2, 1, 1, 4)"),
        Case(a((), 3, 3, 6, 2, 2, 2, biases="no bk", same_x=True),
             {"n_heads": 2, "mask": heads_mask}, "per-head mask, a fully masked row"),
        Case(a((2,), 3, 3, 6, 6, 2, 2, biases="no bk", same_x=True),
             {"n_heads": 6, "n_kv_heads": 2, "mask": causal_mask(3)}, "GQA 6 heads / 2 kv"),
        Case(a((1,), 3, 4, 6, 6, 1, 2, biases=False),
             {"n_heads": 6, "n_kv_heads": 1}, "MQA 6 heads / 1 kv, cross"),
        Case(a((1,), 4, 4, 6, 2, 2, 4, biases=True, same_x=True),
             {"n_heads": 2, "mask": causal_mask(4), "rope": "interleaved"},
             "RoPE interleaved, causal, all four biases"),
        Case(a((1,), 4, 4, 6, 6, 2, 2, biases=True, same_x=True),
             {"n_heads": 6, "n_kv_heads": 2, "mask": causal_mask(4), "rope": "half"},
             "RoPE half, GQA 6/2, all four biases"),
        Case(a((1,), 3, 3, 6, 6, 1, 2, biases=False, same_x=True),
             {"n_heads": 6, "n_kv_heads": 1, "rope": "half"}, "RoPE half, MQA 6/1"),
        Case(a((2,), 3, 3, 4, 2, 2, 2, biases="no bk", same_x=True),
             {"n_heads": 2, "bias": (-0.5 * np.abs(np.arange(3)[:, None] - np.arange(3))
                                     * np.array([1.0, 0.5])[:, None, None]).astype(dtype)},
             "per-head distance bias (2, 3, 3)"),
    ]


OPS = [
    OpSpec("attention", attention_forward, attention_backward, _attention_cases,
           "003 §5.1.1-5.1.2, 000 §2.1"),
    OpSpec("dot_scores", dot_scores_forward, dot_scores_backward, _qk_cases,
           "002 'Examples of attention weights'"),
    OpSpec("scaled_dot_scores", scaled_dot_scores_forward, scaled_dot_scores_backward,
           _scaled_dot_cases, "002 '(Scaled) Dot product Attention'"),
    OpSpec("neg_sq_dist_scores", neg_sq_dist_scores_forward, neg_sq_dist_scores_backward,
           lambda rng, dtype: _qk_cases(rng, dtype, std=0.7),
           "002 '(Scaled) Dot product Attention'"),
    OpSpec("bilinear_scores", bilinear_scores_forward, bilinear_scores_backward,
           _bilinear_cases, "002 'What if q and k are of different dimensions'"),
    OpSpec("additive_scores", additive_scores_forward, additive_scores_backward,
           _additive_score_cases, "002 'What if q and k are of different dimensions'"),
    OpSpec("additive_attention", additive_attention_forward, additive_attention_backward,
           _additive_attention_cases, "002 'Seq2seq meets attention'"),
    OpSpec("mha", mha_forward, mha_backward, _mha_cases,
           "003 §5.1.3, §5.2, §7.3; 004 'Multi-Head Attention'"),
]
