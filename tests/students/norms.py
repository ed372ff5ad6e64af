"""LayerNorm and RMSNorm, as a student writes them."""
import numpy as np

from . import Student


# --- LayerNorm: the staged derivation of the lecture ----------------------------------------
def layernorm(x, gamma, beta):
    eps = 1e-5
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    std = np.sqrt(var + eps)
    xn = (x - mu) / std
    return gamma * xn + beta, (xn, std, gamma)


def layernorm_back(dout, cache, mistake=None):
    xn, std, gamma = cache
    D = xn.shape[-1]
    axes = tuple(range(dout.ndim - 1))
    dbeta = dout.sum(axis=axes)
    dgamma = (dout * xn).sum(axis=axes)
    if mistake == "dgamma = sum(dout)":
        dgamma = dout.sum(axis=axes)
    dxn = dout if mistake == "gamma forgotten" else dout * gamma
    a = dxn.sum(axis=-1, keepdims=True) / D
    b = xn * (dxn * xn).sum(axis=-1, keepdims=True) / D
    if mistake == "unbiased variance":
        b = xn * (dxn * xn).sum(axis=-1, keepdims=True) / (D - 1)
    if mistake in ("without the mean term", "dxhat / sigma only"):
        a = 0
    if mistake in ("without the xhat term", "dxhat / sigma only"):
        b = 0
    dx = dxn - a - b
    if mistake != "not divided by sigma":
        dx = dx / std
    return dx, dgamma, dbeta


# --- RMSNorm, no mean -------------------------------------------------------------------------
def rmsnorm(x, g):
    ms = (x * x).mean(-1, keepdims=True)
    r = np.sqrt(ms + 1e-6)
    return x / r * g, {"x": x, "r": r, "g": g}


def rmsnorm_back(dout, c, mistake=None):
    x, r, g = c["x"], c["r"], c["g"]
    n = x.shape[-1]
    xh = x / r
    dg = np.sum((dout * xh).reshape(-1, n), axis=0)
    if mistake == "dgamma = sum(dout)":
        dg = np.sum(dout.reshape(-1, n), axis=0)
    dxh = dout if mistake == "gamma forgotten" else dout * g
    proj = xh * np.mean(dxh * xh, -1, keepdims=True)
    if mistake == "without the xhat term":
        inner = dxh
    elif mistake == "LayerNorm's mean term":
        inner = dxh - np.mean(dxh, -1, keepdims=True) - proj
    else:
        inner = dxh - proj
    dx = inner if mistake == "not divided by rms" else inner / r
    return dx, dg


LN_MISTAKES = ("unbiased variance", "not divided by sigma", "dgamma = sum(dout)",
               "without the mean term", "without the xhat term", "dxhat / sigma only",
               "gamma forgotten")
RMS_MISTAKES = ("without the xhat term", "LayerNorm's mean term", "not divided by rms",
                "dgamma = sum(dout)", "gamma forgotten")


def _cases():
    rng = np.random.default_rng(13)

    def ln_inputs():
        return rng.standard_normal((2, 3, 7)), 1 + 0.5 * rng.standard_normal(7), rng.standard_normal(7)

    def rms_inputs():
        return rng.standard_normal((4, 7)), 1 + 0.5 * rng.standard_normal(7)
    out = [Student("layernorm", None, layernorm, layernorm_back, ln_inputs(), ("x", "gamma", "beta")),
           Student("rmsnorm", None, rmsnorm, rmsnorm_back, rms_inputs(), ("x", "gamma"))]
    out += [Student("layernorm", m, layernorm, lambda d, c, m=m: layernorm_back(d, c, m),
                    ln_inputs(), ("x", "gamma", "beta")) for m in LN_MISTAKES]
    out += [Student("rmsnorm", m, rmsnorm, lambda d, c, m=m: rmsnorm_back(d, c, m),
                    rms_inputs(), ("x", "gamma")) for m in RMS_MISTAKES]
    return out


CASES = _cases()
