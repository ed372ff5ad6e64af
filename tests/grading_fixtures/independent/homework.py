"""A student's homework, written from the generated skeleton's docstrings (the contract) only.

Eight pairs: softmax, layernorm, attention, dropout, lora_linear, gelu, embedding, mha.
Dropout and LoRA draw their mask as ``rng.random(shape) < 1 - p`` (the reference draws
``>= p``): they must still get full marks.
"""
import math

import numpy as np


# --- small helpers of my own ---------------------------------------------------------------

def _sum_to(g, shape):
    """Sum a broadcast gradient back to ``shape``."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for ax, n in enumerate(shape):
        if n == 1 and g.shape[ax] != 1:
            g = g.sum(axis=ax, keepdims=True)
    return g


def _T(a):
    return np.swapaxes(a, -1, -2)


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _masked_softmax(S, allowed):
    """Row softmax over the allowed entries; a row with none allowed is all zeros."""
    any_allowed = allowed.any(axis=-1, keepdims=True)
    top = np.max(np.where(allowed, S, -np.inf), axis=-1, keepdims=True)
    top = np.where(any_allowed, top, 0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(allowed, np.exp(np.where(allowed, S - top, 0)), 0)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1)


def _softmax_jvp(A, dA):
    return A * (dA - (dA * A).sum(axis=-1, keepdims=True))


# --- softmax ----------------------------------------------------------------------------------

def softmax_forward(x, *, axis=-1):
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    y = e / e.sum(axis=axis, keepdims=True)
    return y, {"y": y, "axis": axis}


def softmax_backward(dout, cache):
    y, axis = cache["y"], cache["axis"]
    return y * (dout - (dout * y).sum(axis=axis, keepdims=True))


# --- layernorm --------------------------------------------------------------------------------

def layernorm_forward(x, gamma, beta, *, eps=1e-05):
    mu = x.mean(axis=-1, keepdims=True)
    centred = x - mu
    sigma = np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    xhat = centred / sigma
    out = xhat if gamma is None else xhat * gamma
    if beta is not None:
        out = out + beta
    return out, {"xhat": xhat, "sigma": sigma, "gamma": gamma, "beta": beta is not None}


def layernorm_backward(dout, cache):
    xhat, sigma, gamma = cache["xhat"], cache["sigma"], cache["gamma"]
    lead = tuple(range(dout.ndim - 1))
    dgamma = None if gamma is None else (dout * xhat).sum(axis=lead)
    dbeta = dout.sum(axis=lead) if cache["beta"] else None
    g = dout if gamma is None else dout * gamma
    dx = (g - g.mean(axis=-1, keepdims=True)
          - xhat * (g * xhat).mean(axis=-1, keepdims=True)) / sigma
    return dx, dgamma, dbeta


# --- attention --------------------------------------------------------------------------------

def attention_forward(Q, K, V, *, mask=None, bias=None, scale=None):
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    S = (Q @ _T(K)) * scale
    allowed = np.ones(S.shape, dtype=bool)
    if mask is not None:
        allowed = allowed & mask
    if bias is not None:
        S = S + bias
        allowed = allowed & (bias != -np.inf)
    A = _masked_softmax(S, allowed)
    out = A @ V
    return out, {"Q": Q, "K": K, "V": V, "A": A, "scale": scale}


def attention_backward(dout, cache):
    Q, K, V, A, scale = cache["Q"], cache["K"], cache["V"], cache["A"], cache["scale"]
    dV = _T(A) @ dout
    dS = _softmax_jvp(A, dout @ _T(V))
    dQ = (dS @ K) * scale
    dK = (_T(dS) @ Q) * scale
    return _sum_to(dQ, Q.shape), _sum_to(dK, K.shape), _sum_to(dV, V.shape)


# --- dropout: keep = rng.random(shape) < 1 - p --------------------------------------------------

def dropout_forward(x, *, p, rng, train=True):
    if not train or p == 0:
        return x.copy(), {"keep": None, "factor": 1.0}
    keep = rng.random(x.shape) < 1 - p
    factor = 1.0 / (1.0 - p)
    return np.where(keep, x * factor, 0).astype(x.dtype), {"keep": keep, "factor": factor}


def dropout_backward(dout, cache):
    if cache["keep"] is None:
        return dout.copy()
    return (dout * cache["keep"] * cache["factor"]).astype(dout.dtype)


# --- lora_linear: the same draw -------------------------------------------------------------

def lora_linear_forward(x, W, A, B, b=None, *, alpha, rank_stabilized=False, dropout=0.0, rng=None,
                        train=True):
    r = A.shape[1]
    s = alpha / math.sqrt(r) if rank_stabilized else alpha / r
    keep = None
    xd = x
    if train and dropout > 0:
        keep = rng.random(x.shape) < 1 - dropout
        xd = np.where(keep, x / (1 - dropout), 0).astype(x.dtype)
    u = xd @ A
    y = x @ W + s * (u @ B)
    if b is not None:
        y = y + b
    return y, {"W": W, "A": A, "B": B, "s": s, "xd": xd, "u": u, "keep": keep, "p": dropout}


def lora_linear_backward(dout, cache):
    W, A, B, s = cache["W"], cache["A"], cache["B"], cache["s"]
    du = s * (dout @ B.T)
    dB = s * (_rows(cache["u"]).T @ _rows(dout))
    dA = _rows(cache["xd"]).T @ _rows(du)
    dxd = du @ A.T
    if cache["keep"] is not None:
        dxd = (dxd * cache["keep"] / (1 - cache["p"])).astype(dout.dtype)
    return dout @ W.T + dxd, None, dA, dB, None


# --- gelu: math.erfc element-wise ----------------------------------------------------------------

_erfc = np.vectorize(math.erfc, otypes=[np.float64])
_C = math.sqrt(2.0 / math.pi)


def _gelu_parts(x, approximate):
    """(g(x), g'(x)) in float64."""
    x = x.astype(np.float64)
    if approximate == "none":
        Phi = 0.5 * _erfc(-x / math.sqrt(2.0))
        pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return x * Phi, Phi + x * pdf
    xc = np.clip(x, -50.0, 50.0)
    u = _C * (xc + 0.044715 * xc ** 3)
    with np.errstate(over="ignore"):
        sg = 1.0 / (1.0 + np.exp(-2.0 * u))
    du = _C * (1.0 + 3 * 0.044715 * xc * xc)
    return x * sg, sg + x * sg * (1 - sg) * 2 * du


def gelu_forward(x, *, approximate="none"):
    g, _ = _gelu_parts(x, approximate)
    return g.astype(x.dtype), {"x": x, "approximate": approximate}


def gelu_backward(dout, cache):
    _, dg = _gelu_parts(cache["x"], cache["approximate"])
    return (dout * dg).astype(dout.dtype)


# --- embedding ----------------------------------------------------------------------------------

def embedding_forward(ids, table):
    return table[ids], {"ids": ids, "shape": table.shape}


def embedding_backward(dout, cache):
    dtable = np.zeros(cache["shape"], dtype=dout.dtype)
    np.add.at(dtable, cache["ids"], dout)
    return None, dtable


# --- mha ----------------------------------------------------------------------------------------

def _split(t, heads):
    """(..., n, heads*d) -> (..., heads, n, d)"""
    return np.swapaxes(t.reshape(t.shape[:-1] + (heads, t.shape[-1] // heads)), -3, -2)


def _merge(t):
    """(..., heads, n, d) -> (..., n, heads*d)"""
    t = np.swapaxes(t, -3, -2)
    return t.reshape(t.shape[:-2] + (t.shape[-2] * t.shape[-1],))


def _angles(positions, freqs):
    pos = np.asarray(positions, dtype=np.float64)
    if pos.ndim > 1:
        pos = pos[..., None, :]                     # one row per batch item, shared by heads
    theta = pos[..., None] * np.asarray(freqs, dtype=np.float64)
    return np.cos(theta), np.sin(theta)


def _rotate(t, cos, sin, layout, sign=1.0):
    t64 = t.astype(np.float64)
    half = t.shape[-1] // 2
    if layout == "interleaved":
        a, b = t64[..., 0::2], t64[..., 1::2]
    else:
        a, b = t64[..., :half], t64[..., half:]
    ra = a * cos - sign * b * sin
    rb = b * cos + sign * a * sin
    out = np.empty(np.broadcast_shapes(t.shape, ra.shape[:-1] + (t.shape[-1],)))
    if layout == "interleaved":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :half], out[..., half:] = ra, rb
    return out.astype(t.dtype)


def mha_forward(x_q, x_kv, Wq, Wk, Wv, Wo, bq=None, bk=None, bv=None, bo=None, *, n_heads,
                n_kv_heads=None, mask=None, bias=None, rope=None, kv_cache=None, scale=None):
    H = n_heads
    Hkv = H if n_kv_heads is None else n_kv_heads
    d_head = Wq.shape[1] // H
    group = H // Hkv
    if scale is None:
        scale = 1.0 / math.sqrt(d_head)

    def proj(x, W, b):
        y = x @ W
        return y if b is None else y + b

    Qh = _split(proj(x_q, Wq, bq), H)
    Kh = _split(proj(x_kv, Wk, bk), Hkv)
    Vh = _split(proj(x_kv, Wv, bv), Hkv)
    past = 0 if kv_cache is None else kv_cache["k"].shape[-2]
    rot = None
    if rope is not None:
        spec = {"layout": rope} if isinstance(rope, str) else dict(rope)
        layout = spec.get("layout", "interleaved")
        freqs = spec.get("freqs")
        if freqs is None:
            freqs = spec.get("base", 10000.0) ** (-np.arange(0, d_head, 2) / d_head)
        pq = spec.get("positions_q")
        pk = spec.get("positions_k")
        pq = past + np.arange(x_q.shape[-2]) if pq is None else pq
        pk = past + np.arange(x_kv.shape[-2]) if pk is None else pk
        rot = (layout, _angles(pq, freqs), _angles(pk, freqs))
        Qh = _rotate(Qh, *rot[1], layout)
        Kh = _rotate(Kh, *rot[2], layout)
    if kv_cache is not None:
        Kh = np.concatenate([kv_cache["k"].astype(Kh.dtype), Kh], axis=-2)
        Vh = np.concatenate([kv_cache["v"].astype(Vh.dtype), Vh], axis=-2)
    Kx = np.repeat(Kh, group, axis=-3)              # query head h reads kv head h // group
    Vx = np.repeat(Vh, group, axis=-3)
    S = (Qh @ _T(Kx)) * scale
    allowed = np.ones(S.shape, dtype=bool)
    if mask is not None:
        allowed = allowed & mask
    if bias is not None:
        S = S + bias
        allowed = allowed & (bias != -np.inf)
    A = _masked_softmax(S, allowed)
    concat = _merge(A @ Vx)
    out = proj(concat, Wo, bo)
    cache = {"x_q": x_q, "x_kv": x_kv, "W": (Wq, Wk, Wv, Wo), "has_b": tuple(v is not None for v in
                                                                         (bq, bk, bv, bo)),
             "Qh": Qh, "Kx": Kx, "Vx": Vx, "A": A, "concat": concat, "scale": scale, "H": H,
             "Hkv": Hkv, "group": group, "past": past, "rot": rot}
    return out, cache


def mha_backward(dout, cache):
    Wq, Wk, Wv, Wo = cache["W"]
    hq, hk, hv, ho = cache["has_b"]
    A, Qh, Kx, Vx, scale = cache["A"], cache["Qh"], cache["Kx"], cache["Vx"], cache["scale"]
    H, Hkv, group, past = cache["H"], cache["Hkv"], cache["group"], cache["past"]

    dWo = _rows(cache["concat"]).T @ _rows(dout)
    dbo = _rows(dout).sum(axis=0) if ho else None
    dO = _split(dout @ Wo.T, H)
    dVx = _T(A) @ dO
    dS = _softmax_jvp(A, dO @ _T(Vx))
    dQh = (dS @ Kx) * scale
    dKx = (_T(dS) @ Qh) * scale

    def ungroup(g):                                 # the heads sharing one kv head add up
        g = g.reshape(g.shape[:-3] + (Hkv, group) + g.shape[-2:]).sum(axis=-3)
        return g[..., past:, :]                     # the cached keys/values are constants

    dKh, dVh = ungroup(dKx), ungroup(dVx)
    if cache["rot"] is not None:
        layout, (cq, sq), (ck, sk) = cache["rot"]
        dQh = _rotate(dQh, cq, sq, layout, sign=-1.0)
        dKh = _rotate(dKh, ck, sk, layout, sign=-1.0)
    dQ, dK, dV = _merge(dQh), _merge(dKh), _merge(dVh)
    x_q, x_kv = cache["x_q"], cache["x_kv"]
    dx_q = dQ @ Wq.T
    dx_kv = dK @ Wk.T + dV @ Wv.T
    dWq = _rows(x_q).T @ _rows(dQ)
    dWk = _rows(x_kv).T @ _rows(dK)
    dWv = _rows(x_kv).T @ _rows(dV)
    dbq = _rows(dQ).sum(axis=0) if hq else None
    dbk = _rows(dK).sum(axis=0) if hk else None
    dbv = _rows(dV).sum(axis=0) if hv else None
    return dx_q, dx_kv, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo
