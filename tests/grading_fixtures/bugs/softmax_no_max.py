# Planted bug: softmax without the max subtraction (overflows on large logits).


def softmax_forward(x, *, axis=-1):
    e = np.exp(x)
    y = e / np.sum(e, axis=axis, keepdims=True)
    return y, {"y": y, "axis": axis}
