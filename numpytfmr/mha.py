"""Multi-head attention: self-, cross-, grouped-query (GQA) and multi-query (MQA) attention,
with optional RoPE on queries and keys and an optional KV cache.

Covers 003 §5.1.3 (multi-head attention), §5.2 (MQA/GQA), §6.2 (KV caching), §7.3 (RoPE
inside attention), 000 §2.1.3, §2.2, §2.5, 001 §2.1-2.2 (the (B, h, T, d_k) cache), 004
"Multi-Head Attention", "Sequence-Tensor Form" and "Cross-Attention".

    Q_i = X W_i^Q,   K_i = X W_i^K,   V_i = X W_i^V           (project, split into heads)
    head_i = softmax(Q_i K_i^T / sqrt(d_k) + M) V_i           (each head's attention)
    MultiHead = Concat(head_1, ..., head_h) W^O               (concatenate, project)

The forward is these steps as op calls (linear, split into heads, RoPE, the KV cache,
attention, concatenation, linear) and the backward is the same sequence reversed. The
heads are not computed in a loop: ``split_heads`` reshapes each projection into a head axis
and one ``attention_forward`` call runs every head. With GQA/MQA each key/value head serves
a group of query heads: the reference repeats it for each (``repeat_kv``), as the notes
draw it; ``numpytfmr.fast.mha_forward`` gets the same numbers without building the copies.

The KV cache (003 §6.2) grows in one place, :func:`kv_cache_append`: each call appends
the new positions' keys and values to the cached ones and returns the longer cache.
"""
import numpy as np

from .attention import attention_backward, attention_forward
from .contract import (backward_of, broadcastable_to, count, describe, float_array, op,
                       optional, real)
from .linear import linear_backward, linear_forward
from .positional import rope_backward, rope_forward, rope_frequencies

__all__ = ["split_heads", "merge_heads", "repeat_kv", "repeat_kv_backward", "kv_cache_append",
           "mha_forward", "mha_backward"]

_ROPE_KEYS = ("layout", "base", "freqs", "scaling", "positions_q", "positions_k")


# ---------------------------------------------------------------------------------------
# Heads: split, merge, group (GQA)
# ---------------------------------------------------------------------------------------

def split_heads(x, n_heads):
    """Split the last axis into heads (004 "Sequence-Tensor Form").

        (..., n, h*d)  --reshape-->  (..., n, h, d)  --swap-->  (..., h, n, d)

    Head ``i`` takes columns ``i*d .. (i+1)*d - 1``, i.e. the block of W_i^Q inside the
    concatenated ``Wq = [W_1^Q | ... | W_h^Q]`` (003 §5.1.3).
    """
    where = "split_heads"
    x = np.asarray(x)
    n_heads = count(n_heads, "n_heads", where)
    if x.ndim < 2:
        raise ValueError(f"{where}: x has shape {x.shape}; expected at least 2 axes "
                         "(..., n, n_heads * d_head)")
    if x.shape[-1] % n_heads:
        raise ValueError(f"{where}: x has shape {x.shape}; its last axis {x.shape[-1]} is not "
                         f"divisible by n_heads={n_heads}")
    d_head = x.shape[-1] // n_heads
    return x.reshape(x.shape[:-1] + (n_heads, d_head)).swapaxes(-3, -2)


def merge_heads(x):
    """Concatenate the heads back (003 §5.1.3 Concat(head_1, ..., head_h)).

        (..., h, n, d)  --swap-->  (..., n, h, d)  --reshape-->  (..., n, h*d)
    """
    x = np.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"merge_heads: x has shape {x.shape}; expected at least 3 axes "
                         "(..., n_heads, n, d_head)")
    x = x.swapaxes(-3, -2)
    return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def repeat_kv(x, group):
    """GQA/MQA (003 §5.2): each key/value head serves ``group`` query heads, so it is repeated
    for each of them.

        (..., n_kv_heads, n, d)  ->  (..., n_kv_heads * group, n, d),   head g*group + j = head g

    ``group = 1`` is plain multi-head attention (every query head has its own keys/values).
    """
    return np.repeat(x, group, axis=-3)


def repeat_kv_backward(dx, group):
    """The gradient of :func:`repeat_kv`: each key/value head collects the gradients of its
    ``group`` copies.  (..., n_kv_heads * group, n, d) -> (..., n_kv_heads, n, d)."""
    return dx.reshape(dx.shape[:-3] + (dx.shape[-3] // group, group) + dx.shape[-2:]).sum(axis=-3)


def kv_cache_append(kv_cache, K, V):
    """The KV cache, one call longer (003 §6.2, 000 §2.5.1, 001 §2.2).

        prompt (T tokens):     cache = (K_{1..T}, V_{1..T})
        each next token t:     cache = ([K_cache; k_t], [V_cache; v_t])

    kv_cache: None (nothing cached yet) or {"k", "v"}: (..., n_kv_heads, T_past, d_head)
    K, V: the new positions' keys (after RoPE) and values (..., n_kv_heads, n, d_head)
    ->  {"k", "v"}: (..., n_kv_heads, T_past + n, d_head), a new dict (the old one is kept).
    A decoding step computes the keys and values of its new token only: the earlier ones
    are read back from here instead of being computed again.
    """
    if kv_cache is None:
        return {"k": K, "v": V}
    return {"k": np.concatenate([kv_cache["k"], K], axis=-2),    # K = [K_cache; K_new]
            "v": np.concatenate([kv_cache["v"], V], axis=-2)}    # V = [V_cache; V_new]


# ---------------------------------------------------------------------------------------
# Option checks of mha_forward (validators: value, name, where, checked args -> value)
# ---------------------------------------------------------------------------------------

def _same_batch_as_x_q(x_kv, name, where, args):
    """x_kv has exactly the leading (batch) axes of x_q."""
    x_q = args["x_q"]
    if x_kv.shape[:-2] != x_q.shape[:-2]:
        raise ValueError(f"{where}: x_kv has shape {x_kv.shape} but x_q has shape {x_q.shape}; "
                         "the leading (batch) axes must match")
    return x_kv


def _heads_of_Wq(H, name, where, args):
    """A positive integer dividing the n_heads * d_head columns of Wq."""
    H = count(H, name, where)
    Wq = args["Wq"]
    if Wq.shape[1] % H:
        raise ValueError(f"{where}: Wq has shape {Wq.shape}; its {Wq.shape[1]} columns are not "
                         f"divisible by n_heads={H} (expected n_heads*d_head columns)")
    return H


def _kv_heads(H_kv, name, where, args):
    """None (= n_heads) or a divisor of n_heads; Wk and Wv then have n_kv_heads*d_head columns."""
    H = args["n_heads"]
    H_kv = H if H_kv is None else count(H_kv, name, where)
    if H % H_kv:
        raise ValueError(f"{where}: n_heads={H} is not divisible by n_kv_heads={H_kv}; each "
                         "key/value head must serve the same number of query heads")
    d_head = args["Wq"].shape[1] // H
    expected = (args["x_kv"].shape[-1], H_kv * d_head)
    if args["Wk"].shape != expected:                        # Wv has Wk's shape (the contract)
        raise ValueError(f"{where}: Wk has shape {args['Wk'].shape}; expected {expected} = (d_kv, "
                         f"n_kv_heads*d_head) with d_kv from x_kv and d_head={d_head} from Wq")
    return H_kv


def _kv_cache_option(kv, name, where, args):
    """None, or {"k", "v"}: past keys (after RoPE) and values (..., n_kv_heads, T_past, d_head),
    returned as a new dict in the inputs' dtype."""
    if kv is None:
        return None
    if not isinstance(kv, dict) or set(kv) != {"k", "v"}:
        raise TypeError(f"{where}: kv_cache is {describe(kv)}; expected None or a dict with keys "
                        "'k' and 'v'")
    batch, H_kv = args["x_q"].shape[:-2], args["n_kv_heads"]
    d_head = args["Wq"].shape[1] // args["n_heads"]
    past = {n: float_array(kv[n], f"kv_cache['{n}']", where) for n in ("k", "v")}
    for n, a in past.items():
        if a.ndim != len(batch) + 3 or a.shape[:-2] != batch + (H_kv,) or a.shape[-1] != d_head:
            raise ValueError(f"{where}: kv_cache['{n}'] has shape {a.shape}; expected "
                             f"{batch + (H_kv, 'T_past', d_head)} (batch, n_kv_heads, T_past, "
                             "d_head)")
    if past["k"].shape != past["v"].shape:
        raise ValueError(f"{where}: kv_cache['k'] has shape {past['k'].shape} but kv_cache['v'] "
                         f"has shape {past['v'].shape}; they must match")
    return {n: a.astype(args["x_q"].dtype, copy=False) for n, a in past.items()}


def _past_length(args):
    """T_past: the number of cached positions (0 without a cache)."""
    return 0 if args["kv_cache"] is None else args["kv_cache"]["k"].shape[-2]


def _scores_shape(args):
    """The scores' shape (..., n_heads, n_q, n_k); n_k counts the cached keys too."""
    x_q, n_k = args["x_q"], _past_length(args) + args["x_kv"].shape[-2]
    return x_q.shape[:-2] + (args["n_heads"], x_q.shape[-2], n_k)


_scores_shaped = broadcastable_to(
    _scores_shape, "(..., n_heads, n_q, n_k)", to="the scores' shape ",
    doc="None, or an array broadcastable to the scores (..., n_heads, n_q, n_k) without "
        "enlarging them; n_k counts the cached keys too.")


def _score_bias(bias, name, where, args):
    """None, or a float bias broadcastable to the scores, in the inputs' dtype."""
    if bias is None:
        return None
    bias = _scores_shaped(float_array(bias, name, where), name, where, args)
    return bias.astype(args["x_q"].dtype, copy=False)


def _head_positions(pos, default, n, name, where):
    """Positions for a (..., heads, n, d) tensor: (n,) as given, (..., n) gets a head axis."""
    if pos is None:
        return default
    pos = np.asarray(pos)
    if pos.ndim == 0 or pos.shape[-1] != n:
        raise ValueError(f"{where}: rope['{name}'] has shape {pos.shape}; expected ({n},) or "
                         f"(..., {n}) per batch item")
    return pos if pos.ndim == 1 else pos[..., None, :]      # (..., n) -> (..., 1, n): one per head


def _rope_option(rope, name, where, args):
    """None, a layout string ("interleaved" or "half") or a dict with keys among _ROPE_KEYS.

    Returns the keyword arguments of ``rope_forward`` for the queries ("q") and for the new
    keys ("k"): positions T_past + 0, 1, ... unless given; frequencies from "scaling" when
    "freqs" is absent.
    """
    if rope is None:
        return None
    if isinstance(rope, str):
        rope = {"layout": rope}
    if not isinstance(rope, dict):
        raise TypeError(f"{where}: rope is {rope!r}; expected None, a layout string "
                        "('interleaved' or 'half') or a dict with keys " + ", ".join(_ROPE_KEYS))
    unknown = sorted(set(rope) - set(_ROPE_KEYS))
    if unknown:
        raise ValueError(f"{where}: rope has unknown keys {unknown}; expected keys among "
                         + ", ".join(_ROPE_KEYS))
    base, freqs = rope.get("base", 10000.0), rope.get("freqs")
    if freqs is None and rope.get("scaling") is not None:
        freqs = rope_frequencies(args["Wq"].shape[1] // args["n_heads"], base=base,
                                 scaling=rope["scaling"])
    common = {"freqs": freqs, "base": base, "layout": rope.get("layout", "interleaved")}
    T_past, n_q, n_new = _past_length(args), args["x_q"].shape[-2], args["x_kv"].shape[-2]
    pos_q = _head_positions(rope.get("positions_q"), T_past + np.arange(n_q), n_q, "positions_q",
                            where)
    pos_k = _head_positions(rope.get("positions_k"), T_past + np.arange(n_new), n_new,
                            "positions_k", where)
    return {"q": dict(common, positions=pos_q), "k": dict(common, positions=pos_k)}


# ---------------------------------------------------------------------------------------
# Multi-head attention
# ---------------------------------------------------------------------------------------

@op("x_q: (..., n_q, d_model)", "x_kv: (..., n_k, d_kv)", "Wq: (d_model, hd_q)",
    "Wk: (d_kv, hd_kv)", "Wv: (d_kv, hd_kv)", "Wo: (hd_q, d_out)", "bq: (hd_q,)?", "bk: (hd_kv,)?",
    "bv: (hd_kv,)?", "bo: (d_out,)?", "mask: bool (...)?", "bias: any (...)?",
    x_kv=_same_batch_as_x_q, n_heads=_heads_of_Wq, n_kv_heads=_kv_heads, kv_cache=_kv_cache_option,
    mask=_scores_shaped, bias=_score_bias, rope=_rope_option, scale=optional(real))
def mha_forward(x_q, x_kv, Wq, Wk, Wv, Wo, bq=None, bk=None, bv=None, bo=None, *,
                n_heads, n_kv_heads=None, mask=None, bias=None, rope=None, kv_cache=None,
                scale=None):
    """Multi-head attention with GQA/MQA, RoPE and a KV cache (003 §5.1.3, §5.2, §6.2, §7.3).

        Q = x_q Wq + bq,   K = x_kv Wk + bk,   V = x_kv Wv + bv      (project)
        Q_i, K_i, V_i: the columns of head i                       (split into heads)
        Q_i, K_i = RoPE(Q_i), RoPE(K_i)                            (if ``rope``)
        K, V = [K_cache; K], [V_cache; V]                          (if ``kv_cache``)
        K_i, V_i = K_{g(i)}, V_{g(i)},   g(i) = i // (n_heads / n_kv_heads)     (GQA, MQA)
        head_i = softmax(Q_i K_i^T * scale + M) V_i                (each head's attention)
        out = Concat(head_1, ..., head_H) Wo + bo                  (concatenate, project)

    x_q: (..., n_q, d_model)     x_kv: (..., n_k, d_kv) (same leading axes; d_kv is usually
        d_model). Self-attention passes the same array twice and adds the two input
        gradients; cross-attention passes the encoder output as x_kv (004 "Cross-Attention").
    Wq: (d_model, n_heads*d_head)   Wk, Wv: (d_kv, n_kv_heads*d_head)
    Wo: (n_heads*d_head, d_out)     bq: (n_heads*d_head,)   bk, bv: (n_kv_heads*d_head,)
    bo: (d_out,)    ->  out: (..., n_q, d_out)
    n_heads, n_kv_heads: n_kv_heads defaults to n_heads (MHA); 1 is MQA, in between GQA.
    mask / bias: as in :func:`attention_forward`, broadcastable to (..., n_heads, n_q, n_k)
        where n_k counts the cached keys too (``causal_mask(n_q, T_past + n_q)``). A
        key-padding mask needs the head axis: ``padding_mask(lengths[:, None], n_k)`` is
        (B, 1, 1, n_k); the (B, 1, n_k) form would line B up with the head axis.
    scale: defaults to 1/sqrt(d_head) (multiply by ``yarn_attention_scale`` for YaRN).
    rope: None, a layout string ("interleaved" or "half"), or a dict with optional keys
        "layout" ("interleaved"), "base" (10000.0), "freqs" ((d_head/2,) frequencies),
        "scaling" (passed to ``rope_frequencies`` when "freqs" is absent),
        "positions_q" ((n_q,) or (..., n_q)), "positions_k" ((n_k,) or (..., n_k)).
        Positions default to T_past + arange(n) (T_past = cached length). RoPE rotates the
        per-head queries and the new keys; cached keys are stored already rotated.
    kv_cache: None or {"k": (..., n_kv_heads, T_past, d_head), "v": (..., n_kv_heads,
        T_past, d_head)}: the past keys (after RoPE) and values, cast to the inputs' dtype.
        It is never modified.

    cache keys: "weights" (..., n_heads, n_q, n_k) attention weights; "kv_cache" a new dict
    {"k", "v"} with the past and the new keys/values (..., n_kv_heads, T_past + n_k_new,
    d_head) for the next decoding step (also returned when ``kv_cache`` is None);
    "x_q", "x_kv" (the inputs), "concat" (the merged heads, (..., n_q, n_heads*d_head));
    and the caches of the steps, for the backward: "q", "k", "v", "o" (linear_forward),
    "rope" (None or the rope_forward caches of queries and keys), "attn" (attention_forward),
    "T_past", "n_heads", "n_kv_heads".
    The backward works after a cached forward too: the cached keys/values are constants.
    """
    H, group = n_heads, n_heads // n_kv_heads
    Q, c_q = linear_forward(x_q, Wq, bq)            # Q = x_q W^Q + b^Q   (003 §5.1.3)
    K, c_k = linear_forward(x_kv, Wk, bk)           # K = x_kv W^K + b^K
    V, c_v = linear_forward(x_kv, Wv, bv)           # V = x_kv W^V + b^V
    Q = split_heads(Q, H)                           # Q_i = X W_i^Q: (..., H, n_q, d_head)
    K = split_heads(K, n_kv_heads)                  # K_i = X W_i^K: (..., H_kv, n_k, d_head)
    V = split_heads(V, n_kv_heads)                  # V_i = X W_i^V
    c_rope = None
    if rope is not None:                            # RoPE (003 §7.3): q~_i = R(theta_i) q_i
        Q, c_rope_q = rope_forward(Q, **rope["q"])
        K, c_rope_k = rope_forward(K, **rope["k"])  # k~_j = R(theta_j) k_j, the new keys only
        c_rope = (c_rope_q, c_rope_k)
    T_past = 0 if kv_cache is None else kv_cache["k"].shape[-2]
    grown = kv_cache_append(kv_cache, K, V)         # K = [K_cache; K], V = [V_cache; V]  (§6.2)
    K_h = repeat_kv(grown["k"], group)              # GQA (003 §5.2): one K per query head
    V_h = repeat_kv(grown["v"], group)
    # head_i = softmax(Q_i K_i^T * scale + M) V_i, every head at once
    heads, c_attn = attention_forward(Q, K_h, V_h, mask=mask, bias=bias, scale=scale)
    concat = merge_heads(heads)                     # Concat(head_1, ..., head_H): (..., n_q, H*d_head)
    out, c_o = linear_forward(concat, Wo, bo)       # out = Concat(...) W^O + b^O
    return out, {"weights": c_attn["weights"], "kv_cache": grown, "x_q": x_q, "x_kv": x_kv,
                 "concat": concat, "q": c_q, "k": c_k, "v": c_v, "rope": c_rope, "attn": c_attn,
                 "o": c_o, "T_past": T_past, "n_heads": H, "n_kv_heads": n_kv_heads}


@backward_of(mha_forward)
def mha_backward(dout, cache):
    """Backward of :func:`mha_forward`: the forward's steps, reversed.

    Returns ``(dx_q, dx_kv, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo)``, with ``None`` for a
    bias that was not given. The key/value gradient of a GQA group is the sum over the
    query heads of the group (:func:`repeat_kv_backward`). After a cached forward, the
    gradient reaches only the new tokens; the cached keys and values are constants.
    """
    H, T_past = cache["n_heads"], cache["T_past"]
    group = H // cache["n_kv_heads"]
    dconcat, dWo, dbo = linear_backward(dout, cache["o"])   # out = concat W^O + b^O
    dheads = split_heads(dconcat, H)                         # concat = Concat(head_1, ..., head_H)
    dQ, dK_h, dV_h = attention_backward(dheads, cache["attn"])   # head_i = Attention(Q_i, K_i, V_i)
    dK = repeat_kv_backward(dK_h, group)[..., T_past:, :]    # each K head sums its copies; the
    dV = repeat_kv_backward(dV_h, group)[..., T_past:, :]    # cached positions are constants
    if cache["rope"] is not None:                            # RoPE backward: dq = R(theta)^T dq~
        dQ = rope_backward(dQ, cache["rope"][0])
        dK = rope_backward(dK, cache["rope"][1])
    dx_q, dWq, dbq = linear_backward(merge_heads(dQ), cache["q"])    # Q = x_q W^Q + b^Q
    dx_k, dWk, dbk = linear_backward(merge_heads(dK), cache["k"])    # K = x_kv W^K + b^K
    dx_v, dWv, dbv = linear_backward(merge_heads(dV), cache["v"])    # V = x_kv W^V + b^V
    dx_kv = dx_k + dx_v                                      # x_kv feeds both K and V
    return dx_q, dx_kv, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo
