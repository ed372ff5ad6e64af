"""A linear layer y = x W + b, as a student writes it."""
import numpy as np

from . import Student


def forward(x, W, b):
    out = x @ W + b
    return out, (x, W)


def backward(dout, cache, mistake=None):
    x, W = cache
    x2d = x.reshape(-1, x.shape[-1])
    g2d = dout.reshape(-1, dout.shape[-1])
    if mistake == "W not transposed in dx":
        dx = dout @ W                        # "dout times the weight"
    else:
        dx = dout @ W.T
    dW = x2d.T @ g2d
    db = g2d.sum(axis=0)
    if mistake == "mean over the rows":
        n = x2d.shape[0]                     # average over the batch, like the loss
        dW = dW / n
        db = db / n
    return dx, dW, db


def _inputs(rng):
    return rng.standard_normal((2, 3, 5)), rng.standard_normal((5, 5)), rng.standard_normal(5)


def _cases():
    rng = np.random.default_rng(10)
    names = ("x", "W", "b")
    out = [Student("linear", None, forward, backward, _inputs(rng), names)]
    for m in ("W not transposed in dx", "mean over the rows"):
        out.append(Student("linear", m, forward,
                           lambda d, c, m=m: backward(d, c, m), _inputs(rng), names))
    return out


CASES = _cases()
