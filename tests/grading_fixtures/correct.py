"""A correct homework submission, written independently of numpytfmr from its API contract (docs/contract.md) alone.

Twelve forward/backward pairs (linear, relu, gelu, softmax, log_softmax, cross_entropy,
layernorm, rmsnorm, embedding, attention, lora_linear, dpo_loss) and causal_mask. Only NumPy
and the standard library; the autograder must give it full marks. The planted-bug fixtures
are this file followed by one redefined function.
"""
import math

import numpy as np

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sum_to_shape(g, shape):
    """Sum a broadcast gradient back to ``shape``."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


def _rows(a):
    return a.reshape(-1, a.shape[-1])


# ---- linear ----------------------------------------------------------------------------

def linear_forward(x, W, b=None):
    out = x @ W
    if b is not None:
        out = out + b
    return out, {"x": x, "W": W, "has_b": b is not None}


def linear_backward(dout, cache):
    x, W = cache["x"], cache["W"]
    dx = dout @ W.T
    dW = _rows(x).T @ _rows(dout)
    db = _rows(dout).sum(axis=0) if cache["has_b"] else None
    return dx, dW, db


# ---- activations -----------------------------------------------------------------------

def relu_forward(x):
    return np.maximum(x, 0), {"pos": x > 0}


def relu_backward(dout, cache):
    return dout * cache["pos"]


def gelu_forward(x, *, approximate="none"):
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (x64 + 0.044715 * x64 ** 3))
        out = 0.5 * x64 * (1.0 + t)
    else:
        out = 0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))
    return out.astype(x.dtype), {"x": x, "approximate": approximate}


def gelu_backward(dout, cache):
    x, approximate = cache["x"], cache["approximate"]
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        u = _SQRT_2_OVER_PI * (x64 + 0.044715 * x64 ** 3)
        t = np.tanh(u)
        du = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x64 ** 2)
        d = 0.5 * (1.0 + t) + 0.5 * x64 * (1.0 - t * t) * du
    else:
        cdf = 0.5 * (1.0 + _erf(x64 / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * x64 * x64) / math.sqrt(2.0 * math.pi)
        d = cdf + x64 * pdf
    return (dout * d).astype(x.dtype)


def softmax_forward(x, *, axis=-1):
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    y = e / np.sum(e, axis=axis, keepdims=True)
    return y, {"y": y, "axis": axis}


def softmax_backward(dout, cache):
    y, axis = cache["y"], cache["axis"]
    return y * (dout - np.sum(dout * y, axis=axis, keepdims=True))


def _log_softmax(x, axis=-1):
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def log_softmax_forward(x, *, axis=-1):
    out = _log_softmax(x, axis)
    return out, {"out": out, "axis": axis}


def log_softmax_backward(dout, cache):
    out, axis = cache["out"], cache["axis"]
    return dout - np.exp(out) * np.sum(dout, axis=axis, keepdims=True)


# ---- cross-entropy --------------------------------------------------------------------------

def cross_entropy_forward(logits, targets, *, label_smoothing=0.0, ignore_index=None):
    K = logits.shape[-1]
    valid = np.ones(targets.shape, bool) if ignore_index is None else targets != ignore_index
    t = np.where(valid, targets, 0)
    logp = _log_softmax(logits)
    picked = np.take_along_axis(logp, t[..., None], axis=-1)[..., 0]
    per = -(1.0 - label_smoothing) * picked - (label_smoothing / K) * logp.sum(axis=-1)
    n = int(valid.sum())
    loss = np.where(valid, per, 0).sum() / max(n, 1)
    return np.asarray(loss, dtype=logits.dtype), {"logp": logp, "t": t, "valid": valid, "n": n,
                                                   "eps": label_smoothing}


def cross_entropy_backward(dout, cache):
    logp, t, valid, n, eps = cache["logp"], cache["t"], cache["valid"], cache["n"], cache["eps"]
    K = logp.shape[-1]
    q = np.zeros_like(logp)
    np.put_along_axis(q, t[..., None], 1.0, axis=-1)
    q = (1.0 - eps) * q + eps / K
    d = (np.exp(logp) - q) * valid[..., None] * (dout / max(n, 1))
    return d.astype(logp.dtype), None


# ---- norms --------------------------------------------------------------------------------

def layernorm_forward(x, gamma, beta, *, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    xhat = xc * inv
    out = xhat if gamma is None else xhat * gamma
    if beta is not None:
        out = out + beta
    return out, {"xhat": xhat, "inv": inv, "gamma": gamma, "has_beta": beta is not None}


def layernorm_backward(dout, cache):
    xhat, inv, gamma = cache["xhat"], cache["inv"], cache["gamma"]
    lead = tuple(range(dout.ndim - 1))
    dgamma = (dout * xhat).sum(axis=lead) if gamma is not None else None
    dbeta = dout.sum(axis=lead) if cache["has_beta"] else None
    g = dout if gamma is None else dout * gamma
    dx = inv * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


def rmsnorm_forward(x, gamma, *, eps=1e-6):
    inv = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat = x * inv
    out = xhat if gamma is None else xhat * gamma
    return out, {"xhat": xhat, "inv": inv, "gamma": gamma}


def rmsnorm_backward(dout, cache):
    xhat, inv, gamma = cache["xhat"], cache["inv"], cache["gamma"]
    lead = tuple(range(dout.ndim - 1))
    dgamma = (dout * xhat).sum(axis=lead) if gamma is not None else None
    g = dout if gamma is None else dout * gamma
    dx = inv * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma


# ---- embedding ------------------------------------------------------------------------------

def embedding_forward(ids, table):
    return table[ids], {"ids": ids, "shape": table.shape, "dtype": table.dtype}


def embedding_backward(dout, cache):
    dtable = np.zeros(cache["shape"], dtype=cache["dtype"])
    np.add.at(dtable, cache["ids"], dout)
    return None, dtable


# ---- attention -------------------------------------------------------------------------------

def causal_mask(n_q, n_k=None):
    n_k = n_q if n_k is None else n_k
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)


def attention_forward(Q, K, V, *, mask=None, bias=None, scale=None):
    s = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else float(scale)
    S = (Q @ np.swapaxes(K, -1, -2)) * s
    allowed = np.ones(S.shape, dtype=bool)
    if mask is not None:
        allowed = allowed & mask
    if bias is not None:
        b = bias.astype(S.dtype)
        allowed = allowed & np.isfinite(b)
        S = S + np.where(np.isfinite(b), b, 0)
    S = np.where(allowed, S, -np.inf)
    top = S.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    E = np.where(allowed, np.exp(S - top), 0)
    Z = E.sum(axis=-1, keepdims=True)
    A = E / np.where(Z > 0, Z, 1)
    return A @ V, {"Q": Q, "K": K, "V": V, "weights": A, "scale": s}


def attention_backward(dout, cache):
    Q, K, V, A, s = cache["Q"], cache["K"], cache["V"], cache["weights"], cache["scale"]
    dV = np.swapaxes(A, -1, -2) @ dout
    dA = dout @ np.swapaxes(V, -1, -2)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
    dQ = (dS @ K) * s
    dK = (np.swapaxes(dS, -1, -2) @ Q) * s
    return _sum_to_shape(dQ, Q.shape), _sum_to_shape(dK, K.shape), _sum_to_shape(dV, V.shape)


# ---- LoRA -------------------------------------------------------------------------------------

def lora_linear_forward(x, W, A, B, b=None, *, alpha, rank_stabilized=False, dropout=0.0,
                        rng=None, train=True):
    r = A.shape[1]
    s = alpha / math.sqrt(r) if rank_stabilized else alpha / r
    y = x @ W
    if b is not None:
        y = y + b
    keep = None
    xd = x
    if train and dropout > 0:
        keep = (rng.random(x.shape) >= dropout).astype(x.dtype) / (1.0 - dropout)
        xd = x * keep
    u = xd @ A
    y = y + s * (u @ B)
    return y, {"xd": xd, "u": u, "W": W, "A": A, "B": B, "keep": keep, "s": s}


def lora_linear_backward(dout, cache):
    xd, u, W, A, B, keep, s = (cache[k] for k in ("xd", "u", "W", "A", "B", "keep", "s"))
    dB = s * (_rows(u).T @ _rows(dout))
    du = s * (dout @ B.T)
    dA = _rows(xd).T @ _rows(du)
    dxd = du @ A.T
    if keep is not None:
        dxd = dxd * keep
    return dout @ W.T + dxd, None, dA, dB, None


# ---- DPO ----------------------------------------------------------------------------------------

def _log_sigmoid(z):
    return -np.logaddexp(0.0, -z)


def dpo_loss_forward(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, beta=0.1,
                     label_smoothing=0.0, loss_type="sigmoid"):
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    z = beta * h
    eps = label_smoothing
    if loss_type == "sigmoid":
        losses = -(1.0 - eps) * _log_sigmoid(z) - eps * _log_sigmoid(-z)
    elif loss_type == "hinge":
        losses = np.maximum(0.0, 1.0 - z)
    elif loss_type == "ipo":
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"dpo_loss_forward: unknown loss_type {loss_type!r}")
    loss = np.asarray(losses.mean(), dtype=policy_chosen.dtype)
    return loss, {"h": h, "z": z, "beta": beta, "eps": eps, "loss_type": loss_type}


def dpo_loss_backward(dout, cache):
    h, z, beta, eps, kind = cache["h"], cache["z"], cache["beta"], cache["eps"], cache["loss_type"]
    g = dout / z.size
    if kind == "sigmoid":
        sig_pos = np.exp(_log_sigmoid(z))       # sigma(z), computed without overflow
        sig_neg = np.exp(_log_sigmoid(-z))      # sigma(-z)
        dh = (-(1.0 - eps) * sig_neg + eps * sig_pos) * beta * g
    elif kind == "hinge":
        dh = np.where(z < 1.0, -beta, 0.0) * g
    else:
        dh = 2.0 * (h - 1.0 / (2.0 * beta)) * g
    dh = dh.astype(h.dtype)
    return dh, -dh, None, None
