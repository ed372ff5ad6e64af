"""Rotary position embeddings (interleaved pairs), as a student writes them."""
import numpy as np

from . import Student


def angles(n, d, base=10000.0):
    inv = base ** (-np.arange(0, d, 2) / d)           # one frequency per pair
    theta = np.arange(n)[:, None] * inv[None, :]      # (n, d/2)
    return np.cos(theta), np.sin(theta)


def rotate(x, cos, sin, sign=1.0, halves=False):
    out = np.empty_like(x)
    if halves:
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        out[..., :h] = a * cos - sign * b * sin
        out[..., h:] = b * cos + sign * a * sin
        return out
    a, b = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = a * cos - sign * b * sin
    out[..., 1::2] = b * cos + sign * a * sin
    return out


def rope(x):
    cos, sin = angles(x.shape[-2], x.shape[-1])
    return rotate(x, cos, sin), (cos, sin)


def rope_back(dout, cache, mistake=None):
    cos, sin = cache
    if mistake == "not rotated back":
        return dout.copy()
    if mistake == "rotated by +theta":
        return rotate(dout, cos, sin)
    if mistake == "pairs of the other layout":
        return rotate(dout, cos, sin, -1.0, halves=True)
    return rotate(dout, cos, sin, -1.0)              # R(theta)^T = R(-theta)


def _cases():
    rng = np.random.default_rng(17)
    out = [Student("rope", None, rope, rope_back, (rng.standard_normal((2, 5, 8)),), ("x",))]
    for m in ("rotated by +theta", "not rotated back", "pairs of the other layout"):
        out.append(Student("rope", m, rope, lambda d, c, m=m: rope_back(d, c, m),
                           (rng.standard_normal((2, 5, 8)),), ("x",)))
    return out


CASES = _cases()
