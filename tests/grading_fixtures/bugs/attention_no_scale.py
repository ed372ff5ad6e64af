# Planted bug: attention without the 1/sqrt(d_k) scaling (forward and backward agree).


def attention_forward(Q, K, V, *, mask=None, bias=None, scale=None):
    s = 1.0 if scale is None else float(scale)
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
