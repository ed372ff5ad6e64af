"""Activations and the softmax family (004 eq. 17, 002 "Elementwise nonlinearity", 003 §5.1).

Each op is a ``_forward``/``_backward`` pair, the backward directly below its forward:

- ReLU, the nonlinearity of the notes' feed-forward layer (004 eq. 17, 002).
- GELU, ``x Phi(x)``, in its exact form and in the tanh form of GPT-2.
- softmax and log-softmax over any axis (003 §5.1, 004 eq. 18-19), max-subtracted.
- SiLU (swish), ``x sigmoid(x)``, the gate of LLaMA's SwiGLU feed-forward layer.

Plain helpers (no cache), used by the other modules: ``softmax(x, axis=-1)``,
``log_softmax(x, axis=-1)``, ``sigmoid(x)``. The special functions the exact GELU needs and
NumPy lacks, the normal ``normal_cdf(x)`` (Phi) and ``normal_pdf(x)`` (phi) and the
``erf``/``erfc`` beneath them, are in ``special.py`` (and importable from here too).
"""
import math

import numpy as np

from .contract import axis_of, backward_of, one_of, op
from .special import erf, erfc, normal_cdf, normal_pdf  # noqa: F401  (erf, erfc: importable here)

__all__ = [
    "softmax", "log_softmax",
    "relu_forward", "relu_backward",
    "gelu_forward", "gelu_backward",
    "silu_forward", "silu_backward",
    "softmax_forward", "softmax_backward",
    "log_softmax_forward", "log_softmax_backward",
]


# ----------------------------------------------------------------------------------------
# plain helpers

def softmax(x, axis=-1):
    """Plain softmax, max-subtracted so large logits never overflow (003 §5.1).

        softmax(x)_i = exp(x_i - max_j x_j) / sum_k exp(x_k - max_j x_j)
    """
    with np.errstate(under="ignore"):  # exp of a very negative logit is 0: the exact float answer
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    """Plain log-softmax: ``x - max - log(sum(exp(x - max)))``, finite for any finite x.

    The sum is at least 1 (the max term is exp(0)), so its log never overflows or hits log(0).
    """
    z = x - np.max(x, axis=axis, keepdims=True)
    with np.errstate(under="ignore"):
        return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def sigmoid(x):
    """The logistic function ``sigma(x) = 1 / (1 + exp(-x))``, elementwise, keeping x's dtype.

    Written with ``e = exp(-|x|)`` in (0, 1]: ``1/(1+e)`` for `x >= 0` and ``e/(1+e)`` for
    x < 0, so exp never overflows and both tails keep their relative precision
    (``sigma(-800)`` is 0, ``sigma(-30)`` is 9.4e-14, not a rounding of 1 - 1).
    """
    x = np.asarray(x)
    with np.errstate(under="ignore"):  # exp(-|x|) is 0 beyond |x| ~ 745: the exact float answer
        e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


# ----------------------------------------------------------------------------------------
# ReLU

@op("x: (...)")
def relu_forward(x):
    """ReLU, the feed-forward layer's nonlinearity (004 eq. 17, 002 "Elementwise nonlinearity").

        relu(x) = max(x, 0)

    x: any shape  ->  out: same shape and dtype
    cache: {"x"}
    """
    out = np.maximum(x, 0)                      # relu(x) = max(x, 0)
    return out, {"x": x}


@backward_of(relu_forward)
def relu_backward(dout, cache):
    """Gradient of :func:`relu_forward`: ``dx = dout * [x > 0]`` (0 at the kink `x = 0`)."""
    return dout * (cache["x"] > 0)              # relu'(x) = [x > 0]


# ----------------------------------------------------------------------------------------
# GELU

_GELU_CUBIC = 0.044715   # the cubic coefficient of GPT-2's tanh form
# (constants are Python floats, math.sqrt and math.pi: they keep a float32 x float32)


@op("x: (...)", approximate=one_of("none", "tanh"))
def gelu_forward(x, *, approximate="none"):
    """GELU (Hendrycks & Gimpel 2016), the FFN nonlinearity of GPT-style models (in place of
    the ReLU of 004 eq. 17).

        approximate="none":  gelu(x) = x Phi(x) = x/2 (1 + erf(x / sqrt(2)))      (exact)
        approximate="tanh":  gelu(x) = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
                             (the form of GPT-2)

    Phi is the standard normal CDF. Both forms keep full relative precision for very
    negative x, where ``1 + erf`` and ``1 + tanh`` would cancel to 0: :func:`normal_cdf`
    computes Phi through ``1 + erf(z) = erfc(-z)``, and ``(1 + tanh u)/2 = sigmoid(2u)``.
    Beyond `|x| = 50` the tanh form's sigmoid is exactly 0 or 1, so x is clipped there in u
    (`x^3` stays finite).

    x: any shape  ->  out: same shape and dtype
    cache: {"x", "approximate", "Phi": Phi(x) for the exact form (the backward reuses it)}
    """
    cache = {"x": x, "approximate": approximate}
    with np.errstate(under="ignore"):                    # far tails round to 0: the exact answer
        if approximate == "none":
            cache["Phi"] = Phi = normal_cdf(x)           # Phi(x) = (1 + erf(x / sqrt 2)) / 2
            out = x * Phi                                # x Phi(x)
        else:
            xc = np.clip(x, -50, 50)                     # sigmoid(2u) is 0 or 1 beyond |x| = 50
            u = math.sqrt(2 / math.pi) * (xc + _GELU_CUBIC * xc**3)   # u  (GPT-2)
            out = x * sigmoid(2 * u)                     # x/2 (1 + tanh u) = x sigmoid(2u)
    return out, cache


@backward_of(gelu_forward)
def gelu_backward(dout, cache):
    """Gradient of :func:`gelu_forward`.

        exact:  dx = dout * (Phi(x) + x phi(x)),   phi(x) = exp(-x^2/2) / sqrt(2 pi)
        tanh:   dx = dout * (s + x s (1 - s) 2 du/dx),   s = sigmoid(2u),
                du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    """
    x = cache["x"]
    with np.errstate(under="ignore"):
        if cache["approximate"] == "none":
            Phi, phi = cache["Phi"], normal_pdf(x)       # Phi(x) and its derivative phi(x)
            return dout * (Phi + x * phi)                # d(x Phi(x))/dx = Phi + x phi
        xc = np.clip(x, -50, 50)                         # as in the forward: s (1 - s) = 0 beyond
        u = math.sqrt(2 / math.pi) * (xc + _GELU_CUBIC * xc**3)       # u
        du = math.sqrt(2 / math.pi) * (1 + 3 * _GELU_CUBIC * xc**2)   # du/dx
        s, s_c = sigmoid(2 * u), sigmoid(-2 * u)         # s and 1 - s, neither by cancellation
        return dout * (s + x * s * s_c * 2 * du)         # d(x s)/dx, sigmoid' = s (1 - s)


# ----------------------------------------------------------------------------------------
# softmax and log-softmax

@op("x: (...)", axis=axis_of("x"))
def softmax_forward(x, *, axis=-1):
    """Softmax over ``axis`` (003 §5.1, 004 eq. 18), max-subtracted so it never overflows.

        y_i = exp(x_i - max_j x_j) / sum_k exp(x_k - max_j x_j)

    x: any shape (at least one axis)  ->  out: same shape; slices along ``axis`` sum to 1
    cache: {"y": the output, "axis": the axis as a non-negative int}
    """
    with np.errstate(under="ignore"):                        # exp(-huge) = 0: the exact answer
        e = np.exp(x - x.max(axis, keepdims=True))           # exp(x_i - max_j x_j), at most 1
    y = e / e.sum(axis, keepdims=True)                       # y_i = e_i / sum_k e_k
    return y, {"y": y, "axis": axis}


@backward_of(softmax_forward)
def softmax_backward(dout, cache):
    """Gradient of :func:`softmax_forward` (the softmax Jacobian-vector product).

        dx = y * (dout - sum(dout * y))     (sum along the axis;  J = diag(y) - y y^T)
    """
    y, axis = cache["y"], cache["axis"]
    with np.errstate(under="ignore"):
        return y * (dout - (dout * y).sum(axis, keepdims=True))   # dy_i/dx_j = y_i (delta_ij - y_j)


@op("x: (...)", axis=axis_of("x"))
def log_softmax_forward(x, *, axis=-1):
    """Log-softmax over ``axis`` (003 §5.1, 003 §2.1.2: the log-probabilities of cross-entropy).

        out_i = x_i - max_j x_j - log sum_k exp(x_k - max_j x_j)

    Finite for any finite x (logits of +-1e4 included).

    x: any shape (at least one axis)  ->  out: same shape
    cache: {"out": the log-probabilities, "axis": the axis as a non-negative int}
    """
    z = x - x.max(axis, keepdims=True)                       # x_i - max_j x_j  (<= 0)
    with np.errstate(under="ignore"):
        out = z - np.log(np.exp(z).sum(axis, keepdims=True)) # - log sum_k exp(z_k); the sum is >= 1
    return out, {"out": out, "axis": axis}


@backward_of(log_softmax_forward)
def log_softmax_backward(dout, cache):
    """Gradient of :func:`log_softmax_forward`.

        dx = dout - softmax(x) * sum(dout)     (sum along the axis; softmax(x) = exp(out))
    """
    out, axis = cache["out"], cache["axis"]
    with np.errstate(under="ignore"):
        y = np.exp(out)                                      # softmax(x); out <= 0, never overflows
    return dout - y * dout.sum(axis, keepdims=True)          # d out_i / dx_j = delta_ij - y_j


# ----------------------------------------------------------------------------------------
# SiLU (swish)

@op("x: (...)")
def silu_forward(x):
    """SiLU, also called swish (Elfwing et al. 2018; Ramachandran et al. 2017): the gate
    activation of the SwiGLU feed-forward layer of LLaMA (Shazeer 2020).

        silu(x) = x sigmoid(x) = x / (1 + exp(-x))

    x: any shape  ->  out: same shape and dtype
    cache: {"x", "s": sigmoid(x)}
    """
    s = sigmoid(x)                              # sigma(x)
    return x * s, {"x": x, "s": s}              # silu(x) = x sigma(x)


@backward_of(silu_forward)
def silu_backward(dout, cache):
    """Gradient of :func:`silu_forward`.

        dx = dout * (s + x s (1 - s)),   s = sigmoid(x)   (product rule; sigmoid' = s (1 - s))
    """
    x, s = cache["x"], cache["s"]
    return dout * (s + x * s * (1 - s))         # d(x s)/dx = s + x s (1 - s)
