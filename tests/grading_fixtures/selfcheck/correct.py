import numpy as np


def softmax_forward(x, *, axis=-1):
    shifted = x - x.max(axis=axis, keepdims=True)
    ex = np.exp(shifted)
    probs = ex / ex.sum(axis=axis, keepdims=True)
    return probs, (probs, axis)


def softmax_backward(dout, cache):
    probs, axis = cache
    inner = (dout * probs).sum(axis=axis, keepdims=True)
    return probs * (dout - inner)


def relu_forward(x):
    return np.maximum(x, 0).astype(x.dtype), x > 0


def relu_backward(dout, cache):
    return dout * cache


def dropout_forward(x, *, p, rng, train=True):
    if not train or p == 0:
        return x.copy(), None
    keep = rng.random(x.shape) >= p
    return x * keep / np.asarray(1 - p, dtype=x.dtype), keep / np.asarray(1 - p, dtype=x.dtype)


def dropout_backward(dout, cache):
    if cache is None:
        return dout.copy()
    return dout * cache
