"""Six pairs written from a generated skeleton's docstrings only (make-assignment silu ffn
bradley_terry_loss reward_head sequence_logprobs gru_cell), as a student would: silu, ffn,
bradley_terry_loss, reward_head, sequence_logprobs, gru_cell. NumPy and math only.
"""
import math

import numpy as np

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _sigmoid(z):
    # 1 / (1 + exp(-z)) without overflow: exp(-log(1 + exp(-z)))
    return np.exp(-np.logaddexp(0, -z))


def _flat(a):
    return a.reshape(-1, a.shape[-1])


# ---- SiLU ---------------------------------------------------------------------------------

def silu_forward(x):
    s = _sigmoid(x)
    return x * s, (x, s)


def silu_backward(dout, cache):
    x, s = cache
    return dout * (s + x * s * (1 - s))


# ---- feed-forward -------------------------------------------------------------------------

def _act(h, kind):
    """(a, da/dh) of the activation."""
    if kind == "relu":
        return np.maximum(h, 0), (h > 0).astype(h.dtype)
    if kind == "gelu":
        h64 = h.astype(np.float64)
        cdf = 0.5 * _erfc(-h64 / math.sqrt(2.0))
        pdf = np.exp(-0.5 * h64 * h64) / math.sqrt(2.0 * math.pi)
        return (h64 * cdf).astype(h.dtype), (cdf + h64 * pdf).astype(h.dtype)
    # gelu_tanh: x sigmoid(2u)
    h64 = h.astype(np.float64)
    hc = np.clip(h64, -50.0, 50.0)
    c = math.sqrt(2.0 / math.pi)
    u = c * (hc + 0.044715 * hc ** 3)
    s = _sigmoid(2 * u)
    du = c * (1 + 3 * 0.044715 * hc ** 2) * (np.abs(h64) <= 50)
    return (h64 * s).astype(h.dtype), (s + h64 * 2 * s * (1 - s) * du).astype(h.dtype)


def ffn_forward(x, W1, b1, W2, b2, *, activation="relu"):
    h = x @ W1
    if b1 is not None:
        h = h + b1
    a, da = _act(h, activation)
    out = a @ W2
    if b2 is not None:
        out = out + b2
    return out, {"x": x, "W1": W1, "W2": W2, "a": a, "da": da,
                 "b1": b1 is not None, "b2": b2 is not None}


def ffn_backward(dout, cache):
    x, W1, W2, a, da = cache["x"], cache["W1"], cache["W2"], cache["a"], cache["da"]
    dW2 = _flat(a).T @ _flat(dout)
    db2 = _flat(dout).sum(axis=0) if cache["b2"] else None
    dh = (dout @ W2.T) * da
    dW1 = _flat(x).T @ _flat(dh)
    db1 = _flat(dh).sum(axis=0) if cache["b1"] else None
    dx = dh @ W1.T
    return dx, dW1, db1, dW2, db2


# ---- Bradley-Terry ------------------------------------------------------------------------

def bradley_terry_loss_forward(r_chosen, r_rejected):
    d = r_chosen - r_rejected
    loss = np.logaddexp(0, -d).mean()          # -log sigma(d) = log(1 + exp(-d))
    return np.asarray(loss, dtype=d.dtype), d


def bradley_terry_loss_backward(dout, cache):
    d = cache
    g = (-_sigmoid(-d) * dout / d.size).astype(d.dtype)
    return g, -g


# ---- reward head --------------------------------------------------------------------------

def reward_head_forward(h, w_r, b_r=None, *, mask=None, pooling="last"):
    T = h.shape[-2]
    m = np.ones(h.shape[:-1], dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    m = np.broadcast_to(m, h.shape[:-1])
    if pooling == "last":
        last = T - 1 - np.argmax(m[..., ::-1], axis=-1)
        weights = (np.arange(T) == last[..., None]).astype(h.dtype)
    else:
        weights = (m / m.sum(axis=-1, keepdims=True)).astype(h.dtype)
    pooled = np.einsum("...t,...td->...d", weights, h)
    r = pooled @ w_r
    if b_r is not None:
        r = r + b_r
    return r.astype(h.dtype), (weights, pooled, w_r, None if b_r is None else np.shape(b_r))


def reward_head_backward(dr, cache):
    weights, pooled, w_r, b_shape = cache
    dpooled = dr[..., None] * w_r
    dw = (_flat(pooled) * dr.reshape(-1, 1)).sum(axis=0)
    db = None if b_shape is None else np.asarray(dr.sum(), dtype=dr.dtype).reshape(b_shape)
    dh = weights[..., :, None] * dpooled[..., None, :]
    return dh.astype(dr.dtype), dw.astype(dr.dtype), db


# ---- log-probability of a completion ------------------------------------------------------

def sequence_logprobs_forward(logits, targets, mask):
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp_all = z - lse
    keep = np.asarray(mask).astype(bool)
    safe = np.where(keep, targets, 0)
    picked = np.take_along_axis(logp_all, safe[..., None], axis=-1)[..., 0]
    total = np.where(keep, picked, 0.0).sum(axis=-1)
    return total.astype(logits.dtype), (np.exp(logp_all), safe, keep, logits.dtype)


def sequence_logprobs_backward(dout, cache):
    probs, safe, keep, dtype = cache
    onehot = np.zeros_like(probs)
    np.put_along_axis(onehot, safe[..., None], 1.0, axis=-1)
    g = np.asarray(dout, dtype=np.float64)[..., None, None] * keep[..., None] * (onehot - probs)
    return g.astype(dtype), None, None


# ---- GRU cell -----------------------------------------------------------------------------

def gru_cell_forward(e, h_prev, W_e, W_h, b=None, c=None, W_c=None):
    d = h_prev.shape[-1]
    pre = e @ W_e                               # (..., 3d): the e_t terms of all three blocks
    if c is not None:
        pre = pre + c @ W_c
    if b is not None:
        pre = pre + b
    rz = pre[..., :2 * d] + h_prev @ W_h[:, :2 * d]
    R = _sigmoid(rz[..., :d])
    Z = _sigmoid(rz[..., d:])
    Rh = R * h_prev
    cand = np.tanh(pre[..., 2 * d:] + Rh @ W_h[:, 2 * d:])
    h = Z * h_prev + (1 - Z) * cand
    cache = {"e": e, "h_prev": h_prev, "c": c, "W_e": W_e, "W_h": W_h, "W_c": W_c,
             "has_b": b is not None, "R": R, "Z": Z, "Rh": Rh, "cand": cand}
    return h.astype(h_prev.dtype), cache


def gru_cell_backward(dh, cache):
    e, h_prev, c = cache["e"], cache["h_prev"], cache["c"]
    W_e, W_h, W_c = cache["W_e"], cache["W_h"], cache["W_c"]
    R, Z, Rh, cand = cache["R"], cache["Z"], cache["Rh"], cache["cand"]
    d = h_prev.shape[-1]
    dZ = dh * (h_prev - cand)
    dPz = dZ * Z * (1 - Z)
    dPh = dh * (1 - Z) * (1 - cand ** 2)
    dRh = dPh @ W_h[:, 2 * d:].T
    dPr = dRh * h_prev * R * (1 - R)
    dPrz = np.concatenate([dPr, dPz], axis=-1)
    dP = np.concatenate([dPrz, dPh], axis=-1)
    dh_prev = dh * Z + dRh * R + dPrz @ W_h[:, :2 * d].T
    de = dP @ W_e.T
    dW_e = _flat(e).T @ _flat(dP)
    dW_h = np.concatenate([_flat(h_prev).T @ _flat(dPrz), _flat(Rh).T @ _flat(dPh)], axis=1)
    db = _flat(dP).sum(axis=0) if cache["has_b"] else None
    dc = dW_c = None
    if c is not None:
        dc = dP @ W_c.T
        dW_c = _flat(c).T @ _flat(dP)
    return de, dh_prev, dW_e, dW_h, db, dc, dW_c
