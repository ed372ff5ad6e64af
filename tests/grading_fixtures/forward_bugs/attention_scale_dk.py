# Forward bug: the default scale divides the scores by d_k, not by sqrt(d_k).


def attention_forward(Q, K, V, *, mask=None, bias=None, scale=None):
    d_k = Q.shape[-1]
    c = 1.0 / d_k if scale is None else scale          # should be 1/sqrt(d_k)
    scores = np.matmul(Q, np.swapaxes(K, -1, -2)) * c
    keep = np.ones(scores.shape, dtype=bool)
    if mask is not None:
        keep = keep & mask
    if bias is not None:
        keep = keep & np.isfinite(bias)
        scores = scores + np.where(np.isfinite(bias), bias, 0.0)
    scores = np.where(keep, scores, -np.inf)
    m = np.max(scores, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(keep, np.exp(scores - m), 0.0)
    total = np.sum(e, axis=-1, keepdims=True)
    P = e / np.where(total == 0, 1.0, total)
    return np.matmul(P, V), (Q, K, V, P, c)


def attention_backward(dout, cache):
    Q, K, V, P, c = cache
    dV = np.matmul(np.swapaxes(P, -1, -2), dout)
    dP = np.matmul(dout, np.swapaxes(V, -1, -2))
    dS = P * (dP - np.sum(dP * P, axis=-1, keepdims=True))
    dQ = np.matmul(dS, K) * c
    dK = np.matmul(np.swapaxes(dS, -1, -2), Q) * c
    return _sum_to(dQ, Q.shape), _sum_to(dK, K.shape), _sum_to(dV, V.shape)
