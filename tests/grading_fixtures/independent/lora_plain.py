"""LoRA for an assignment that drops dropout and rsLoRA (make-assignment --drop
lora_linear:dropout,rank_stabilized), written from that skeleton's contract: the signature
has no dropout, rng, train or rank_stabilized."""
import numpy as np


def lora_linear_forward(x, W, A, B, b=None, *, alpha):
    s = alpha / A.shape[1]
    u = x @ A
    y = x @ W + s * (u @ B)
    if b is not None:
        y = y + b
    return y, (x, W, A, B, s, u)


def lora_linear_backward(dout, cache):
    x, W, A, B, s, u = cache
    d_in, r, d_out = A.shape[0], A.shape[1], B.shape[1]
    du = s * (dout @ B.T)
    dA = x.reshape(-1, d_in).T @ du.reshape(-1, r)
    dB = s * (u.reshape(-1, r).T @ dout.reshape(-1, d_out))
    return dout @ W.T + du @ A.T, None, dA, dB, None


def attention_forward(Q, K, V, *, mask=None, scale=None):
    """Attention for an assignment that drops attention's bias."""
    if scale is None:
        scale = Q.shape[-1] ** -0.5
    S = (Q @ np.swapaxes(K, -1, -2)) * scale
    ok = np.ones(S.shape, dtype=bool) if mask is None else np.broadcast_to(mask, S.shape)
    S = np.where(ok, S, -np.inf)
    top = S.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    E = np.exp(S - top)
    Z = E.sum(axis=-1, keepdims=True)
    P = E / np.where(Z > 0, Z, 1)
    return P @ V, (Q, K, V, P, scale)


def _reduce(g, shape):
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] > 1),
                 keepdims=True)


def attention_backward(dout, cache):
    Q, K, V, P, scale = cache
    dV = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(V, -1, -2)
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    dQ = dS @ K * scale
    dK = np.swapaxes(dS, -1, -2) @ Q * scale
    return _reduce(dQ, Q.shape), _reduce(dK, K.shape), _reduce(dV, V.shape)
