"""The position-wise feed-forward layer (ReLU) and the SwiGLU layer, as a student writes them."""
import numpy as np

from . import Student


def ffn(x, W1, b1, W2, b2):
    h = x @ W1 + b1
    a = np.maximum(h, 0)
    return a @ W2 + b2, dict(x=x, W1=W1, W2=W2, h=h, a=a)


def ffn_back(dy, c, mistake=None):
    x, W1, W2, h, a = c["x"], c["W1"], c["W2"], c["h"], c["a"]
    X, Y = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dW2 = (h if mistake == "dW2 from the pre-activation" else a).reshape(-1, a.shape[-1]).T @ Y
    db2 = Y.sum(0)
    da = dy @ W2.T
    dh = da if mistake == "activation derivative left out" else da * (h > 0)
    H = dh.reshape(-1, dh.shape[-1])
    return dh @ W1.T, X.T @ H, H.sum(0), dW2, db2


def swiglu(x, Wg, Wu, Wd):
    g = x @ Wg
    s = 1 / (1 + np.exp(-g))
    a = g * s
    u = x @ Wu
    return (a * u) @ Wd, (x, Wg, Wu, Wd, g, s, a, u)


def swiglu_back(dy, cache, mistake=None):
    x, Wg, Wu, Wd, g, s, a, u = cache
    rows = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    dWd = rows(a * u).T @ rows(dy)
    dh = dy @ Wd.T
    da, du = dh * u, dh * a
    if mistake == "product rule factors swapped":
        da, du = dh * a, dh * u
    dg = da if mistake == "gate's activation derivative left out" else da * (s + g * s * (1 - s))
    dx = dg @ Wg.T + du @ Wu.T
    if mistake == "x through the gate only":
        dx = dg @ Wg.T
    elif mistake == "x through the up projection only":
        dx = du @ Wu.T
    return dx, rows(x).T @ rows(dg), rows(x).T @ rows(du), dWd


def _ffn_inputs(rng):
    while True:
        x, W1, b1 = rng.standard_normal((2, 3, 5)), rng.standard_normal((5, 9)) / 2, rng.standard_normal(9)
        if np.min(np.abs(x @ W1 + b1)) > 0.05:              # no pre-activation at the kink
            return x, W1, b1, rng.standard_normal((9, 5)) / 3, rng.standard_normal(5)


def _cases():
    rng = np.random.default_rng(15)
    fnames = ("x", "W1", "b1", "W2", "b2")
    snames = ("x", "W_gate", "W_up", "W_down")

    def sw():
        return (rng.standard_normal((2, 3, 5)), rng.standard_normal((5, 7)) / 2,
                rng.standard_normal((5, 7)) / 2, rng.standard_normal((7, 4)) / 2)
    out = [Student("ffn", None, ffn, ffn_back, _ffn_inputs(rng), fnames),
           Student("swiglu_ffn", None, swiglu, swiglu_back, sw(), snames)]
    for m in ("activation derivative left out", "dW2 from the pre-activation"):
        out.append(Student("ffn", m, ffn, lambda d, c, m=m: ffn_back(d, c, m), _ffn_inputs(rng), fnames))
    for m in ("x through the gate only", "x through the up projection only",
              "gate's activation derivative left out", "product rule factors swapped"):
        out.append(Student("swiglu_ffn", m, swiglu, lambda d, c, m=m: swiglu_back(d, c, m), sw(), snames))
    return out


CASES = _cases()
