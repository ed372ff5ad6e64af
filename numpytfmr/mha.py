"""Multi-head attention: self-, cross-, grouped-query (GQA) and multi-query (MQA) attention,
with optional RoPE on queries and keys and an optional KV cache.

Covers 003 §5.1.3 (multi-head attention), §5.2 (MQA/GQA), §6.2 (KV caching), §7.3 (RoPE
inside attention), 000 §2.1.3, §2.2, §2.5, 001 §2.1-2.2 (the (B, h, T, d_k) cache), 004
"Multi-Head Attention", "Sequence-Tensor Form" and "Cross-Attention".

    head_h = softmax(Q_h K_{g(h)}^T / sqrt(d_head) + M) V_{g(h)},   g(h) = h // (n_heads / n_kv_heads)
    MultiHead = Concat(head_1, ..., head_H) Wo + bo

The heads are not computed in a loop: projections are split into a head axis by a reshape
(``split_heads``), and for GQA the query heads are grouped as (n_kv_heads, group) so each
group broadcasts against its one key/value head -- the repeated keys are never built.
"""
import numpy as np

from . import _validate as v
from .attention import _check_broadcast, _check_dout, attention_backward, attention_forward
from .positional import rope_backward, rope_forward, rope_frequencies

__all__ = ["split_heads", "merge_heads", "mha_forward", "mha_backward"]

_ROPE_KEYS = ("layout", "base", "freqs", "scaling", "positions_q", "positions_k")


def _matmul_rows(x, W):
    return (x.reshape(-1, x.shape[-1]) @ W).reshape(x.shape[:-1] + (W.shape[-1],))


def _column_sums(g):
    return g.reshape(-1, g.shape[-1]).sum(axis=0)


def split_heads(x, n_heads):
    """Split the last axis into heads (004 "Sequence-Tensor Form").

        (..., n, h*d)  --reshape-->  (..., n, h, d)  --swap-->  (..., h, n, d)

    Head ``i`` takes columns ``i*d .. (i+1)*d - 1``, i.e. the block of W_i^Q inside the
    concatenated ``Wq = [W_1^Q | ... | W_h^Q]`` (003 §5.1.3).
    """
    where = "split_heads"
    x = np.asarray(x)
    n_heads = v.positive_int(n_heads, "n_heads", where)
    v.min_ndim(x, 2, "x", where, "(..., n, n_heads * d_head)")
    if x.shape[-1] % n_heads:
        raise ValueError(f"{where}: x has shape {x.shape}; its last axis {x.shape[-1]} is not "
                         f"divisible by n_heads={n_heads}")
    d_head = x.shape[-1] // n_heads
    return np.swapaxes(x.reshape(x.shape[:-1] + (n_heads, d_head)), -3, -2)


def merge_heads(x):
    """Concatenate the heads back (003 §5.1.3 Concat(head_1, ..., head_h)).

        (..., h, n, d)  --swap-->  (..., n, h, d)  --reshape-->  (..., n, h*d)
    """
    x = np.asarray(x)
    v.min_ndim(x, 3, "x", "merge_heads", "(..., n_heads, n, d_head)")
    x = np.swapaxes(x, -3, -2)
    return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def _to_groups(m, n_kv, group):
    """Reshape a mask/bias (..., n_heads or 1, n_q, n_k) to (..., n_kv or 1, group or 1, n_q, n_k).

    Query head h = kv * group + j, so splitting the head axis as (n_kv, group) puts the heads
    sharing one key/value head side by side.
    """
    if m is None:
        return None
    if m.ndim < 3:
        m = m.reshape((1,) * (3 - m.ndim) + m.shape)   # add a head axis of size 1
    if m.shape[-3] == 1:
        return m[..., None, :, :]                      # (..., 1, 1, n_q, n_k)
    return m.reshape(m.shape[:-3] + (n_kv, group) + m.shape[-2:])


def _read_rope(rope, where):
    """The rope option as a dict (a bare string is the layout)."""
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
    return rope


def _rope_positions(pos, default, n, name, where):
    """Positions for a (..., h, n, d) head tensor: (n,) as given, (..., n) gets a head axis."""
    if pos is None:
        return default
    pos = np.asarray(pos)
    if pos.ndim == 0 or pos.shape[-1] != n:
        raise ValueError(f"{where}: rope['{name}'] has shape {pos.shape}; expected ({n},) or "
                         f"(..., {n}) per batch item")
    return pos if pos.ndim == 1 else pos[..., None, :]   # (..., n) -> (..., 1, n): one per head


def _check_weight(W, name, where, shape, what):
    if W.ndim != 2 or W.shape != shape:
        raise ValueError(f"{where}: {name} has shape {W.shape}; expected {shape} {what}")


def _check_vector(b, name, where, n, what):
    if b is not None and b.shape != (n,):
        raise ValueError(f"{where}: {name} has shape {b.shape}; expected ({n},) {what}")


def _sum_rows(x, g):
    """sum over all leading axes of x^T g: the weight gradient of y = x W for batched x."""
    return x.reshape(-1, x.shape[-1]).T @ g.reshape(-1, g.shape[-1])


def _project(x, W, b):
    """x W + b (b may be None): one matrix product over all rows, the bias added in place."""
    y = _matmul_rows(x, W)
    if b is not None:
        y += b
    return y


def _bias_grad(g, has_bias):
    """Gradient of a bias added to every row of g's last axis: the sum over all rows."""
    return _column_sums(g) if has_bias else None


def mha_forward(x_q, x_kv, Wq, Wk, Wv, Wo, bq=None, bk=None, bv=None, bo=None, *,
                n_heads, n_kv_heads=None, mask=None, bias=None, rope=None, kv_cache=None,
                scale=None):
    """Multi-head attention with GQA/MQA, RoPE and a KV cache (003 §5.1.3, §5.2, §6.2, §7.3).

        Q = x_q Wq + bq,  K = x_kv Wk + bk,  V = x_kv Wv + bv     (split into heads)
        Q, K = RoPE(Q), RoPE(K)                                   (if ``rope``)
        K, V = [K_cache; K], [V_cache; V]                         (if ``kv_cache``)
        head_h = softmax(Q_h K_{g(h)}^T * scale + M) V_{g(h)},  g(h) = h // (n_heads // n_kv_heads)
        out = Concat(head_1, ..., head_H) Wo + bo

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
    d_head) for the next decoding step (also returned when ``kv_cache`` is None); and what
    the backward needs: "x_q", "x_kv", "Wq", "Wk", "Wv", "Wo", "has_bias", "concat",
    "attn", "rope_q", "rope_k", "T_past", "n_heads", "n_kv_heads", "dtype", "out_shape".
    The backward works after a cached forward too: the cached keys/values are constants.
    """
    where = "mha_forward"
    x_q = v.float_array(x_q, "x_q", where)
    x_kv = v.float_array(x_kv, "x_kv", where)
    Wq, Wk, Wv, Wo = (v.float_array(W, n, where) for W, n in
                      ((Wq, "Wq"), (Wk, "Wk"), (Wv, "Wv"), (Wo, "Wo")))
    bq, bk, bv, bo = (v.optional_float_array(b, n, where) for b, n in
                      ((bq, "bq"), (bk, "bk"), (bv, "bv"), (bo, "bo")))
    v.min_ndim(x_q, 2, "x_q", where, "(..., n_q, d_model)")
    v.min_ndim(x_kv, 2, "x_kv", where, "(..., n_k, d_kv)")
    if x_q.shape[:-2] != x_kv.shape[:-2]:
        raise ValueError(f"{where}: x_kv has shape {x_kv.shape} but x_q has shape {x_q.shape}; "
                         "the leading (batch) axes must match")
    H = v.positive_int(n_heads, "n_heads", where)
    H_kv = H if n_kv_heads is None else v.positive_int(n_kv_heads, "n_kv_heads", where)
    if H % H_kv:
        raise ValueError(f"{where}: n_heads={H} is not divisible by n_kv_heads={H_kv}; each "
                         "key/value head must serve the same number of query heads")
    group = H // H_kv
    if Wq.ndim != 2 or Wq.shape[0] != x_q.shape[-1]:
        raise ValueError(f"{where}: Wq has shape {Wq.shape} but x_q has shape {x_q.shape}; "
                         f"expected Wq of shape (d_model={x_q.shape[-1]}, n_heads*d_head)")
    if Wq.shape[1] % H:
        raise ValueError(f"{where}: Wq has shape {Wq.shape}; its {Wq.shape[1]} columns are not "
                         f"divisible by n_heads={H} (expected n_heads*d_head columns)")
    d_head = Wq.shape[1] // H
    kv_shape = (x_kv.shape[-1], H_kv * d_head)
    what_kv = f"= (d_kv, n_kv_heads*d_head) with d_kv from x_kv and d_head={d_head} from Wq"
    _check_weight(Wk, "Wk", where, kv_shape, what_kv)
    _check_weight(Wv, "Wv", where, kv_shape, what_kv)
    if Wo.ndim != 2 or Wo.shape[0] != H * d_head:
        raise ValueError(f"{where}: Wo has shape {Wo.shape}; expected (n_heads*d_head={H * d_head},"
                         " d_out)")
    _check_vector(bq, "bq", where, H * d_head, "= (n_heads*d_head,)")
    _check_vector(bk, "bk", where, H_kv * d_head, "= (n_kv_heads*d_head,)")
    _check_vector(bv, "bv", where, H_kv * d_head, "= (n_kv_heads*d_head,)")
    _check_vector(bo, "bo", where, Wo.shape[1], "= (d_out,)")

    batch = x_q.shape[:-2]
    past_k = past_v = None
    if kv_cache is not None:
        if not isinstance(kv_cache, dict) or set(kv_cache) != {"k", "v"}:
            raise TypeError(f"{where}: kv_cache must be None or a dict with keys 'k' and 'v'")
        past_k = v.float_array(kv_cache["k"], "kv_cache['k']", where)
        past_v = v.float_array(kv_cache["v"], "kv_cache['v']", where)
        for arr, n in ((past_k, "k"), (past_v, "v")):
            if arr.ndim != len(batch) + 3 or arr.shape[:-3] != batch or \
                    arr.shape[-3] != H_kv or arr.shape[-1] != d_head:
                raise ValueError(f"{where}: kv_cache['{n}'] has shape {arr.shape}; expected "
                                 f"{batch + (H_kv, 'T_past', d_head)} (batch, n_kv_heads, T_past, "
                                 "d_head)")
        if past_k.shape != past_v.shape:
            raise ValueError(f"{where}: kv_cache['k'] has shape {past_k.shape} but kv_cache['v'] "
                             f"has shape {past_v.shape}; they must match")
    T_past = 0 if past_k is None else past_k.shape[-2]
    n_q, n_new = x_q.shape[-2], x_kv.shape[-2]
    n_k = T_past + n_new
    scores_shape = batch + (H, n_q, n_k)
    if mask is not None:
        mask = v.bool_mask(mask, "mask", where, scores_shape)
    bias = v.optional_float_array(bias, "bias", where)
    if bias is not None:
        _check_broadcast(bias.shape, "bias", where, scores_shape)
    rope = _read_rope(rope, where)

    # the options (bias, kv_cache) take the dtype of the inputs, never upcasting float32
    dt = v.result_dtype(x_q, x_kv, Wq, Wk, Wv, Wo, bq, bk, bv, bo)
    if bias is not None:
        bias = bias.astype(dt, copy=False)
    x_q, x_kv, Wq, Wk, Wv, Wo = (a.astype(dt, copy=False) for a in (x_q, x_kv, Wq, Wk, Wv, Wo))
    bq, bk, bv, bo = (None if b is None else b.astype(dt, copy=False) for b in (bq, bk, bv, bo))

    # projections, split into heads: (..., n, heads*d_head) -> (..., heads, n, d_head)
    Q, K, V = _project(x_q, Wq, bq), _project(x_kv, Wk, bk), _project(x_kv, Wv, bv)
    Q, K, V = split_heads(Q, H), split_heads(K, H_kv), split_heads(V, H_kv)

    rope_q = rope_k = None
    if rope is not None:
        freqs = rope.get("freqs")
        base = rope.get("base", 10000.0)
        if freqs is None and rope.get("scaling") is not None:
            freqs = rope_frequencies(d_head, base=base, scaling=rope["scaling"])
        opts = {"freqs": freqs, "base": base, "layout": rope.get("layout", "interleaved")}
        pos_q = _rope_positions(rope.get("positions_q"), np.arange(T_past, T_past + n_q), n_q,
                                "positions_q", where)
        pos_k = _rope_positions(rope.get("positions_k"), np.arange(T_past, T_past + n_new), n_new,
                                "positions_k", where)
        Q, rope_q = rope_forward(Q, positions=pos_q, **opts)   # rotate every query head
        K, rope_k = rope_forward(K, positions=pos_k, **opts)   # rotate the new keys only

    if past_k is not None:  # append along time: (..., n_kv, T_past + n_new, d_head)
        K = np.concatenate([past_k.astype(dt, copy=False), K], axis=-2)
        V = np.concatenate([past_v.astype(dt, copy=False), V], axis=-2)
    new_cache = {"k": K, "v": V}

    # group the query heads: (..., H, n_q, d) -> (..., H_kv, group, n_q, d); keys and values
    # get a group axis of size 1 and broadcast over it (no repeated copies)
    Qg = Q.reshape(batch + (H_kv, group, n_q, d_head))
    Kg, Vg = K[..., :, None, :, :], V[..., :, None, :, :]
    heads, attn = attention_forward(Qg, Kg, Vg, mask=_to_groups(mask, H_kv, group),
                                    bias=_to_groups(bias, H_kv, group), scale=scale)
    heads = heads.reshape(batch + (H, n_q, d_head))           # undo the grouping
    concat = merge_heads(heads)                                # (..., n_q, H*d_head)
    out = _project(concat, Wo, bo)                             # (..., n_q, d_out)

    cache = {"weights": attn["weights"].reshape(scores_shape), "kv_cache": new_cache,
             "x_q": x_q, "x_kv": x_kv, "Wq": Wq, "Wk": Wk, "Wv": Wv, "Wo": Wo,
             "has_bias": tuple(b is not None for b in (bq, bk, bv, bo)), "concat": concat,
             "attn": attn, "rope_q": rope_q, "rope_k": rope_k, "T_past": T_past,
             "n_heads": H, "n_kv_heads": H_kv, "dtype": dt, "out_shape": out.shape}
    return out, cache


def mha_backward(dout, cache):
    """Backward of :func:`mha_forward`.

    Returns ``(dx_q, dx_kv, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo)``, with ``None`` for a
    bias that was not given. The key/value gradient of a GQA group is the sum over the
    query heads of the group (the broadcast's backward). After a cached forward, the
    gradient reaches only the new tokens; the cached keys and values are constants.
    """
    dout = _check_dout(dout, cache, "mha_backward")
    c = cache
    H, H_kv, T_past = c["n_heads"], c["n_kv_heads"], c["T_past"]
    x_q, x_kv = c["x_q"], c["x_kv"]
    batch, n_q = x_q.shape[:-2], x_q.shape[-2]
    d_head = c["Wq"].shape[1] // H
    has_bq, has_bk, has_bv, has_bo = c["has_bias"]

    dWo = _sum_rows(c["concat"], dout)                         # out = concat Wo + bo
    dbo = _bias_grad(dout, has_bo)
    dconcat = _matmul_rows(dout, c["Wo"].T)                    # d concat = dout Wo^T
    dheads = split_heads(dconcat, H)                           # (..., H, n_q, d_head)
    dheads = dheads.reshape(batch + (H_kv, H // H_kv, n_q, d_head))
    dQg, dKg, dVg = attention_backward(dheads, c["attn"])      # dK, dV summed over the group
    dQ = dQg.reshape(batch + (H, n_q, d_head))
    dK = dKg[..., :, 0, T_past:, :]                            # drop group axis and cached keys
    dV = dVg[..., :, 0, T_past:, :]
    if c["rope_q"] is not None:                                # RoPE backward: rotate back
        dQ = rope_backward(dQ, c["rope_q"])
        dK = rope_backward(dK, c["rope_k"])
    dQ, dK, dV = merge_heads(dQ), merge_heads(dK), merge_heads(dV)  # (..., n, heads*d_head)

    dx_q = _matmul_rows(dQ, c["Wq"].T)                         # Q = x_q Wq + bq
    dx_kv = _matmul_rows(dK, c["Wk"].T)                        # K, V = x_kv Wk + bk, x_kv Wv + bv:
    dx_kv += _matmul_rows(dV, c["Wv"].T)                       #   both paths add up (in place)
    dWq, dWk, dWv = _sum_rows(x_q, dQ), _sum_rows(x_kv, dK), _sum_rows(x_kv, dV)
    dbq, dbk, dbv = _bias_grad(dQ, has_bq), _bias_grad(dK, has_bk), _bias_grad(dV, has_bv)
    return dx_q, dx_kv, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo
