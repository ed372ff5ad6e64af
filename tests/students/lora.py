"""A LoRA linear layer y = x W + b + (alpha/r) (x A) B, W and b frozen, as a student writes it."""
import numpy as np

from . import Student

ALPHA = 6.0
P_DROP = 0.1


def lora(x, W, A, B, b):
    r = A.shape[1]
    s = ALPHA / r
    u = x @ A
    return x @ W + b + s * (u @ B), {"x": x, "W": W, "A": A, "B": B, "u": u, "s": s}


def lora_dropout(x, W, A, B, b):
    """The same layer with dropout on the branch's input (a fixed seed: the same mask)."""
    keep = np.random.default_rng(0).random(x.shape) >= P_DROP
    xd = x * keep / (1 - P_DROP)
    u = xd @ A
    s = ALPHA / A.shape[1]
    cache = {"x": x, "xd": xd, "keep": keep, "W": W, "A": A, "B": B, "u": u, "s": s}
    return x @ W + b + s * (u @ B), cache


def lora_dropout_back(dy, c, mistake=None):
    W, A, B, u, s, keep = c["W"], c["A"], c["B"], c["u"], c["s"], c["keep"]
    XD, U, Y = (t.reshape(-1, t.shape[-1]) for t in (c["xd"], u, dy))
    dB = s * U.T @ Y
    du = s * dy @ B.T
    dA = XD.T @ du.reshape(-1, du.shape[-1])
    dxd = du @ A.T
    if mistake != "branch without dropout":
        dxd = dxd * keep / (1 - P_DROP)
    return dy @ W.T + dxd, None, dA, dB, None


def lora_back(dy, c, mistake=None):
    x, W, A, B, u, s = c["x"], c["W"], c["A"], c["B"], c["u"], c["s"]
    if mistake == "alpha instead of alpha/r":
        s = ALPHA
    elif mistake == "rank taken as d_in":
        s = ALPHA / A.shape[0]
    X, U, Y = x.reshape(-1, x.shape[-1]), u.reshape(-1, u.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dB = U.T @ Y * (1.0 if mistake == "dB without s" else s)
    du = Y @ B.T
    dA = X.T @ du * (1.0 if mistake == "dA without s" else s)
    dx = dy @ W.T
    if mistake != "dx without the branch":
        dx = dx + s * (dy @ B.T) @ A.T
    return dx, None, dA, dB, None


def _cases():
    rng = np.random.default_rng(20)

    def inputs():
        return (rng.standard_normal((2, 3, 7)), 0.5 * rng.standard_normal((7, 5)),
                0.5 * rng.standard_normal((7, 3)), 0.5 * rng.standard_normal((3, 5)),
                rng.standard_normal(5))
    names = ("x", "W", "A", "B", "b")
    out = [Student("lora_linear", None, lora, lora_back, inputs(), names)]
    for m in ("dA without s", "dB without s", "dx without the branch", "alpha instead of alpha/r",
              "rank taken as d_in"):
        out.append(Student("lora_linear", m, lora, lambda d, c, m=m: lora_back(d, c, m), inputs(), names))
    out.append(Student("lora_linear", None, lora_dropout, lora_dropout_back, inputs(), names))
    out.append(Student("lora_linear", "branch without dropout", lora_dropout,
                       lambda d, c: lora_dropout_back(d, c, "branch without dropout"), inputs(), names))
    return out


CASES = _cases()
