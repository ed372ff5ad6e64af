"""Normalization layers: LayerNorm (004 eq. 27-28, "Layer Norm") and RMSNorm.

Both normalize each token (each row, over its d features) on its own: the statistics of
token i never involve token j (004, "What constitutes a layer?").
"""
import numpy as np

from .contract import backward_of, op, positive

__all__ = ["layernorm_forward", "layernorm_backward", "rmsnorm_forward", "rmsnorm_backward"]


def _sum_rows(a):
    """Sum over every leading (row) axis, keeping the last: the gradient of a (d,) gain or bias
    shared by all rows."""
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


@op("x: (..., d)", "gamma: (d,)?", "beta: (d,)?", eps=positive)
def layernorm_forward(x, gamma, beta, *, eps=1e-5):
    """Layer normalization of every row over its last axis (004 eq. 27-28).

        mu_i    = (1/d) sum_j x_ij
        sigma_i = sqrt((1/d) sum_j (x_ij - mu_i)^2 + eps)       (population variance)
        out_i   = gamma * (x_i - mu_i) / sigma_i + beta

    With `gamma = beta = None` this is the plain `LN(x_i) = (x_i - mu_i) / sigma_i` of eq. 28
    (`eps > 0` keeps a constant row finite: it maps to 0). `gamma` and `beta` are the optional
    learned gain and bias of the notes' step (3).

    x: (..., d)   gamma: (d,) or None   beta: (d,) or None   ->  out: (..., d)
    cache: {"xhat": the normalized x, "sigma": (..., 1), "gamma", "has_beta"}
    """
    mu = x.mean(-1, keepdims=True)                           # mu_i                (004 eq. 27)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)            # (1/d) sum (x - mu)^2
    sigma = np.sqrt(var + eps)                               # sigma_i
    xhat = (x - mu) / sigma                                  # (x_i - mu_i) / sigma_i  (eq. 28)
    out = xhat
    if gamma is not None:
        out = gamma * out                                    # gain  gamma
    if beta is not None:
        out = out + beta                                     # bias  beta
    return out, {"xhat": xhat, "sigma": sigma, "gamma": gamma, "has_beta": beta is not None}


@backward_of(layernorm_forward)
def layernorm_backward(dout, cache):
    """Gradient of :func:`layernorm_forward`.

        dgamma = sum over rows of dout * xhat,   dbeta = sum over rows of dout
        dxhat  = dout * gamma
        dx     = (1/sigma) (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))   (means over the row)

    Returns (dx, dgamma, dbeta), with None for a gamma/beta that was None.
    """
    xhat, sigma, gamma = cache["xhat"], cache["sigma"], cache["gamma"]
    dgamma = None if gamma is None else _sum_rows(dout * xhat)          # d out / d gamma = xhat
    dbeta = _sum_rows(dout) if cache["has_beta"] else None               # d out / d beta = 1
    dxhat = dout if gamma is None else dout * gamma                      # d out / d xhat = gamma
    # d xhat / d x: remove the mean direction and the xhat direction, then scale by 1/sigma
    dx = (dxhat - dxhat.mean(-1, keepdims=True)
          - xhat * (dxhat * xhat).mean(-1, keepdims=True)) / sigma
    return dx, dgamma, dbeta


@op("x: (..., d)", "gamma: (d,)?", eps=positive)
def rmsnorm_forward(x, gamma, *, eps=1e-6):
    """RMSNorm (Zhang & Sennrich 2019; LLaMA): LayerNorm without the mean subtraction and bias.

        rms_i = sqrt((1/d) sum_j x_ij^2 + eps),   out_i = gamma * x_i / rms_i

    x: (..., d)   gamma: (d,) or None   ->  out: (..., d)
    cache: {"xhat": x / rms, "rms": (..., 1), "gamma"}
    """
    rms = np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)   # rms_i
    xhat = x / rms                                           # x_i / rms_i
    out = xhat if gamma is None else gamma * xhat            # gain gamma
    return out, {"xhat": xhat, "rms": rms, "gamma": gamma}


@backward_of(rmsnorm_forward)
def rmsnorm_backward(dout, cache):
    """Gradient of :func:`rmsnorm_forward`.

        dgamma = sum over rows of dout * xhat
        dxhat  = dout * gamma
        dx     = (1/rms) (dxhat - xhat * mean(dxhat * xhat))   (mean over the row)

    Returns (dx, dgamma), dgamma None when gamma was None.
    """
    xhat, rms, gamma = cache["xhat"], cache["rms"], cache["gamma"]
    dgamma = None if gamma is None else _sum_rows(dout * xhat)          # d out / d gamma = xhat
    dxhat = dout if gamma is None else dout * gamma                      # d out / d xhat = gamma
    dx = (dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True)) / rms   # (1/rms)(I - xhat xhat^T / d)
    return dx, dgamma
