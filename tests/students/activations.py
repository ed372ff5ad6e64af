"""ReLU, GELU (exact and tanh) and SiLU, as a student writes them."""
import math

import numpy as np

from . import Student

erf = np.vectorize(math.erf)


# --- ReLU ---------------------------------------------------------------------------------
def relu(x):
    return np.maximum(x, 0), x


def relu_back(dout, x, mistake=None):
    if mistake == "times the output":
        return dout * np.maximum(x, 0)
    if mistake == "inverted mask":
        return dout * (x < 0)
    return dout * (x > 0)


# --- GELU ---------------------------------------------------------------------------------
def gelu_exact(x):
    cdf = 0.5 * (1 + erf(x / math.sqrt(2)))
    return x * cdf, {"x": x, "cdf": cdf}


def gelu_tanh(x):
    k = math.sqrt(2 / math.pi)
    t = np.tanh(k * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1 + t), {"x": x, "t": t}


def gelu_exact_back(dout, cache, mistake=None):
    x, cdf = cache["x"], cache["cdf"]
    pdf = np.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi)
    if mistake == "tanh derivative for the exact GELU":
        k = math.sqrt(2 / math.pi)           # the derivative of the formula in the slides
        t = np.tanh(k * (x + 0.044715 * x ** 3))
        return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * k * (1 + 3 * 0.044715 * x ** 2))
    if mistake == "product rule without the x term":
        return dout * cdf
    return dout * (cdf + x * pdf)


def gelu_tanh_back(dout, cache, mistake=None):
    x, t = cache["x"], cache["t"]
    k = math.sqrt(2 / math.pi)
    if mistake == "exact derivative for the tanh GELU":
        cdf = 0.5 * (1 + erf(x / math.sqrt(2)))
        return dout * (cdf + x * np.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi))
    du = k if mistake == "chain rule without du/dx's cubic term" else k * (1 + 3 * 0.044715 * x ** 2)
    return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)


# --- SiLU ---------------------------------------------------------------------------------
def silu(x):
    sig = 1 / (1 + np.exp(-x))
    return x * sig, (x, sig)


def silu_back(dout, cache, mistake=None):
    x, sig = cache
    if mistake == "product rule without the x term":
        return dout * sig
    if mistake == "sigmoid's derivative only":
        return dout * sig * (1 - sig)
    if mistake == "product rule without x":
        return dout * (sig + sig * (1 - sig))
    return dout * (sig + x * sig * (1 - sig))


def _away_from_zero(rng, shape):
    x = rng.standard_normal(shape) * 1.5
    return np.where(np.abs(x) < 0.2, 0.7, x)


def _cases():
    rng = np.random.default_rng(11)
    out = []
    for fwd, back, op, mistakes in (
            (relu, relu_back, "relu", ("times the output", "inverted mask")),
            (gelu_exact, gelu_exact_back, "gelu", ("tanh derivative for the exact GELU",
                                                   "product rule without the x term")),
            (gelu_tanh, gelu_tanh_back, "gelu", ("exact derivative for the tanh GELU",
                                                 "chain rule without du/dx's cubic term")),
            (silu, silu_back, "silu", ("product rule without the x term",
                                       "sigmoid's derivative only", "product rule without x"))):
        out.append(Student(op, None, fwd, back, (_away_from_zero(rng, (3, 5)),), ("x",)))
        for m in mistakes:
            out.append(Student(op, m, fwd, lambda d, c, b=back, m=m: b(d, c, m),
                               (_away_from_zero(rng, (3, 5)),), ("x",)))
    return out


CASES = _cases()
