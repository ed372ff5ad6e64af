# Hostile (appended to the correct submission): results that are not plain arrays.


class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False


class SneakyArray(np.ndarray):
    def __eq__(self, other):
        return np.ones(np.shape(self), dtype=bool)


def softmax_forward(x, *, axis=-1):
    return AlwaysEqual(), {}


def relu_forward(x):
    return np.maximum(x, 0).view(SneakyArray), {"pos": x > 0}


def log_softmax_forward(x, *, axis=-1):
    out = _log_softmax(x, axis)
    return out.tolist(), {"out": out, "axis": axis}


def linear_forward(x, W, b=None):
    out = x @ W if b is None else x @ W + b
    return np.matrix(out.reshape(-1, out.shape[-1])), {"x": x, "W": W, "has_b": b is not None}


def gelu_forward(x, *, approximate="none"):
    out = np.empty(x.shape, dtype=object)
    out[...] = AlwaysEqual()
    return out, {}
