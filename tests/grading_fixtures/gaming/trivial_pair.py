"""A submission that computes none of the ops: every forward is ``out = x + sum(other inputs)``
(each other input summed to a number) and every backward is the exact gradient of that.
Forward and backward agree, so a rule that credits "the gradient of your own forward" without
asking whether that forward is the op would pay for it."""
import numpy as np


def _forward(x, *others):
    out = x + sum(float(np.sum(a)) for a in others if a is not None)
    return out.astype(x.dtype), {"x": x, "others": others}


def _backward(dout, cache):
    total = float(np.sum(dout))
    grads = [None if a is None else np.full(np.shape(a), total, dtype=np.asarray(a).dtype)
             for a in cache["others"]]
    dx = dout.copy()
    return dx if not cache["others"] else (dx, *grads)


def softmax_forward(x, *, axis=-1):
    return _forward(x)


def softmax_backward(dout, cache):
    return _backward(dout, cache)


def layernorm_forward(x, gamma, beta, *, eps=1e-5):
    return _forward(x, gamma, beta)


def layernorm_backward(dout, cache):
    return _backward(dout, cache)


def attention_forward(Q, K, V, *, mask=None, bias=None, scale=None):
    return _forward(Q, K, V)


def attention_backward(dout, cache):
    return _backward(dout, cache)


def lora_linear_forward(x, W, A, B, b=None, *, alpha, rank_stabilized=False, dropout=0.0,
                        rng=None, train=True):
    return _forward(x, W, A, B, b)


def lora_linear_backward(dout, cache):
    dx, dW, dA, dB, db = _backward(dout, cache)
    return dx, None, dA, dB, db


def dropout_forward(x, *, p, rng, train=True):
    return _forward(x)


def dropout_backward(dout, cache):
    return _backward(dout, cache)
