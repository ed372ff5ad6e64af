# Planted bug: softmax always computes and returns float64 (a float32 input is upcast).


def softmax_forward(x, *, axis=-1):
    x = x.astype(np.float64)
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    y = e / np.sum(e, axis=axis, keepdims=True)
    return y, {"y": y, "axis": axis}
