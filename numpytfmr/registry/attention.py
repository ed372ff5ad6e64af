"""Registry entries for attention (attention.py, scoring.py, mha.py).

Every case is small (a few hundred numbers per input at most) so that the full
finite-difference check of all of them stays fast. Queries and keys are drawn so that
scores are O(1): softmax inputs far from saturation keep finite differences accurate.
"""
import functools

import numpy as np

import copy

from ..attention import (attention_backward, attention_forward, causal_mask, padding_mask,
                         softmax_jvp, unbroadcast)
from ..mha import mha_backward, mha_forward
from ..scoring import (
    additive_attention_backward, additive_attention_forward,
    additive_scores_backward, additive_scores_forward,
    bilinear_scores_backward, bilinear_scores_forward,
    dot_scores_backward, dot_scores_forward,
    neg_sq_dist_scores_backward, neg_sq_dist_scores_forward,
    scaled_dot_scores_backward, scaled_dot_scores_forward,
)
from . import Case, OpSpec, output_with, wrong


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
        Case((r(2, 4, 3), r(2, 4, 3)), {}, "self-attention, n_q = n_k = 4 (square scores)"),
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
        Case((r(2, 3, 5), r(2, 4, 5), r(5, 5)), {}, "d_q = d_k = 5, square M"),
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


# ---------------------------------------------------------------------------------------
# Known wrong backwards (the catalogue the gradient checker names)
# ---------------------------------------------------------------------------------------

def _T(a):
    return a.swapaxes(-1, -2)


_SOFTMAX_BACKWARDS = {
    "without the subtraction": lambda A, dA: A * dA,
    "diagonal only": lambda A, dA: A * (1 - A) * dA,
}
_SOFTMAX_TEXT = {
    "without the subtraction": "the softmax backward inside attention is missing its "
                               "subtraction: dS = A * (dA - sum(dA * A, axis=-1, keepdims=True))",
    "diagonal only": "dS = A * (1 - A) * dA keeps only the diagonal of the softmax Jacobian: "
                     "dS = A * (dA - sum(dA * A, axis=-1, keepdims=True))",
}


def _attention_variant(dout, c, bug):
    Q, K, V, A, scale = c["Q"], c["K"], c["V"], c["weights"], c["scale"]
    dV = _T(A) @ dout
    dA = dout @ _T(V)
    dS = _SOFTMAX_BACKWARDS.get(bug, softmax_jvp)(A, dA)
    s = 1.0 if bug == "no scale" else scale
    dQ, dK = dS @ K * s, _T(dS) @ Q * s
    if bug == "dK not transposed":
        dK = dS @ Q * s
    elif bug == "dV not transposed":
        dV = A @ dout
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dV, V.shape)


def _att(bug, text, of=("Q", "K")):
    return wrong(bug, text, lambda dout, c: _attention_variant(dout, c, bug), ("Q", "K", "V"), of)


_ATTENTION = (_att("without the subtraction", _SOFTMAX_TEXT["without the subtraction"])
              + _att("diagonal only", _SOFTMAX_TEXT["diagonal only"])
              + _att("no scale", "S = Q K^T * scale, so dQ = dS @ K * scale and dK = dS^T @ Q "
                     "* scale: the scale is missing")
              + _att("dK not transposed", "dK = dS @ Q uses dS where its transpose belongs: "
                     "dK = dS^T @ Q * scale (keys index the columns of S)", ("K",))
              + _att("dV not transposed", "dV = A @ dout uses A where its transpose belongs: "
                     "dV = A^T @ dout (values index the columns of A)", ("V",)))


def _scores_variant(dS, c, bug, scaled):
    Q, K = c["Q"], c["K"]
    s = c["scale"] if scaled and bug != "no scale" else 1.0
    if bug == "divided by the scale":
        s = 1.0 / c["scale"]
    dQ, dK = dS @ K * s, _T(dS) @ Q * s
    if bug == "dK not transposed":
        dK = dS @ Q * s
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape)


def _sc(bug, text, of, scaled=True):
    return wrong(bug, text, lambda dS, c: _scores_variant(dS, c, bug, scaled), ("Q", "K"), of)


_TRANSPOSE_TEXT = ("dK = dS @ Q uses dS where its transpose belongs: the keys index the "
                   "columns of S, so dK = dS^T @ Q")
_DOT_SCORES = _sc("dK not transposed", _TRANSPOSE_TEXT, ("K",), scaled=False)
_SCALED_DOT_SCORES = (_sc("dK not transposed", _TRANSPOSE_TEXT + " * scale", ("K",))
                      + _sc("no scale", "S = scale Q K^T, so both gradients carry the scale: "
                            "dQ = scale dS K, dK = scale dS^T Q", ("Q", "K"))
                      + _sc("divided by the scale", "the gradients are divided by the scale "
                            "(multiplied by sqrt(d_k)) where the forward multiplies: dQ = scale "
                            "dS K, dK = scale dS^T Q", ("Q", "K")))


def _neg_sq_dist_variant(dS, c, bug):
    Q, K, diff = c["Q"], c["K"], c["diff"]
    g = dS[..., None] * diff
    dQ, dK = -g.sum(axis=-2), g.sum(axis=-3)
    if bug == "2 kept":
        dQ, dK = 2 * dQ, 2 * dK
    elif bug == "same sign":
        dK = -dK
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape)


_NEG_SQ_DIST_SCORES = (
    wrong("the 2 of the square kept", "S = -||q - k||^2 / 2: the 1/2 cancels the 2 of the "
          "square, so dq_t = -sum_s dS_ts (q_t - k_s) with no factor 2",
          lambda dS, c: _neg_sq_dist_variant(dS, c, "2 kept"), ("Q", "K"), ("Q", "K"))
    + wrong("dK with dQ's sign", "q - k enters with opposite signs: dk_s = +sum_t dS_ts "
            "(q_t - k_s), the negative of dQ's form", lambda dS, c: _neg_sq_dist_variant(
                dS, c, "same sign"), ("Q", "K"), ("K",)))


def _bilinear_variant(dS, c, bug):
    Q, K, M, QM = c["Q"], c["K"], c["M"], c["QM"]
    dQM = dS @ K
    dK = _T(dS) @ (Q if bug == "M left out of dK" else QM)
    dQ = dQM @ (M if bug == "M not transposed" else _T(M))
    dM = _T(Q) @ dQM
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dM, M.shape)


_BILINEAR_SCORES = (
    wrong("M left out of dK", "the keys meet Q M, not Q: dK = dS^T @ (Q @ M)",
          lambda dS, c: _bilinear_variant(dS, c, "M left out of dK"), ("Q", "K", "M"), ("K",))
    + wrong("M not transposed", "for Q M, dQ = d(QM) @ M^T: M is used untransposed",
            lambda dS, c: _bilinear_variant(dS, c, "M not transposed"), ("Q", "K", "M"), ("Q",)))


def _additive_variant(dS, c, bug):
    Q, K, Wq, Wk, w, T = (c[k] for k in ("Q", "K", "Wq", "Wk", "w", "T"))
    dT = dS[..., None] * w
    dw = (dS[..., None] * T).reshape(-1, w.shape[0]).sum(axis=0)
    dP = {"no tanh": dT, "1 - T": dT * (1.0 - T)}.get(bug, dT * (1.0 - T * T))
    dHq, dHk = dP.sum(axis=-2), dP.sum(axis=-3)
    dQ, dK = dHq @ _T(Wq), dHk @ _T(Wk)
    dWq, dWk = _T(Q) @ dHq, _T(K) @ dHk
    return (unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dWq, Wq.shape),
            unbroadcast(dWk, Wk.shape), dw)


_ADDITIVE_NAMES = ("Q", "K", "Wq", "Wk", "w")
_ADDITIVE_SCORES = (
    wrong("tanh derivative left out", "T = tanh(P), so dP = dT * (1 - T^2) before the sums "
          "over keys and queries", lambda dS, c: _additive_variant(dS, c, "no tanh"),
          _ADDITIVE_NAMES, ("Q", "K", "Wq", "Wk"))
    + wrong("tanh derivative as 1 - T", "tanh'(P) = 1 - tanh(P)^2 = 1 - T^2, not 1 - T",
            lambda dS, c: _additive_variant(dS, c, "1 - T"), _ADDITIVE_NAMES,
            ("Q", "K", "Wq", "Wk")))


def _additive_attention_variant(dout, c, bug):
    A, V = c["weights"], c["V"]
    dV = _T(A) @ dout
    dA = dout @ _T(V)
    da = _SOFTMAX_BACKWARDS.get(bug, softmax_jvp)(A, dA)
    da = unbroadcast(da, c["scores"]["T"].shape[:-1])
    dq, dK, dWq, dWk, dw = _additive_variant(da, c["scores"], bug)
    return dq, dK, unbroadcast(dV, V.shape), dWq, dWk, dw


_ADDITIVE_ATTENTION = tuple(
    m for bug in ("without the subtraction", "diagonal only", "no tanh")
    for m in wrong(bug if bug != "no tanh" else "tanh derivative left out",
                   _SOFTMAX_TEXT.get(bug, "the scores are w . tanh(P): dP = dT * (1 - T^2) "
                                          "before the sums over keys and queries"),
                   functools.partial(lambda dout, c, bug: _additive_attention_variant(dout, c, bug),
                                     bug=bug),
                   ("q", "K", "V", "Wq", "Wk", "w"),
                   # without tanh the score is linear in q, the same for every key of a
                   # row: softmax ignores it, and dq, dWq are 0 in both gradients
                   ("q", "K", "Wq", "Wk", "w") if bug != "no tanh" else ("K", "Wk")))


def _mha_with(change):
    """mha_backward on a copy of the cache changed by ``change(cache)``."""
    def backward(dout, cache):
        cache = copy.copy(cache)
        change(cache)
        return mha_backward(dout, cache)
    return backward


def _sub(cache, key, **values):
    sub = copy.copy(cache[key])
    sub.update(values)
    cache[key] = sub


def _no_rope(cache):
    if cache["rope"] is None:
        raise ValueError("no RoPE")
    cache["rope"] = None


_MHA_NAMES = ("x_q", "x_kv", "Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")
_MHA = (
    wrong("attention scale left out", "the scores are scaled by 1/sqrt(d_head): dQ and dK of "
          "every head carry that scale", _mha_with(lambda c: _sub(c, "attn", scale=1.0)),
          _MHA_NAMES, ("x_q", "x_kv", "Wq", "Wk", "bq"))
    + wrong("RoPE not undone", "the queries and keys were rotated after the projections, so "
            "their gradients must be rotated back (rope_backward) before the projections' "
            "backward", _mha_with(_no_rope), _MHA_NAMES, ("x_q", "x_kv", "Wq", "Wk", "bq"))
    + wrong("x_kv through the keys only", "x_kv feeds both K and V: dx_kv = dK_proj + dV_proj, "
            "the sum of both paths",
            _mha_with(lambda c: _sub(c, "v", W=np.zeros_like(c["v"]["W"]))), _MHA_NAMES, ("x_kv",))
    + wrong("x_kv through the values only", "x_kv feeds both K and V: dx_kv = dK_proj + "
            "dV_proj, the sum of both paths",
            _mha_with(lambda c: _sub(c, "k", W=np.zeros_like(c["k"]["W"]))),
            _MHA_NAMES, ("x_kv",)))


# ---------------------------------------------------------------------------------------
# The options a forward written independently of the package may compute (the recogniser of
# checking/recognise.py runs the op with each, the usual ones first)
# ---------------------------------------------------------------------------------------

def _masks(Q, K):
    """No mask, then the causal mask of the queries and keys (when there are as many keys)."""
    n_q, n_k = np.shape(Q)[-2], np.shape(K)[-2]
    return [None] + ([causal_mask(n_q, n_k)] if n_k >= n_q > 1 else [])


def _attention_options(inputs, out):
    return [{"mask": m} for m in _masks(inputs[0], inputs[1])]


def _mha_options(inputs, out):
    """Every head count that divides the projections, without and with a causal mask and
    RoPE (positions 0..n-1)."""
    x_q, x_kv, Wq, Wk = inputs[:4]
    width, kv_width = np.shape(Wq)[-1], np.shape(Wk)[-1]
    found = []
    for n_heads in range(1, width + 1):
        if width % n_heads:
            continue
        d_head = width // n_heads
        if kv_width % d_head:
            continue
        ropes = [None] + (["interleaved", "half"] if d_head % 2 == 0 else [])
        for rope in ropes:
            for mask in _masks(x_q, x_kv):
                found.append({"n_heads": n_heads, "n_kv_heads": kv_width // d_head, "mask": mask,
                              "rope": rope})
    return found[:36]


# ---------------------------------------------------------------------------------------
# Named wrong forwards (OpSpec.slips) and grading-only cases (OpSpec.extra_cases)
# ---------------------------------------------------------------------------------------

def _attention_over_queries(Q, K, V, scale):
    S = (Q @ np.swapaxes(K, -1, -2)) * scale
    S = S - S.max(axis=-2, keepdims=True)
    A = np.exp(S)
    A = A / A.sum(axis=-2, keepdims=True)
    return A @ V


def attention_slips(forward, args, kwargs):
    """Scaled dot-product attention's usual wrong forwards (also flash attention's)."""
    if kwargs.get("scale") is not None:
        return []
    ref = output_with(forward, kwargs)
    d_k = args[0].shape[-1]
    out = [("a constant factor in the scores: the 1/sqrt(d_k) scaling is missing (your output "
            "equals the expected output with scale = 1); scores are Q K^T / sqrt(d_k)",
            lambda: ref(*args, scale=1.0)),
           ("the scores are divided by d_k instead of sqrt(d_k)",
            lambda: ref(*args, scale=1.0 / d_k))]
    if kwargs.get("mask") is None and kwargs.get("bias") is None:
        out.append(("the softmax runs over the queries (axis -2) instead of over the keys (axis -1); "
                    "each row of weights, one per query, must sum to 1",
                    lambda: _attention_over_queries(*args[:3], 1.0 / np.sqrt(d_k))))
    return out


def _causal(n_q, n_k):
    return np.arange(n_k)[None, :] <= (n_k - n_q) + np.arange(n_q)[:, None]


def _mha_extra(rng, dtype):
    """mha's KV-cached step, per-sequence RoPE positions and given frequencies."""
    def n(*shape, std=1.0):
        return (std * rng.standard_normal(shape)).astype(dtype)

    def weights(d_model, H, H_kv, d_head, biases):
        s_in, s_out = d_model ** -0.5, (H * d_head) ** -0.5
        W = [n(d_model, H * d_head, std=s_in), n(d_model, H_kv * d_head, std=s_in),
             n(d_model, H_kv * d_head, std=s_in), n(H * d_head, d_model, std=s_out)]
        b = [n(H * d_head, std=0.3), n(H_kv * d_head, std=0.3), n(H_kv * d_head, std=0.3),
             n(d_model, std=0.3)]
        if biases == "no bk":        # without RoPE the key bias has an exactly zero gradient
            b[1] = None
        return W + b

    x1 = n(2, 1, 6)
    x2 = n(2, 2, 6)
    x3 = n(2, 4, 6)
    positions = np.array([[0, 1, 2, 3], [5, 6, 7, 8]])
    return [
        Case((x1, x1.copy(), *weights(6, 4, 2, 2, True)),
             {"n_heads": 4, "n_kv_heads": 2, "rope": "half", "mask": _causal(1, 4),
              "kv_cache": {"k": n(2, 2, 3, 2), "v": n(2, 2, 3, 2)}},
             "KV-cached step: 1 new token after 3 cached, RoPE half, GQA 4/2"),
        Case((x2, x2.copy(), *weights(6, 2, 2, 3, "no bk")),
             {"n_heads": 2, "mask": _causal(2, 5), "scale": 0.4,
              "kv_cache": {"k": n(2, 2, 3, 3), "v": n(2, 2, 3, 3)}},
             "KV-cached step: 2 new tokens after 3 cached, causal (2, 5), scale 0.4"),
        Case((x3, x3.copy(), *weights(6, 2, 2, 2, True)),
             {"n_heads": 2, "mask": _causal(4, 4),
              "rope": {"layout": "interleaved", "base": 100.0, "positions_q": positions,
                       "positions_k": positions}},
             "RoPE dict: per-sequence positions (2, 4), base 100"),
        Case((n(1, 3, 6), n(1, 5, 6), *weights(6, 2, 1, 4, True)),
             {"n_heads": 2, "n_kv_heads": 1,
              "rope": {"layout": "half", "freqs": np.array([0.9, 0.2]),
                       "positions_q": np.array([2, 3, 4])}},
             "RoPE dict: given freqs, query positions 2..4, cross-attention MQA"),
    ]

OPS = [
    OpSpec("attention", attention_forward, attention_backward, _attention_cases,
           "003 §5.1.1-5.1.2, 000 §2.1", mistakes=_ATTENTION,
           options=_attention_options, tune=(("scale", 1e-3, 1e3),), slips=attention_slips),
    OpSpec("dot_scores", dot_scores_forward, dot_scores_backward, _qk_cases,
           "002 'Examples of attention weights'", mistakes=_DOT_SCORES),
    OpSpec("scaled_dot_scores", scaled_dot_scores_forward, scaled_dot_scores_backward,
           _scaled_dot_cases, "002 '(Scaled) Dot product Attention'", mistakes=_SCALED_DOT_SCORES,
           tune=(("scale", 1e-3, 1e3),)),
    OpSpec("neg_sq_dist_scores", neg_sq_dist_scores_forward, neg_sq_dist_scores_backward,
           lambda rng, dtype: _qk_cases(rng, dtype, std=0.7),
           "002 '(Scaled) Dot product Attention'", mistakes=_NEG_SQ_DIST_SCORES),
    OpSpec("bilinear_scores", bilinear_scores_forward, bilinear_scores_backward,
           _bilinear_cases, "002 'What if q and k are of different dimensions'",
           mistakes=_BILINEAR_SCORES),
    OpSpec("additive_scores", additive_scores_forward, additive_scores_backward,
           _additive_score_cases, "002 'What if q and k are of different dimensions'",
           mistakes=_ADDITIVE_SCORES),
    OpSpec("additive_attention", additive_attention_forward, additive_attention_backward,
           _additive_attention_cases, "002 'Seq2seq meets attention'",
           mistakes=_ADDITIVE_ATTENTION),
    OpSpec("mha", mha_forward, mha_backward, _mha_cases,
           "003 §5.1.3, §5.2, §7.3; 004 'Multi-Head Attention'", mistakes=_MHA,
           options=_mha_options, extra_cases=_mha_extra),
]
