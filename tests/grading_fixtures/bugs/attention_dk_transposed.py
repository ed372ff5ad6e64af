# Planted bug: the attention backward builds dK transposed (Q^T dS instead of dS^T Q).


def attention_backward(dout, cache):
    Q, K, V, A, s = cache["Q"], cache["K"], cache["V"], cache["weights"], cache["scale"]
    dV = np.swapaxes(A, -1, -2) @ dout
    dA = dout @ np.swapaxes(V, -1, -2)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
    dQ = (dS @ K) * s
    dK = (np.swapaxes(Q, -1, -2) @ dS) * s
    return _sum_to_shape(dQ, Q.shape), dK, _sum_to_shape(dV, V.shape)
