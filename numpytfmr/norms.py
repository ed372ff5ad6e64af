"""Normalization layers: LayerNorm (004 eq. 27-28, "Layer Norm") and RMSNorm.

Both normalize each token (each row, over its d features) on its own: the statistics of
token i never involve token j (004, "What constitutes a layer?").
"""
import numpy as np

from ._validate import float_array, number, optional_float_array, result_dtype, vector_arg
from .linear import _column_sums

__all__ = ["layernorm_forward", "layernorm_backward", "rmsnorm_forward", "rmsnorm_backward"]


def _row_input(x, where):
    x = float_array(x, "x", where)
    if x.ndim == 0:
        raise ValueError(f"{where}: x has shape (); expected shape (..., d) with the features last")
    if x.shape[-1] == 0:
        raise ValueError(f"{where}: x has shape {x.shape}; expected at least one feature (d >= 1) "
                         "in the last axis to normalize over")
    return x


def _sum_leading_product(a, b):
    """``_column_sums(a * b)`` without the temporary a * b (einsum sums the products)."""
    d = a.shape[-1]
    return np.einsum("ni,ni->i", a.reshape(-1, d), b.reshape(-1, d))


def _row_mean(a):
    """Mean of every row (over the last axis), kept as a (..., 1) column: ``a @ (1/d) 1``, one
    matrix-vector product (BLAS; several times faster than ``np.mean`` on short rows)."""
    d = a.shape[-1]
    return (a.reshape(-1, d) @ np.full(d, 1.0 / d, a.dtype)).reshape(a.shape[:-1] + (1,))


def _row_dot(a, b):
    """sum_j a_ij b_ij over the last axis, kept as a (..., 1) column (no temporary a * b)."""
    return np.einsum("...i,...i->...", a, b)[..., None]


def layernorm_forward(x, gamma, beta, *, eps=1e-5):
    """Layer normalization of every row over its last axis (004 eq. 27-28).

        mu_i    = (1/d) sum_j x_ij
        sigma_i = sqrt((1/d) sum_j (x_ij - mu_i)^2 + eps)       (population variance)
        out_i   = gamma * (x_i - mu_i) / sigma_i + beta

    With gamma = beta = None this is the plain LN(x_i) = (x_i - mu_i) / sigma_i of eq. 28
    (eps > 0 keeps a constant row finite: it maps to 0). gamma and beta are the optional
    learned gain and bias of the notes' step (3).

    x: (..., d)   gamma: (d,) or None   beta: (d,) or None   ->  out: (..., d)
    cache: {"xhat": the normalized x, "rstd": 1/sigma (..., 1), "gamma", "dtypes": of x, gamma, beta}
    """
    where = "layernorm_forward"
    x = _row_input(x, where)
    gamma = optional_float_array(gamma, "gamma", where)
    beta = optional_float_array(beta, "beta", where)
    d = x.shape[-1]
    for name, v in (("gamma", gamma), ("beta", beta)):
        if v is not None:
            vector_arg(v, d, name, where, "x", x.shape, "d = the last axis of x")
    eps = number(eps, "eps", where, low=0.0, low_open=True)
    mu = _row_mean(x)
    xc = x - mu
    # two-pass: no cancellation for large means; einsum sums xc^2 without an (..., d) temporary
    var = _row_dot(xc, xc) / d
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc
    xhat *= rstd                                   # in place: xc is our own array
    dt = result_dtype(x, gamma, beta)
    if gamma is None:
        out = xhat if beta is None else xhat + beta
    else:
        out = (xhat * gamma).astype(dt, copy=False)
        if beta is not None:
            out += beta                            # in place on the new product
    out = out.astype(dt, copy=False)
    cache = {"xhat": xhat, "rstd": rstd, "gamma": gamma,
             "dtypes": (x.dtype, None if gamma is None else gamma.dtype,
                        None if beta is None else beta.dtype)}
    return out, cache


def layernorm_backward(dout, cache):
    """Gradient of :func:`layernorm_forward`.

        dgamma = sum over rows of dout * xhat,   dbeta = sum over rows of dout
        dxhat  = dout * gamma
        dx     = (1/sigma) (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))   (means over the row)

    Returns (dx, dgamma, dbeta), with None for a gamma/beta that was None.
    """
    xhat, rstd, gamma = cache["xhat"], cache["rstd"], cache["gamma"]
    x_dtype, g_dtype, b_dtype = cache["dtypes"]
    dout = np.asarray(dout)
    d = xhat.shape[-1]
    dgamma = None if g_dtype is None else _sum_leading_product(dout, xhat).astype(g_dtype, copy=False)
    dbeta = None if b_dtype is None else _column_sums(dout).astype(b_dtype, copy=False)
    dxhat = dout if gamma is None else dout * gamma  # d out / d xhat = gamma
    # d xhat / d x: project out the mean direction and the xhat direction, then scale by 1/sigma
    mean_dxhat = _row_mean(dxhat)
    mean_dxhat_xhat = _row_dot(dxhat, xhat) / d
    # dx starts as a new array in the dtype of the whole expression; the rest is in place
    dx = (xhat * mean_dxhat_xhat).astype(np.result_type(dxhat, xhat, rstd), copy=False)
    np.subtract(dxhat, dx, out=dx)                   # dxhat - xhat mean(dxhat xhat)
    dx -= mean_dxhat                                 #   - mean(dxhat)
    dx *= rstd
    return dx.astype(x_dtype, copy=False), dgamma, dbeta


def rmsnorm_forward(x, gamma, *, eps=1e-6):
    """RMSNorm (Zhang & Sennrich 2019; LLaMA): LayerNorm without the mean subtraction and bias.

        rms_i = sqrt((1/d) sum_j x_ij^2 + eps),   out_i = gamma * x_i / rms_i

    x: (..., d)   gamma: (d,) or None   ->  out: (..., d)
    cache: {"xhat": x / rms, "rrms": 1/rms (..., 1), "gamma", "dtypes": of x, gamma}
    """
    where = "rmsnorm_forward"
    x = _row_input(x, where)
    gamma = optional_float_array(gamma, "gamma", where)
    if gamma is not None:
        vector_arg(gamma, x.shape[-1], "gamma", where, "x", x.shape, "d = the last axis of x")
    eps = number(eps, "eps", where, low=0.0, low_open=True)
    rrms = 1.0 / np.sqrt(_row_dot(x, x) / x.shape[-1] + eps)
    xhat = x * rrms
    out = xhat if gamma is None else xhat * gamma
    out = out.astype(result_dtype(x, gamma), copy=False)
    cache = {"xhat": xhat, "rrms": rrms, "gamma": gamma,
             "dtypes": (x.dtype, None if gamma is None else gamma.dtype)}
    return out, cache


def rmsnorm_backward(dout, cache):
    """Gradient of :func:`rmsnorm_forward`.

        dgamma = sum over rows of dout * xhat
        dxhat  = dout * gamma
        dx     = (1/rms) (dxhat - xhat * mean(dxhat * xhat))   (mean over the row)

    Returns (dx, dgamma), dgamma None when gamma was None.
    """
    xhat, rrms, gamma = cache["xhat"], cache["rrms"], cache["gamma"]
    x_dtype, g_dtype = cache["dtypes"]
    dout = np.asarray(dout)
    dgamma = None if g_dtype is None else _sum_leading_product(dout, xhat).astype(g_dtype, copy=False)
    dxhat = dout if gamma is None else dout * gamma  # d out / d xhat = gamma
    # d(x/rms)/dx = (1/rms)(I - xhat xhat^T / d)
    dx = rrms * (dxhat - xhat * (_row_dot(dxhat, xhat) / xhat.shape[-1]))
    return dx.astype(x_dtype, copy=False), dgamma
