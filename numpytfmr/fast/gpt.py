"""The fast GPT: forward, backward, loss and generation with the reference's signatures.

The model is the reference's (``numpytfmr.gpt``, 004 "Transformer Decoder"), computed on
the residual stream as one (N, d) matrix of rows, N = B T::

    x = E[ids] + P                                   one gather, one broadcast add
    per layer (pre-norm):
        h = LN(x);  [Q s K V] = h [Wq s Wk Wv] + b   ONE product for the three projections,
                                                     s = 1/sqrt(d_head) in the weights
        S^T = K (Q s)^T + M^T                        key-major scores (n_k, n_q) per head,
                                                     per block of queries: only the keys
                                                     the block may see (causal); the heads
                                                     side by side in one (n_k, heads n_q)
                                                     array, the mask on the diagonal keys
        A^T = softmax over the keys, in place;  heads = A V written into the concat rows
        x += drop(concat Wo + bo)                    in place on the residual stream
        x += drop(act(LN(x) W1 + b1) W2 + b2)        GELU with its derivative, one blocked pass
    logits = LN_f(x) W_out

and the backward is the same list reversed, every gradient written once. GQA runs the
``group`` query heads of one key/value head as one product: their queries are stacked
as rows, (group * T, d_head), against the shared keys. Attention runs a few sequences
at a time (``BATCH_CHUNK``), so their scores stay in the cache between the products and
the softmax passes. The cache of a forward is a flat dict of the arrays the backward
reads (no callbacks).

``gpt_loss`` takes those arrays from a workspace kept between calls (``loss_workspace``):
nothing of its forward pass leaves the call, so the next step writes into the same,
already mapped memory; with ``out`` its gradients go into the caller's arrays too. ``generate`` fuses [Wq Wk Wv] once, allocates the KV cache at its
final length and runs each new token through ``_decoder``'s step: one position, no mask,
no per-token checks.
"""
import math
import threading

import numpy as np

from ..positional import rope_frequencies
from ..gpt import generation_options
from ..transformer import append_tokens
from . import checks, parallel
from .kernels import (FRESH, Workspace, activation, add_rows, causal_bias_t, causal_softmax_t,
                      column_sums, cross_entropy_fused, gelu_float32_rows,
                      inverse_root_mean,
                      layernorm,
                      layernorm_backward_into, multiply_rows, rmsnorm, rmsnorm_backward_into,
                      rope_rotate, row_dots, scatter_add_rows, silu, softmax_backward_t)

__all__ = ["gpt_forward", "gpt_backward", "gpt_loss", "generate", "loss_workspace", "Workspace"]


# ---------------------------------------------------------------------------------------
# Per-configuration constants
# ---------------------------------------------------------------------------------------

_TABLES = {}


def _remember(key, make):
    v = _TABLES.get(key)
    if v is None:
        if len(_TABLES) > 128:
            _TABLES.clear()
        v = _TABLES[key] = make()
    return v


_PE = {}


def _sinusoids(n, d, dtype):
    """Rows 0..n-1 of PE[p, 2i] = sin(p omega_i), PE[p, 2i+1] = cos(p omega_i),
    omega_i = 10000^(-2i/d); one table per (d, dtype), grown by doubling when a longer
    sequence comes (decoding asks for one more row every step)."""
    key = (d, np.dtype(dtype))
    pe = _PE.get(key)
    if pe is None or pe.shape[0] < n:
        rows = max(n, 2 * (0 if pe is None else pe.shape[0]), 64)
        omega = 10000.0 ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        angle = np.arange(rows, dtype=np.float64)[:, None] * omega
        table = np.empty((rows, d))
        table[:, 0::2] = np.sin(angle)
        table[:, 1::2] = np.cos(angle[:, : d // 2])
        pe = _PE[key] = table.astype(dtype)
    return pe[:n]


def _rope_tables(c, n_past, T, dtype):
    """cos, sin (T, d_head/2) of theta = position * alpha_k."""
    def make():
        alpha = rope_frequencies(c.d_head, base=c.rope_base, scaling=c.rope_scaling)
        theta = np.arange(n_past, n_past + T, dtype=np.float64)[:, None] * alpha
        return np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)
    scaling = None if c.rope_scaling is None else tuple(sorted(c.rope_scaling.items()))
    return _remember(("rope", c.d_head, c.rope_base, scaling, n_past, T, np.dtype(dtype)), make)


class _Layout:
    """Sizes of one forward call."""

    def __init__(self, c, B, T, n_past):
        self.B, self.T, self.N, self.n_past, self.n_k = B, T, B * T, n_past, n_past + T
        self.H, self.Hkv, self.dh = c.n_heads, c.n_kv_heads, c.d_head
        self.G = c.n_heads // c.n_kv_heads
        self.hd, self.kvd = c.n_heads * c.d_head, c.n_kv_heads * c.d_head
        self.scale = 1.0 / math.sqrt(c.d_head)


# ---------------------------------------------------------------------------------------
# Sublayers
# ---------------------------------------------------------------------------------------

def _fused_qkv(p, pre, c, ws=FRESH):
    """[Wq / sqrt(d_head)  Wk  Wv] (d, hd + 2 kvd) and its bias [bq / sqrt(d_head)  bk  bv]
    (None without biases): ONE product gives the three projections, the queries already
    scaled for the scores (the scale costs a pass over Wq instead of one over Q)."""
    Wq, Wk, Wv = p[pre + "Wq"], p[pre + "Wk"], p[pre + "Wv"]
    hd, kvd = Wq.shape[1], Wk.shape[1]
    scale = 1.0 / math.sqrt(c.d_head)
    W = ws.take(pre + "Wqkv", (Wq.shape[0], hd + 2 * kvd), Wq.dtype)
    np.multiply(Wq, scale, out=W[:, :hd])
    W[:, hd:hd + kvd] = Wk
    W[:, hd + kvd:] = Wv
    if not c.bias:
        return W, None
    b = ws.take(pre + "bqkv", (hd + 2 * kvd,), Wq.dtype)
    np.multiply(p[pre + "bq"], scale, out=b[:hd])
    b[hd:hd + kvd] = p[pre + "bk"]
    b[hd + kvd:] = p[pre + "bv"]
    return W, b


def _norm(x, p, key, c, ws=FRESH, residual=None, bias=None):
    """N(x) with the weights under ``key``: returns h and the backward's pieces. With
    ``residual``: N(x += residual (+ bias)), the residual stream updated in the same pass."""
    if c.norm_type == "layernorm":
        h, xhat, r = layernorm(x, p[key + ".gamma"], p.get(key + ".beta"), c.norm_eps, ws,
                               key + ".", residual, bias)
    else:
        h, xhat, r = rmsnorm(x, p[key + ".gamma"], c.norm_eps, ws, key + ".", residual, bias)
    return h, (key, xhat, r)


def _norm_backward(dh, nc, p, c, grads, dx=None, ws=FRESH, consume=False):
    """Gradients of N into ``grads``; returns dx (accumulated into ``dx`` when given).
    ``dh`` is overwritten, and with ``consume`` the cached xhat too."""
    key, xhat, r = nc
    gamma = p[key + ".gamma"]
    if c.norm_type == "layernorm":
        has_beta = key + ".beta" in p
        dgamma, dbeta, out = layernorm_backward_into(
            dh, xhat, r, gamma, dx, accumulate=dx is not None, has_beta=has_beta, ws=ws,
            dgamma=grads.get(key + ".gamma"), dbeta=grads.get(key + ".beta"), consume=consume)
        if has_beta:
            grads[key + ".beta"] = dbeta
    else:
        dgamma, _, out = rmsnorm_backward_into(dh, xhat, r, gamma, dx, accumulate=dx is not None,
                                               ws=ws, dgamma=grads.get(key + ".gamma"),
                                               consume=consume)
    grads[key + ".gamma"] = dgamma
    return out


def _dropout(y, c, rng, train):
    """In place inverted dropout of a sublayer output y (N, d); returns the scaled mask or
    None. The draws are those of the reference: rng.random(shape) >= p, in row order."""
    if not train or c.dropout == 0.0:
        return None
    keep = rng.random(y.shape) >= c.dropout
    mask = keep.astype(y.dtype)
    mask *= 1.0 / (1.0 - c.dropout)
    y *= mask
    return mask


# Causal attention skips the keys a block of queries cannot see: queries [a, b) are scored
# against keys [0, n_past + b) only. Blocks of at least this many queries (the work saved
# must outweigh the extra NumPy calls): at T = 128, two blocks do 3/4 of the full work.
QUERY_BLOCK = 64


# Attention runs BATCH_CHUNK sequences at a time (0: all at once).
BATCH_CHUNK = 2


def batch_chunks(B):
    """Slices of the batch axis, BATCH_CHUNK sequences each."""
    step = BATCH_CHUNK or B
    return [slice(i, min(i + step, B)) for i in range(0, B, step)]


def scores_buffer(ws, name, n_k, nb, Hkv, cols, dtype):
    """Key-major scores of ``nb`` sequences' heads side by side: an (n_k, C + pad) array,
    C = nb Hkv cols, whose row k holds key k's score against every query column of every
    head, and the (nb, Hkv, n_k, cols) view the products write. The softmax's reductions
    over the keys then run down whole rows of C numbers (one NumPy loop, however many
    heads), and the pad (64 bytes, kept at 0) keeps the rows off multiples of 4 KiB, where
    the heads' columns would share cache sets."""
    C = nb * Hkv * cols
    pad = max(1, 64 // np.dtype(dtype).itemsize)
    buf = ws.take(name, (n_k, C + pad), dtype)
    buf[:, C:] = 0.0
    return buf, buf[:, :C].reshape(n_k, nb, Hkv, cols).transpose(1, 2, 0, 3)


def query_blocks(T):
    """[(a, b)] ranges of queries processed together (one block unless T >= 2 QUERY_BLOCK)."""
    nb = max(1, T // QUERY_BLOCK)
    edges = [round(i * T / nb) for i in range(nb + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _small_products(L, T, G):
    """Whether every per-head product of the attention (n_k x d_head x query columns) is
    small enough for BLAS to run it in the calling thread (``parallel.SMALL_PRODUCT``):
    then pairs of sequences go to different workers."""
    cols = max(b - a for a, b in query_blocks(T)) * G
    return (L.n_past + T) * L.dh * cols <= parallel.SMALL_PRODUCT


def _attention(h, p, pre, c, L, past, need_grad, ws=FRESH, out_bias=True):
    """Masked multi-head (GQA) self-attention of the normed rows h (N, d).

    The queries come out of the fused projection already scaled (``_fused_qkv``). Rotated
    (RoPE) or shared by G > 1 heads they are copied as (B, Hkv, T, G, d_head): the G query
    heads that share a key/value head are stacked as the T G rows of one matrix (row
    t G + g), so every product is one batched product over (B, Hkv); otherwise the
    products read them in place, a strided view of the projection.
    Pairs of sequences (``BATCH_CHUNK``) run on the workers (``parallel.each``) while the
    per-head products stay small (``_small_products``).
    Returns out (N, d) (without the bias bo unless ``out_bias``) and the cache {Qs, K, V,
    At (per query block), concat, ...}."""
    B, T, Hkv, G, dh, hd, kvd = L.B, L.T, L.Hkv, L.G, L.dh, L.hd, L.kvd
    dt = h.dtype
    Wqkv, bqkv = p.get(pre + "Wqkv"), p.get(pre + "bqkv")        # fused once by generate
    if Wqkv is None:
        Wqkv, bqkv = _fused_qkv(p, pre, c, ws)
    qkv = np.matmul(h, Wqkv, out=ws.take(pre + "qkv", (L.N, hd + 2 * kvd), dt))
    if c.bias:
        add_rows(qkv, bqkv)
    Q = qkv[:, :hd].reshape(B, T, Hkv, G, dh)                    # Q / sqrt(d_head)
    K = qkv[:, hd:hd + kvd].reshape(B, T, Hkv, dh)
    V = qkv[:, hd + kvd:].reshape(B, T, Hkv, dh)
    rope = None
    if c.positional == "rope" or G > 1:
        Qs = ws.take(pre + "Qs", (B, Hkv, T, G, dh), dt)
        Qs_bt = Qs.transpose(0, 2, 1, 3, 4)                      # (B, T, Hkv, G, dh) view
        Qm = Qs.reshape(B, Hkv, T * G, dh)
    else:
        Qm = Q.reshape(B, T, Hkv, dh).transpose(0, 2, 1, 3)      # (B, H, T, dh) view
    if c.positional == "rope":
        rope = _rope_tables(c, L.n_past, T, dt)
        cos, sin = rope
        rope_rotate(Q, Qs_bt, cos[:, None, None, :], sin[:, None, None, :], c.rope_layout)
        Kn = ws.take(pre + "Kn", (B, Hkv, T, dh), dt)
        rope_rotate(K, Kn.transpose(0, 2, 1, 3), cos[:, None, :], sin[:, None, :], c.rope_layout)
    else:
        if G > 1:
            np.copyto(Qs_bt, Q)
        Kn = K.transpose(0, 2, 1, 3)                             # (B, Hkv, T, dh) views
    Vn = V.transpose(0, 2, 1, 3)
    if past is not None and "k_buf" in past:
        # generate's cache, allocated at its final length: this call's rows written in place
        kb, vb = past["k_buf"], past["v_buf"]
        kb[:, :, L.n_past:L.n_k] = Kn
        vb[:, :, L.n_past:L.n_k] = Vn
        K_all, V_all = kb[:, :, :L.n_k], vb[:, :, :L.n_k]
    elif past is not None:
        K_all = np.concatenate([past["k"], Kn], axis=2)
        V_all = np.concatenate([past["v"], Vn], axis=2)
    else:
        K_all, V_all = Kn, Vn
    concat = ws.take(pre + "concat", (L.N, hd), dt)
    if G == 1:   # the heads' outputs go straight into their columns of concat
        out_m = concat.reshape(B, T, Hkv, dh).transpose(0, 2, 1, 3)
    else:
        out_m = ws.take(pre + "out_m", (B, Hkv, T * G, dh), dt)
    chunks, qbs = batch_chunks(B), query_blocks(T)
    # blocks[j][i]: chunk j's A^T of query block i (buffer, 4-d view)
    blocks = [[None] * len(qbs) for _ in chunks]

    def chunk(j, w):          # a few sequences at a time: their scores stay in cache
        s = chunks[j]
        nb = s.stop - s.start
        for i, (a, b) in enumerate(qbs):
            n_k = L.n_past + b                                   # keys these queries may see
            St, St4 = scores_buffer(ws, f"{pre}St{i}.{j}", n_k, nb, Hkv, (b - a) * G, dt)
            np.matmul(K_all[s, :, :n_k], Qm[s, :, a * G:b * G].swapaxes(-1, -2), out=St4)
            # (one query, as in a decoding step, may see every key: no mask)
            causal_softmax_t(St, causal_bias_t(b - a, G, nb * Hkv, St.shape[1], dt)
                             if b - a > 1 else None)
            np.matmul(St4.swapaxes(-1, -2), V_all[s, :, :n_k], out=out_m[s, :, a * G:b * G])
            blocks[j][i] = (St, St4)
    parallel.each(len(chunks), chunk, parallel=_small_products(L, T, G))
    if G > 1:
        concat.reshape(B, T, Hkv, G, dh)[...] = out_m.reshape(B, Hkv, T, G, dh).transpose(
            0, 2, 1, 3, 4)
    out = np.matmul(concat, p[pre + "Wo"], out=ws.take(pre + "out", (L.N, h.shape[1]), dt))
    if c.bias and out_bias:
        out += p[pre + "bo"]
    cache = {"kv": {"k": K_all, "v": V_all}, "At": blocks}
    if need_grad:
        cache.update(h=h, Wqkv=Wqkv, Qs=Qm, K=K_all, V=V_all, concat=concat, rope=rope)
    return out, cache


def _attention_backward(dout, ac, p, pre, c, L, grads, ws=FRESH):
    """Gradients of the attention sublayer into ``grads``; returns dh (N, d)."""
    B, T, Hkv, G, dh, hd, kvd, n_past = L.B, L.T, L.Hkv, L.G, L.dh, L.hd, L.kvd, L.n_past
    dt = dout.dtype
    grads[pre + "Wo"] = np.matmul(ac["concat"].T, dout,        # out = concat Wo + bo
                                  out=grads.get(pre + "Wo"))
    if c.bias:
        grads[pre + "bo"] = column_sums(dout, grads.get(pre + "bo"))
    dconcat = np.matmul(dout, p[pre + "Wo"].T, out=ws.take("d.concat", (L.N, hd), dt))
    dO = dconcat.reshape(B, T, Hkv, G, dh).transpose(0, 2, 1, 3, 4).reshape(B, Hkv, T * G, dh)
    Qm, K, V = ac["Qs"], ac["K"], ac["V"]
    dqkv = ws.take("d.qkv", (L.N, hd + 2 * kvd), dt)
    dK_h = dqkv[:, hd:hd + kvd].reshape(B, T, Hkv, dh).transpose(0, 2, 1, 3)   # (B, Hkv, T, dh)
    dV_h = dqkv[:, hd + kvd:].reshape(B, T, Hkv, dh).transpose(0, 2, 1, 3)
    direct = ac["rope"] is None and G == 1         # dQ written straight into dqkv's columns
    dQm = (dqkv[:, :hd].reshape(B, T, Hkv, dh).transpose(0, 2, 1, 3) if direct
           else ws.take("d.Qm", (B, Hkv, T * G, dh), dt))
    # dK, dV of every key the queries saw (the new ones are dqkv's columns)
    dK_all = dK_h if n_past == 0 else ws.take("d.K_all", (B, Hkv, n_past + T, dh), dt)
    dV_all = dV_h if n_past == 0 else ws.take("d.V_all", (B, Hkv, n_past + T, dh), dt)
    qb, chunks = query_blocks(T), batch_chunks(B)

    def chunk(j, w):          # a few sequences at a time: their scores stay in cache
        s = chunks[j]
        nb = s.stop - s.start
        for i in reversed(range(len(qb))):
            # the last block sees every key: it writes dK, dV; the earlier ones add to theirs
            (a, b), (Ab, At) = qb[i], ac["At"][j][i]
            n_k, rows = n_past + b, slice(a * G, b * G)
            dO_j, last = dO[s, :, rows], i == len(qb) - 1
            if last:
                np.matmul(At, dO_j, out=dV_all[s])               # dV = A^T dO
            else:
                dV_all[s, :, :n_k] += np.matmul(
                    At, dO_j, out=ws.take(f"d.V{i}.{w}", (nb, Hkv, n_k, dh), dt))
            dSb, dSt = scores_buffer(ws, f"d.St{i}.{w}", n_k, nb, Hkv, (b - a) * G, dt)
            np.matmul(V[s, :, :n_k], dO_j.swapaxes(-1, -2), out=dSt)   # dA^T = V dO^T
            softmax_backward_t(dSb, Ab)                          # dS^T, every head at once
            if last:
                np.matmul(dSt, Qm[s, :, rows], out=dK_all[s])    # dK = dS^T (Q scale)
            else:
                dK_all[s, :, :n_k] += np.matmul(
                    dSt, Qm[s, :, rows], out=ws.take(f"d.K{i}.{w}", (nb, Hkv, n_k, dh), dt))
            np.matmul(dSt.swapaxes(-1, -2), K[s, :, :n_k], out=dQm[s, :, rows])  # dS K
    parallel.each(len(chunks), chunk, parallel=_small_products(L, T, G))
    if n_past:
        dK_h[...] = dK_all[:, :, n_past:]
        dV_h[...] = dV_all[:, :, n_past:]
    if not direct:
        dQ_bt = dqkv[:, :hd].reshape(B, T, Hkv, G, dh)
        dQ5 = dQm.reshape(B, Hkv, T, G, dh).transpose(0, 2, 1, 3, 4)  # (B, T, Hkv, G, dh)
        if ac["rope"] is not None:                               # R(theta)^T = R(-theta)
            cos, sin = ac["rope"]
            rope_rotate(dQ5, dQ_bt, cos[:, None, None, :], -sin[:, None, None, :], c.rope_layout)
            dK = dqkv[:, hd:hd + kvd].reshape(B, T, Hkv, dh)
            rope_rotate(dK, dK, cos[:, None, :], -sin[:, None, :], c.rope_layout)
        else:
            np.copyto(dQ_bt, dQ5)
    # [Q/sqrt(d_head) K V] = h [Wq/sqrt(d_head) Wk Wv] + [bq/sqrt(d_head) bk bv]
    h = ac["h"]
    for name, cols in (("q", slice(0, hd)), ("k", slice(hd, hd + kvd)),
                       ("v", slice(hd + kvd, hd + 2 * kvd))):
        W, b = pre + "W" + name, pre + "b" + name
        grads[W] = np.matmul(h.T, dqkv[:, cols], out=grads.get(W))
        if c.bias:
            grads[b] = column_sums(dqkv[:, cols], grads.get(b))
    grads[pre + "Wq"] *= L.scale           # the fused projection's query columns were scaled
    if c.bias:
        grads[pre + "bq"] *= L.scale
    # dh: both paths summed
    return np.matmul(dqkv, ac["Wqkv"].T, out=ws.take("d.h", (L.N, h.shape[1]), dt))


def _mlp(h, p, pre, c, need_grad, ws=FRESH, out_bias=True):
    """The FFN of the normed rows h: act(h W1 + b1) W2 + b2 (without b2 unless
    ``out_bias``), or SwiGLU."""
    N, d, dt = h.shape[0], h.shape[1], h.dtype
    if c.activation == "swiglu":
        d_ff = p[pre + "W_gate"].shape[1]
        W_gu = p.get(pre + "W_gu")                               # fused once by generate
        if W_gu is None:
            W_gu = np.concatenate([p[pre + "W_gate"], p[pre + "W_up"]], axis=1)
        gu = np.matmul(h, W_gu, out=ws.take(pre + "gu", (N, 2 * d_ff), dt))   # [g u]
        g, u = gu[:, :d_ff], gu[:, d_ff:]
        a, s, s_c = silu(g)
        hid = a * u
        out = np.matmul(hid, p[pre + "W_down"], out=ws.take(pre + "out", (N, d), dt))
        cache = {"h": h, "W_gu": W_gu, "g": g, "u": u, "a": a, "s": s, "s_c": s_c,
                 "hid": hid} if need_grad else {}
        return out, cache
    z = np.matmul(h, p[pre + "W1"], out=ws.take(pre + "z", (N, p[pre + "W1"].shape[1]), dt))
    hid, local = activation(c.activation, z, p[pre + "b1"] if c.bias else None, need_grad, ws,
                            pre + "act.")
    out = np.matmul(hid, p[pre + "W2"], out=ws.take(pre + "out", (N, d), dt))
    if c.bias and out_bias:
        out += p[pre + "b2"]
    return out, ({"h": h, "hid": hid, "local": local} if need_grad else {})


def _mlp_backward(dout, mc, p, pre, c, grads, ws=FRESH):
    """Gradients of the FFN into ``grads``; returns dh (N, d)."""
    h = mc["h"]
    N, d, dt = h.shape[0], h.shape[1], h.dtype
    if c.activation == "swiglu":
        grads[pre + "W_down"] = np.matmul(mc["hid"].T, dout,    # out = hid W_down
                                          out=grads.get(pre + "W_down"))
        dhid = dout @ p[pre + "W_down"].T
        d_ff = dhid.shape[1]
        dgu = np.empty((dhid.shape[0], 2 * d_ff), dhid.dtype)
        dg, du = dgu[:, :d_ff], dgu[:, d_ff:]
        np.multiply(dhid, mc["a"], out=du)                       # hid = a u: du = dhid a
        dhid *= mc["u"]                                          #            da = dhid u
        local = mc["g"] * mc["s_c"]                              # silu' = s + g s (1 - s)
        local += 1.0
        local *= mc["s"]
        np.multiply(dhid, local, out=dg)
        grads[pre + "W_gate"] = np.matmul(h.T, dg, out=grads.get(pre + "W_gate"))
        grads[pre + "W_up"] = np.matmul(h.T, du, out=grads.get(pre + "W_up"))
        return np.matmul(dgu, mc["W_gu"].T, out=ws.take("d.h", (N, d), dt))
    grads[pre + "W2"] = np.matmul(mc["hid"].T, dout,           # out = hid W2 + b2
                                  out=grads.get(pre + "W2"))
    if c.bias:
        grads[pre + "b2"] = column_sums(dout, grads.get(pre + "b2"))
    dz = np.matmul(dout, p[pre + "W2"].T, out=ws.take("d.z", mc["hid"].shape, dt))
    multiply_rows(dz, mc["local"])                              # hid = act(z)
    grads[pre + "W1"] = np.matmul(h.T, dz, out=grads.get(pre + "W1"))   # z = h W1 + b1
    if c.bias:
        grads[pre + "b1"] = column_sums(dz, grads.get(pre + "b1"))
    return np.matmul(dz, p[pre + "W1"].T, out=ws.take("d.h", (N, d), dt))


# ---------------------------------------------------------------------------------------
# Forward / backward
# ---------------------------------------------------------------------------------------

def _forward(p, ids, c, dtype, past, n_past, rng, train, need_grad, ws=FRESH):
    B, T = ids.shape
    L = _Layout(c, B, T, n_past)
    flat_ids = ids.reshape(-1)
    x = np.take(p["wte"], flat_ids, axis=0, mode="clip",         # (N, d) rows of E
                out=ws.take("x", (L.N, c.d_model), dtype))
    if c.positional == "learned":
        x.reshape(B, T, -1)[...] += p["wpe"][n_past:n_past + T]
    elif c.positional == "sinusoidal":
        x.reshape(B, T, -1)[...] += _sinusoids(n_past + T, c.d_model, dtype)[n_past:]
    cache = {"config": c, "dtype": dtype, "layout": L, "ids": flat_ids,
             "positions": np.arange(n_past, n_past + T), "layers": [], "kv_cache": []}
    cache["drop_embed"] = _dropout(x, c, rng, train)
    drops = train and c.dropout > 0.0
    if c.norm == "pre":
        h, n1 = _norm(x, p, "h0.attn_norm" if c.n_layers else "norm_f", c, ws)
    for l in range(c.n_layers):
        pre = f"h{l}."
        lc = {}
        pl = None if past is None else past[l]
        if c.norm == "pre":
            # each sublayer's output bias and residual add run in the pass of the next norm
            lc["n1"] = n1
            out, lc["attn"] = _attention(h, p, pre + "attn.", c, L, pl, need_grad, ws, False)
            bias = p[pre + "attn.bo"] if c.bias else None
            if drops:
                if bias is not None:
                    out += bias
                bias = None
            lc["d1"] = _dropout(out, c, rng, train)
            # x = x + drop(attn(N(x))), h = N(x)
            h, lc["n2"] = _norm(x, p, pre + "mlp_norm", c, ws, out, bias)
            out, lc["mlp"] = _mlp(h, p, pre + "mlp.", c, need_grad, ws, False)
            bias = p[pre + "mlp.b2"] if c.bias and c.activation != "swiglu" else None
            if drops:
                if bias is not None:
                    out += bias
                bias = None
            lc["d2"] = _dropout(out, c, rng, train)
            # x = x + drop(ffn(N(x))), then the next layer's norm (or the final one)
            key = f"h{l + 1}.attn_norm" if l + 1 < c.n_layers else "norm_f"
            h, n1 = _norm(x, p, key, c, ws, out, bias)
        else:
            out, lc["attn"] = _attention(x, p, pre + "attn.", c, L, pl, need_grad, ws)
            lc["d1"] = _dropout(out, c, rng, train)
            out += x
            x, lc["n1"] = _norm(out, p, pre + "attn_norm", c, ws)  # x = N(x + drop(attn(x)))
            out, lc["mlp"] = _mlp(x, p, pre + "mlp.", c, need_grad, ws)
            lc["d2"] = _dropout(out, c, rng, train)
            out += x
            x, lc["n2"] = _norm(out, p, pre + "mlp_norm", c, ws)   # x = N(x + drop(ffn(x)))
        cache["kv_cache"].append(lc["attn"].pop("kv"))
        cache["layers"].append(lc)
    if c.norm == "pre":
        x, cache["norm_f"] = h, n1
    W_out = p["wte"].T if c.tie_embeddings else p["lm_head.W"]
    logits = np.matmul(x, W_out, out=ws.take("logits", (L.N, c.vocab_size), dtype))   # (N, V)
    if need_grad:
        cache["xf"] = x
        cache["params"] = p
        cache["ws"] = ws
    return logits.reshape(B, T, -1), cache


def _backward(dlogits, cache, out=None):
    """The gradients, a dict with the keys of the parameters: new arrays, or the arrays of
    ``out`` (checked by the caller) written in place."""
    c, p, L, ws = cache["config"], cache["params"], cache["layout"], cache["ws"]
    # every gradient is computed with out=grads.get(key): the caller's array, or None (new)
    grads = {} if out is None else dict(out)
    consume = cache.get("consume", False)          # gpt_loss: the cache is read only once
    dl = dlogits.reshape(L.N, -1)
    xf = cache["xf"]
    dx = ws.take("dx", xf.shape, xf.dtype)
    if c.tie_embeddings:                                         # logits = x E^T
        dwte = np.matmul(dl.T, xf, out=grads.get("wte"))
        np.matmul(dl, p["wte"], out=dx)
    else:
        grads["lm_head.W"] = np.matmul(xf.T, dl, out=grads.get("lm_head.W"))
        np.matmul(dl, p["lm_head.W"].T, out=dx)
    if c.norm == "pre":
        dx = _norm_backward(dx, cache["norm_f"], p, c, grads, ws=ws, consume=consume)
    for l in reversed(range(c.n_layers)):
        pre, lc = f"h{l}.", cache["layers"][l]
        if c.norm == "pre":
            # x = x + drop(ffn(N2(x))): dx flows on and through the FFN
            dout = dx if lc["d2"] is None else dx * lc["d2"]
            dh = _mlp_backward(dout, lc["mlp"], p, pre + "mlp.", c, grads, ws)
            _norm_backward(dh, lc["n2"], p, c, grads, dx, ws, consume)
            dout = dx if lc["d1"] is None else dx * lc["d1"]
            dh = _attention_backward(dout, lc["attn"], p, pre + "attn.", c, L, grads, ws)
            _norm_backward(dh, lc["n1"], p, c, grads, dx, ws, consume)
        else:
            # x = N2(s), s = x + drop(ffn(x))
            ds = _norm_backward(dx, lc["n2"], p, c, grads, ws=ws, consume=consume)
            dout = ds if lc["d2"] is None else ds * lc["d2"]
            ds += _mlp_backward(dout, lc["mlp"], p, pre + "mlp.", c, grads, ws)
            dx = _norm_backward(ds, lc["n1"], p, c, grads, ws=ws, consume=consume)
            dout = dx if lc["d1"] is None else dx * lc["d1"]
            dx += _attention_backward(dout, lc["attn"], p, pre + "attn.", c, L, grads, ws)
    if cache["drop_embed"] is not None:
        dx *= cache["drop_embed"]
    if not c.tie_embeddings:
        dwte = _zeros(grads.get("wte"), p["wte"])
    scatter_add_rows(dwte, cache["ids"], dx)                     # E gets both contributions
    grads["wte"] = dwte
    if c.positional == "learned":
        dwpe = grads["wpe"] = _zeros(grads.get("wpe"), p["wpe"])
        np.add.reduce(dx.reshape(L.B, L.T, -1), axis=0, out=dwpe[L.n_past:L.n_past + L.T])
    return {k: grads[k] for k in p}


def _zeros(dest, like):
    """``dest`` set to 0, or a new array of zeros like ``like``."""
    if dest is None:
        return np.zeros_like(like)
    dest.fill(0)
    return dest


class _AttentionWeights:
    """cache["attn_weights"][l]: layer l's weights (B, n_heads, T, n_past + T), built from
    the key-major A^T only when read."""

    def __init__(self, layers, L):
        self._layers, self._L = layers, L

    def __len__(self):
        return len(self._layers)

    def __getitem__(self, l):
        L = self._L
        chunks = self._layers[l]["attn"]["At"]
        A = np.zeros((L.B, L.Hkv, L.G, L.T, L.n_k), chunks[0][0][0].dtype)
        for s, blocks in zip(batch_chunks(L.B), chunks):
            for (a, b), (_, At) in zip(query_blocks(L.T), blocks):
                n_k = L.n_past + b
                A[s, :, :, a:b, :n_k] = At.reshape(-1, L.Hkv, n_k, b - a, L.G).transpose(
                    0, 1, 4, 3, 2)
        return A.reshape(L.B, L.H, L.T, L.n_k)

    def __iter__(self):
        return (self[l] for l in range(len(self)))


def gpt_forward(params, ids, *, config, kv_cache=None, rng=None, train=False):
    """Forward pass of a GPT, as ``numpytfmr.gpt_forward`` (same arguments, same logits).

    Returns (logits (B, T, vocab_size), cache); cache["kv_cache"] continues decoding,
    cache["attn_weights"][l] gives layer l's attention weights, cache["positions"] the
    positions of these tokens.
    """
    where = "fast.gpt_forward"
    c = checks.check_config(config, where)
    p, dtype = checks.check_params(params, c, where)
    ids = checks.check_ids(ids, "ids", c.vocab_size, where)
    train = bool(train)
    if train and c.dropout > 0.0:
        checks.check_rng(rng, where)
    past, n_past = None, 0
    if kv_cache is not None:
        past, n_past = checks.check_kv_cache(kv_cache, c, ids.shape[0], dtype, where)
    T = ids.shape[1]
    if c.positional == "learned" and n_past + T > c.max_len:
        raise ValueError(f"{where}: positions {n_past}..{n_past + T - 1} reach beyond max_len="
                         f"{c.max_len} (ids has T={T}, kv_cache holds {n_past}); learned "
                         f"positions have rows 0..{c.max_len - 1} only")
    logits, cache = _forward(p, ids, c, dtype, past, n_past, rng, train, True)
    cache["attn_weights"] = _AttentionWeights(cache["layers"], cache["layout"])
    return logits, cache


def gpt_backward(dlogits, cache, *, out=None):
    """Backward of :func:`gpt_forward`: a dict of gradients with the keys of ``params``
    (written into the arrays of ``out`` when given, see :func:`gpt_loss`)."""
    where = "fast.gpt_backward"
    if not isinstance(cache, dict) or "xf" not in cache:
        raise TypeError(f"{where}: cache is not the cache of numpytfmr.fast.gpt_forward")
    out = checks.check_grads_out(out, cache["params"], where)
    L = cache["layout"]
    want = (L.B, L.T, cache["config"].vocab_size)
    dlogits = np.asarray(dlogits)
    if dlogits.shape != want:
        raise ValueError(f"{where}: dlogits has shape {dlogits.shape}; expected the logits' "
                         f"shape {want}")
    if dlogits.dtype.kind != "f":
        raise TypeError(f"{where}: dlogits has dtype {dlogits.dtype}; expected floats")
    return _backward(dlogits.astype(cache["dtype"], copy=False), cache, out)   # read, never written


_LOCAL = threading.local()


def loss_workspace():
    """The :class:`Workspace` that :func:`gpt_loss` keeps between calls (one per thread):
    its activations and temporaries, reused by the next call of the same shapes.
    ``loss_workspace().clear()`` gives the memory back."""
    ws = getattr(_LOCAL, "workspace", None)
    if ws is None:
        ws = _LOCAL.workspace = Workspace()
    return ws


def gpt_loss(params, ids, targets, *, config, loss_mask=None, ignore_index=None,
             label_smoothing=0.0, rng=None, train=False, workspace=None, out=None):
    """Mean next-token cross-entropy and its gradients, ``(loss, grads)``, as
    ``numpytfmr.gpt_loss``; the softmax and the cross-entropy run fused on the logits.

    Nothing of the forward pass leaves this function, so its activations and the backward's
    temporaries live in a :class:`Workspace`, the same memory from one call to the next:
    ``workspace``, or by default this thread's :func:`loss_workspace`. Calls that alternate
    between shapes should each pass their own.

    The gradients are new arrays, or, with ``out`` (a dict of arrays shaped like the
    parameters, e.g. the previous step's gradients), written into those: a training loop
    that passes the same dict every step then touches no fresh pages at all (a new 1 MB
    array costs its page faults, about a fifth of a matrix product that fills it)."""
    where = "fast.gpt_loss"
    c = checks.check_config(config, where)
    p, dtype = checks.check_params(params, c, where)
    ids = checks.check_ids(ids, "ids", c.vocab_size, where)
    if c.positional == "learned" and ids.shape[1] > c.max_len:
        raise ValueError(f"{where}: positions 0..{ids.shape[1] - 1} reach beyond max_len="
                         f"{c.max_len}; learned positions have rows 0..{c.max_len - 1} only")
    eps = checks.real(label_smoothing, "label_smoothing", where, low=0.0, high=1.0)
    train = bool(train)
    if train and c.dropout > 0.0:
        checks.check_rng(rng, where)
    if loss_mask is not None:
        lm = np.asarray(loss_mask)
        t = np.asarray(targets)
        if lm.dtype != np.bool_ or lm.shape != t.shape:
            raise ValueError(f"{where}: loss_mask has dtype {lm.dtype} and shape {lm.shape}; "
                             f"expected a bool array of the targets' shape {t.shape} "
                             "(True = scored)")
        ignore_index = -1 if ignore_index is None else ignore_index
        targets = np.where(lm, t, ignore_index)
    targets, valid = checks.check_targets(targets, ids.shape, c.vocab_size, ignore_index, where)
    if workspace is not None and not isinstance(workspace, Workspace):
        raise TypeError(f"{where}: workspace is a {type(workspace).__name__}; expected None or a "
                        "numpytfmr.fast.Workspace")
    out = checks.check_grads_out(out, p, where)
    ws = loss_workspace() if workspace is None else workspace
    logits, cache = _forward(p, ids, c, dtype, None, 0, rng, train, True, ws)
    z = logits.reshape(-1, c.vocab_size)
    t = targets.reshape(-1)
    v = None
    n_valid = t.size
    if valid is not None:
        v = valid.reshape(-1)
        n_valid = int(v.sum())
        t = np.where(v, t, 0)
    loss = cross_entropy_fused(z, t, v, n_valid, eps)            # z becomes dlogits
    cache["consume"] = True                                      # nobody else sees it
    return loss, _backward(logits, cache, out)


# ---------------------------------------------------------------------------------------
# Generation (000 §2.5, 003 §6.1-6.2)
# ---------------------------------------------------------------------------------------

def _decoding_weights(p, c):
    """The parameters plus the fused projections of every layer ([Wq Wk Wv] and its bias,
    the query columns scaled: ``_fused_qkv``), made once per generate call instead of once
    per token."""
    p = dict(p)
    for l in range(c.n_layers):
        pre = f"h{l}.attn."
        p[pre + "Wqkv"], p[pre + "bqkv"] = _fused_qkv(p, pre, c)
        if c.activation == "swiglu":
            pre = f"h{l}.mlp."
            p[pre + "W_gu"] = np.concatenate([p[pre + "W_gate"], p[pre + "W_up"]], axis=1)
    return p


def _kv_buffers(c, B, length, dtype):
    """Per layer, the K and V cache for the whole generation: each step writes its rows in
    place (no copy of the cache per token). V is (B, n_kv_heads, length, d_head); K is kept
    transposed, "kt" (B, n_kv_heads, d_head, length), so that a decoding step's scores
    q K^T read its rows; "k_buf" is the (B, n_kv_heads, length, d_head) view of it that
    the prompt's forward pass writes."""
    layers = []
    for _ in range(c.n_layers):
        kt = np.empty((B, c.n_kv_heads, c.d_head, length), dtype)
        layers.append({"kt": kt, "k_buf": kt.swapaxes(-1, -2),
                       "v_buf": np.empty((B, c.n_kv_heads, length, c.d_head), dtype)})
    return layers


def _decoder(p, c, B, length, dtype, kv, rope):
    """The decoding step of a generate call: ``step(tokens, n_past) -> logits (B, V)`` of the
    token after ``tokens`` (B,) at position n_past, the model of :func:`_forward` for one
    position, against the KV cache ``kv`` (``_kv_buffers``, whose position n_past it writes).

    Everything a step needs is looked up once here: each layer's weights (a tuple, no
    per-step dict or string keys) and every intermediate array (the step writes into them:
    no allocation but the logits). Attention of the one new query per head against the
    cache is one batched product over the heads for the scores and one for the outputs:

        [q/sqrt(d_head) k v] = h [Wq/sqrt(d_head) Wk Wv] + b;   K[n_past], V[n_past] = k, v
        a = softmax(q K[:n_past+1]^T / sqrt(d_head)),   out = concat(a V) Wo + bo

    No mask: the new position may see every cached one. At batch 1 every product takes the
    row as a vector (a matrix-vector product: no matrix-matrix set-up per weight matrix),
    and the scores of a step are one contiguous array (the softmax runs down whole rows)."""
    d, Hkv, dh = c.d_model, c.n_kv_heads, c.d_head
    G, hd, kvd = c.n_heads // Hkv, c.n_heads * dh, Hkv * dh
    layernorm = c.norm_type == "layernorm"
    gelu32 = c.activation == "gelu" and np.dtype(dtype) == np.float32

    def vec(a):
        """What the products read and write: the one row itself at batch 1."""
        return a[0] if B == 1 else a

    def norm_weights(key):
        return p[key + ".gamma"], p.get(key + ".beta")
    layers = []
    for l in range(c.n_layers):
        pre = f"h{l}."
        a, m = pre + "attn.", pre + "mlp."
        if c.activation == "swiglu":
            ffn = (p[m + "W_gu"], None, p[m + "W_down"], None)
        else:
            ffn = (p[m + "W1"], p.get(m + "b1"), p[m + "W2"], p.get(m + "b2"))
        layers.append((norm_weights(pre + "attn_norm"), p[a + "Wqkv"], p.get(a + "bqkv"),
                       p[a + "Wo"], p.get(a + "bo"), norm_weights(pre + "mlp_norm"), ffn,
                       kv[l]["kt"], kv[l]["v_buf"]))
    final = norm_weights("norm_f") if c.norm == "pre" else None
    # the output projection as a (d, V) array with rows in memory, made once per call
    W_out = np.ascontiguousarray(p["wte"].T) if c.tie_embeddings else p["lm_head.W"]
    wte, wpe = p["wte"], p.get("wpe")
    x, h, y = (np.empty((B, d), dtype) for _ in range(3))
    r = np.empty(B, dtype)
    r_col = r[:, None]
    qkv = np.empty((B, hd + 2 * kvd), dtype)
    qs = qkv[:, :hd].reshape(B, Hkv, G, dh)                      # q / sqrt(d_head), a view
    k_new = qkv[:, hd:hd + kvd].reshape(B, Hkv, dh)
    v_new = qkv[:, hd + kvd:].reshape(B, Hkv, dh)
    n_rows = B * Hkv * G
    score_buf = np.empty(n_rows * length, dtype)
    top = np.empty(n_rows, dtype)
    top_col = top[:, None]
    heads = np.empty((B, Hkv, G, dh), dtype)
    concat = heads.reshape(B, hd)
    d_ff = layers[0][6][0].shape[1] if layers else 0
    z = np.empty((B, d_ff), dtype)
    mean_w = np.full(d, 1.0 / d, dtype)
    y_v, qkv_v, concat_v, z_v = (vec(t) for t in (y, qkv, concat, z))

    def norm(src, weights, dst):
        """N(src) into dst, row by row (004 eq. 27-28)."""
        gamma, beta = weights
        if layernorm:
            row_dots(src, mean_w, out=r)                         # mu
            np.subtract(src, r_col, out=dst)
            row_dots(dst, dst, out=r)
        else:
            row_dots(src, src, out=r)
            np.copyto(dst, src)
        inverse_root_mean(r, d, c.norm_eps)                      # 1 / sigma  or  1 / rms
        dst *= r_col
        dst *= gamma
        if beta is not None:
            dst += beta
        return dst

    def attention(src, Wqkv, bqkv, Wo, bo, kt, vb, n_past):
        np.matmul(vec(src), Wqkv, out=qkv_v)
        if bqkv is not None:
            np.add(qkv, bqkv, out=qkv)
        if rope is not None:                                     # rotate to position n_past
            cos, sin = rope[0][n_past], rope[1][n_past]
            rope_rotate(qs, qs, cos, sin, c.rope_layout)
            rope_rotate(k_new, kt[..., n_past], cos, sin, c.rope_layout)
        else:
            kt[..., n_past] = k_new
        vb[:, :, n_past] = v_new
        n_k = n_past + 1
        scores = score_buf[:n_rows * n_k]
        a = scores.reshape(B, Hkv, G, n_k)
        np.matmul(qs, kt[..., :n_k], out=a)                      # (B, Hkv, G, n_k)
        rows = scores.reshape(n_rows, n_k)                       # one row per query head
        np.fmax.reduce(rows, axis=1, out=top)
        rows -= top_col
        np.exp(rows, out=rows)
        np.add.reduce(rows, axis=1, out=top)
        np.divide(1.0, top, out=top)
        rows *= top_col                                          # softmax over the keys
        np.matmul(a, vb[:, :, :n_k], out=heads)                 # heads, concatenated
        np.matmul(concat_v, Wo, out=y_v)
        if bo is not None:
            np.add(y, bo, out=y)
        return y

    def ffn(src, weights):
        W1, b1, W2, b2 = weights
        if c.activation == "swiglu":
            gu = src @ W1
            g, u = gu[:, :d_ff // 2], gu[:, d_ff // 2:]
            hid = silu(g)[0]
            hid *= u
            np.matmul(hid, W2, out=y)
        else:
            np.matmul(vec(src), W1, out=z_v)
            hid = (gelu_float32_rows(z, b1) if gelu32               # in place, one thread
                   else activation(c.activation, z, b1, need_grad=False)[0])
            np.matmul(vec(hid), W2, out=y_v)
        if b2 is not None:
            np.add(y, b2, out=y)
        return y

    def step(tokens, n_past):
        np.take(wte, tokens, axis=0, out=x)                      # (B, d)
        if wpe is not None:
            np.add(x, wpe[n_past], out=x)
        elif c.positional == "sinusoidal":
            np.add(x, _sinusoids(n_past + 1, d, dtype)[n_past], out=x)
        for n1, Wqkv, bqkv, Wo, bo, n2, weights, kt, vb in layers:
            if c.norm == "pre":
                np.add(x, attention(norm(x, n1, h), Wqkv, bqkv, Wo, bo, kt, vb, n_past), out=x)
                np.add(x, ffn(norm(x, n2, h), weights), out=x)
            else:
                out = attention(x, Wqkv, bqkv, Wo, bo, kt, vb, n_past)
                out += x
                norm(out, n1, x)
                out = ffn(x, weights)
                out += x
                norm(out, n2, x)
        logits = vec(x if final is None else norm(x, final, h)) @ W_out
        return logits[None] if B == 1 else logits               # (B, V)
    return step


def generate(params, prompt_ids, *, config, max_new_tokens, temperature=1.0, top_k=None,
             top_p=None, rng=None, use_cache=True, eos_id=None, return_logits=False):
    """Autoregressive generation, as ``numpytfmr.generate`` (same arguments, same tokens)."""
    where = "fast.generate"
    c = checks.check_config(config, where)
    p, dtype = checks.check_params(params, c, where)
    prompt_ids = checks.check_ids(prompt_ids, "prompt_ids", c.vocab_size, where)
    B, T = prompt_ids.shape
    options = generation_options(c, T, max_new_tokens, temperature, top_k, top_p, rng, eos_id,
                                 where)                          # the reference's checks
    n_new = options.pop("max_new_tokens")
    out = np.empty((B, T + n_new), dtype=prompt_ids.dtype)
    out[:, :T] = prompt_ids
    if use_cache and n_new:
        p = _decoding_weights(p, c)
        kv = _kv_buffers(c, B, T + n_new - 1, dtype)
        rope = _rope_tables(c, 0, T + n_new, dtype) if c.positional == "rope" else None
        decode = _decoder(p, c, B, T + n_new - 1, dtype, kv, rope)

    def next_logits(n):                                          # (B, V) after out[:, :n]
        if use_cache and n > T:                                  # one token against the cache
            return decode(out[:, n - 1], n - 1)
        # the prompt, written into the cache; or (no cache) the whole sequence again
        logits, _ = _forward(p, out[:, :n], c, dtype, kv if use_cache else None, 0, None,
                             False, False)
        return logits[:, -1]

    steps = append_tokens(next_logits, out, T, **options)
    if return_logits:
        if not steps:
            return out, np.empty((B, 0, c.vocab_size), dtype=dtype)
        return out, np.stack(steps, axis=1)
    return out
