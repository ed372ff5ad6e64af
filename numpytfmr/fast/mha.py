"""Multi-head attention without the GQA copies: :func:`mha_forward` and :func:`mha_backward`
give the numbers of ``numpytfmr.mha_forward`` / ``mha_backward`` (tests/test_fast.py: 1e-12
in float64), with the same contract and the same cache keys.

The reference repeats each key/value head for the ``group`` query heads that share it
(``repeat_kv``). Here the query heads are grouped instead, (..., H, n, d) ->
(..., n_kv_heads, group, n, d), and each group broadcasts against its one key/value head
(..., n_kv_heads, 1, n_k, d): the repeated keys and values are never built, and their
gradient is the broadcast's sum over the group, done by the product itself.
"""
from ..attention import attention_backward, attention_forward
from ..contract import backward_of, op
from ..linear import linear_backward, linear_forward
from .. import mha as reference
from ..mha import kv_cache_append, merge_heads, split_heads
from ..positional import rope_backward, rope_forward

__all__ = ["group_heads", "ungroup_heads", "mha_forward", "mha_backward"]

_CONTRACT = reference.mha_forward.__contract__


def group_heads(x, n_kv_heads):
    """Group the query heads for GQA: (..., H, n, m) -> (..., n_kv_heads, group, n, m).

    Query head h = g * group + j lands at [g, j], beside the other heads that share key/value
    head g. Also takes a mask or bias whose head axis has size 1 (or that has no head axis):
    it becomes (..., 1, 1, n, m) and broadcasts over both. None stays None.
    """
    if x is None:
        return None
    if x.ndim < 3:
        x = x.reshape((1,) * (3 - x.ndim) + x.shape)       # add a head axis of size 1
    if x.shape[-3] == 1:
        return x[..., None, :, :]                           # (..., 1, 1, n, m)
    return x.reshape(x.shape[:-3] + (n_kv_heads, x.shape[-3] // n_kv_heads) + x.shape[-2:])


def ungroup_heads(x):
    """The inverse of :func:`group_heads`: (..., n_kv_heads, group, n, m) -> (..., H, n, m)."""
    return x.reshape(x.shape[:-4] + (x.shape[-4] * x.shape[-3],) + x.shape[-2:])


@op(*(s.text for s in _CONTRACT.arrays), **_CONTRACT.options)
def mha_forward(x_q, x_kv, Wq, Wk, Wv, Wo, bq=None, bk=None, bv=None, bo=None, *,
                n_heads, n_kv_heads=None, mask=None, bias=None, rope=None, kv_cache=None,
                scale=None):
    """``numpytfmr.mha_forward``, the GQA groups broadcast instead of repeated."""
    H, H_kv = n_heads, n_kv_heads
    Q, c_q = linear_forward(x_q, Wq, bq)
    K, c_k = linear_forward(x_kv, Wk, bk)
    V, c_v = linear_forward(x_kv, Wv, bv)
    Q, K, V = split_heads(Q, H), split_heads(K, H_kv), split_heads(V, H_kv)
    c_rope = None
    if rope is not None:
        Q, c_rope_q = rope_forward(Q, **rope["q"])
        K, c_rope_k = rope_forward(K, **rope["k"])
        c_rope = (c_rope_q, c_rope_k)
    T_past = 0 if kv_cache is None else kv_cache["k"].shape[-2]
    grown = kv_cache_append(kv_cache, K, V)
    heads, c_attn = attention_forward(group_heads(Q, H_kv), grown["k"][..., None, :, :],
                                      grown["v"][..., None, :, :], mask=group_heads(mask, H_kv),
                                      bias=group_heads(bias, H_kv), scale=scale)
    concat = merge_heads(ungroup_heads(heads))
    out, c_o = linear_forward(concat, Wo, bo)
    return out, {"weights": ungroup_heads(c_attn["weights"]), "kv_cache": grown,
                 "x_q": x_q, "x_kv": x_kv, "concat": concat, "q": c_q, "k": c_k, "v": c_v,
                 "rope": c_rope, "attn": c_attn, "o": c_o, "T_past": T_past,
                 "n_heads": H, "n_kv_heads": H_kv}


@backward_of(mha_forward)
def mha_backward(dout, cache):
    """``numpytfmr.mha_backward`` for :func:`mha_forward`'s cache."""
    H, H_kv, T_past = cache["n_heads"], cache["n_kv_heads"], cache["T_past"]
    dconcat, dWo, dbo = linear_backward(dout, cache["o"])
    dheads = group_heads(split_heads(dconcat, H), H_kv)
    dQ, dK, dV = attention_backward(dheads, cache["attn"])   # dK, dV summed over each group
    dQ = ungroup_heads(dQ)
    dK, dV = dK[..., 0, T_past:, :], dV[..., 0, T_past:, :]
    if cache["rope"] is not None:
        dQ = rope_backward(dQ, cache["rope"][0])
        dK = rope_backward(dK, cache["rope"][1])
    dx_q, dWq, dbq = linear_backward(merge_heads(dQ), cache["q"])
    dx_k, dWk, dbk = linear_backward(merge_heads(dK), cache["k"])
    dx_v, dWv, dbv = linear_backward(merge_heads(dV), cache["v"])
    return dx_q, dx_k + dx_v, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo
