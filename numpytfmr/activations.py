"""Activations and the softmax family (004 eq. 17, 002 "Elementwise nonlinearity", 003 §5.1).

Each op is a ``_forward``/``_backward`` pair, the backward directly below its forward:

- ReLU, the nonlinearity of the notes' feed-forward layer (004 eq. 17, 002).
- GELU, ``x * Phi(x)``, in its exact form and in the tanh form of GPT-2. The exact form
  needs the error function, which NumPy lacks; :func:`erf` and :func:`erfc` below
  implement it (Cody's rational approximations) to full float64 precision. float32
  input takes a faster branch-free path accurate to float32 precision (Mills' ratio,
  see ``_gelu_float32``).
- softmax and log-softmax over any axis (003 §5.1, 004 eq. 18-19), max-subtracted.
- SiLU (swish), ``x * sigmoid(x)``, the gate of LLaMA's SwiGLU feed-forward layer.

Plain helpers ``softmax(x, axis=-1)`` and ``log_softmax(x, axis=-1)`` (no cache) are used by
the other modules.
"""
import numpy as np

from ._validate import axis_arg, choice, float_array

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
    z = x - np.max(x, axis=axis, keepdims=True)
    with np.errstate(under="ignore"):  # exp of a very negative logit is 0: the exact float answer
        e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    """Plain log-softmax: ``x - max - log(sum(exp(x - max)))``, finite for any finite x."""
    z = x - np.max(x, axis=axis, keepdims=True)
    with np.errstate(under="ignore"):
        # the sum is >= 1 (the max term is exp(0)), so its log never overflows or hits log(0)
        return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


# ----------------------------------------------------------------------------------------
# ReLU

def relu_forward(x):
    """ReLU, the nonlinearity of the feed-forward layer (004 eq. 17, 002 "Elementwise nonlinearity").

        relu(x) = max(x, 0)

    x: any shape  ->  out: same shape and dtype
    cache: {"mask": bool array, True where x > 0; "dtype": x.dtype}
    """
    x = float_array(x, "x", "relu_forward")
    mask = x > 0
    out = np.where(mask, x, 0).astype(x.dtype, copy=False)
    return out, {"mask": mask, "dtype": x.dtype}


def relu_backward(dout, cache):
    """Gradient of :func:`relu_forward`: ``dx = dout * [x > 0]`` (0 at the kink x = 0)."""
    return np.where(cache["mask"], dout, 0).astype(cache["dtype"], copy=False)  # relu' = [x > 0]


# ----------------------------------------------------------------------------------------
# The error function (needed by the exact GELU)
#
# W. J. Cody, "Rational Chebyshev approximations for the error function",
# Math. Comp. 23 (1969), p. 631, with the coefficients of his later FORTRAN package
# SPECFUN (CALERF, 1990). Three ranges of y = |x|:
#   y <= 0.46875       erf(y)  = y P1(y^2) / Q1(y^2)
#   0.46875 < y <= 4   erfc(y) = exp(-y^2) P2(y) / Q2(y)
#   y > 4              erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - z P3(z) / Q3(z)),  z = 1/y^2
# The coefficients are listed highest degree first (the order Horner's rule uses).

_ERF_SMALL = 0.46875
_P1 = (0.185777706184603153, 3.1611237438705656, 113.864154151050156,
       377.485237685302021, 3209.37758913846947)
_Q1 = (1.0, 23.6012909523441209, 244.024637934444173, 1282.61652607737228,
       2844.23683343917062)
_P2 = (2.15311535474403846e-8, 0.564188496988670089, 8.88314979438837594,
       66.1191906371416295, 298.635138197400131, 881.95222124176909,
       1712.04761263407058, 2051.07837782607147, 1230.33935479799725)
_Q2 = (1.0, 15.7449261107098347, 117.693950891312499, 537.181101862009858,
       1621.38957456669019, 3290.79923573345963, 4362.61909014324716,
       3439.36767414372164, 1230.33935480374942)
_P3 = (0.0163153871373020978, 0.305326634961232344, 0.360344899949804439,
       0.125781726111229246, 0.0160837851487422766, 6.58749161529837803e-4)
_Q3 = (1.0, 2.56852019228982242, 1.87295284992346047, 0.527905102951428412,
       0.0605183413124413191, 0.00233520497626869185)
_INV_SQRT_PI = 0.56418958354775628695  # 1/sqrt(pi)
_INV_SQRT_2 = 0.70710678118654752440  # 1/sqrt(2)
_INV_SQRT_2PI = 0.39894228040143267794  # 1/sqrt(2 pi)


def _horner(coeffs, y):
    """Polynomial with ``coeffs`` (highest degree first) at ``y``, by Horner's rule.

    Python-float coefficients keep y's dtype; the updates are in place because these loops
    run on every activation of a GELU network.
    """
    acc = np.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        acc *= y
        acc += c
    return acc


def _exp_minus_square(y):
    """exp(-y^2) without the rounding error of y*y: split y = a + b with a = y rounded down to 1/16.

    a*a is exact, and exp(-y^2) = exp(-a^2) exp(-(y - a)(y + a)); this is Cody's device and
    keeps erfc's relative error near machine precision in the far tail.
    """
    a = y * 16.0
    np.trunc(a, out=a)
    a /= 16.0
    rest = a - y
    rest *= y + a  # (a - y)(y + a) = -(y^2 - a^2), small and exact up to one rounding
    np.exp(rest, out=rest)
    a *= a
    np.negative(a, out=a)
    np.exp(a, out=a)
    a *= rest
    return a


def _split(mask):
    """Flat indices where ``mask`` holds and where it does not (faster to gather with than a mask)."""
    return np.flatnonzero(mask), np.flatnonzero(~mask)


def _erf_small(x):
    """erf(x) for |x| <= 0.46875: x P1(x^2) / Q1(x^2)."""
    x2 = x * x
    r = _horner(_P1, x2)
    r /= _horner(_Q1, x2)
    r *= x
    return r


def _erfc_tail(y):
    """erfc(y) for y > 0.46875 (a flat array, no sign handling)."""
    out = np.empty_like(y)
    i_mid, i_big = _split(y <= 4.0)
    ym = y[i_mid]
    r = _horner(_P2, ym)
    r /= _horner(_Q2, ym)
    r *= _exp_minus_square(ym)
    out[i_mid] = r
    # y > 4 (and NaN, which propagates). erfc(28) underflows to 0, so larger y are clipped
    # to 28: the result is 0 either way and 1/y^2 cannot overflow.
    yb = np.minimum(y[i_big], 28.0)
    z = 1.0 / (yb * yb)
    r = _horner(_P3, z)
    r /= _horner(_Q3, z)
    r *= -z
    r += _INV_SQRT_PI
    r /= yb
    r *= _exp_minus_square(yb)
    out[i_big] = r
    return out


def _as_float(x):
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)


def erf(x):
    """The error function ``erf(x) = 2/sqrt(pi) * int_0^x exp(-t^2) dt``, elementwise.

    Cody's rational approximations (see above); relative error below 1e-15 in float64.
    Keeps the dtype of a float32/float64 array (other input is read as float64).
    """
    x = _as_float(x)
    flat = x.ravel()
    out = np.empty_like(flat)
    with np.errstate(under="ignore"):  # tails underflow to 0, the exact float answer
        i_small, i_tail = _split(np.abs(flat) <= _ERF_SMALL)
        out[i_small] = _erf_small(flat[i_small])
        xt = flat[i_tail]
        out[i_tail] = np.copysign(1.0 - _erfc_tail(np.abs(xt)), xt)  # erf(-y) = -erf(y)
    return out.reshape(x.shape)


def erfc(x):
    """The complementary error function ``erfc(x) = 1 - erf(x)``, elementwise.

    Accurate in relative terms also where it is tiny (up to x = 26.5; beyond, it underflows
    to 0), which ``1 - erf(x)`` is not. Keeps the dtype like :func:`erf`.
    """
    x = _as_float(x)
    flat = x.ravel()
    out = np.empty_like(flat)
    with np.errstate(under="ignore"):
        i_small, i_tail = _split(np.abs(flat) <= _ERF_SMALL)
        out[i_small] = 1.0 - _erf_small(flat[i_small])
        xt = flat[i_tail]
        tail = _erfc_tail(np.abs(xt))
        out[i_tail] = np.where(xt < 0, 2.0 - tail, tail)  # erfc(-y) = 2 - erfc(y)
    return out.reshape(x.shape)


# ----------------------------------------------------------------------------------------
# Phi for float32 (the exact GELU of float32 networks)
#
# Cody's erfc above is accurate to float64 precision, and slow on large arrays: it splits
# the input into three ranges (index gathers and scatters). A float32 array needs only
# float32 precision, which one branch-free formula gives for every x:
#
#   Phi(-y) = phi(y) R(y),   y = |x|,   phi(y) = exp(-y^2/2) / sqrt(2 pi)
#   Phi(x)  = Phi(-y) for x <= 0,   1 - Phi(-y) for x > 0
#
# R(y) = Phi(-y) / phi(y) is Mills' ratio (R(0) = sqrt(pi/2), R(y) ~ 1/y for large y),
# approximated as R(y) ~= t P(t), t = 1/(1 + 0.265 y), P a polynomial of degree 8. The
# coefficients are a minimax fit of the relative error (least squares with Lawson's
# reweighting, in float64) on 0 <= y <= 15: relative error below 1.6e-8 there, under
# float32's 6e-8 rounding (tests/test_core_ops.py checks it against erfc). Beyond y = 14.4,
# phi(y) is 0 in float32, so Phi(-y) = 0 whatever R is. Phi(-y) keeps its relative
# precision in the tail (no 1 - Phi cancellation); phi(x) also gives the derivative.

_MILLS_T = 0.265
_MILLS_P = (0.0762948683105, -0.356983480614, 0.53685415525, -0.281523852933,
            0.338968955305, 0.154018438211, 0.256724209543, 0.263911655418, 0.265049171286)
# The same R evaluated with two passes fewer: with s = beta t and beta^9 = P[0], R(y) =
# s (s^8 + M[0] s^7 + ... + M[7]) with M[k] = P[k+1] / beta^(8-k) (a monic polynomial: no
# first multiplication), and s = (beta / T) / (1/T + y) in one addition and one division.
_MILLS_BETA = _MILLS_P[0] ** (1.0 / 9.0)
_MILLS_M = tuple(c / _MILLS_BETA ** (8 - k) for k, c in enumerate(_MILLS_P[1:]))
# Elements per block in _gelu_float32: a block of x, its results and temporaries (under
# 2 MB) stay in the CPU's L2 cache through the ~30 passes of the formula, instead of
# streaming 4 MB arrays from memory in every pass (about 1.6 times as fast on the
# (8, 128, 1024) activation of the benchmark's FFN).
_GELU_BLOCK = 1 << 16


def _gelu_float32(x):
    """Exact GELU of a float32 array and its derivative: ``(x Phi(x), Phi(x) + x phi(x))``.

    Phi and phi as above. The formula is applied to consecutive blocks of the flattened
    array (``_GELU_BLOCK`` elements each), every step in place in a block's buffers.
    """
    flat = x.reshape(-1)
    out, dydx = np.empty_like(flat), np.empty_like(flat)
    n = min(flat.size, _GELU_BLOCK)
    r_buf, t_buf, cdf_buf, pdf_buf = (np.empty(n, np.float32) for _ in range(4))
    pos_buf = np.empty(n, bool)
    for start in range(0, flat.size, _GELU_BLOCK):
        blk = slice(start, start + _GELU_BLOCK)
        xb = flat[blk]
        r, t, cdf, pdf, pos = (a[:xb.size] for a in (r_buf, t_buf, cdf_buf, pdf_buf, pos_buf))
        np.abs(xb, out=t)                           # y = |x|
        t += 1.0 / _MILLS_T
        np.divide(_MILLS_BETA / _MILLS_T, t, out=t)  # s = beta t = beta / (1 + 0.265 y)
        np.square(xb, out=pdf)
        pdf *= -0.5
        np.exp(pdf, out=pdf)
        pdf *= _INV_SQRT_2PI                        # phi(x) = exp(-x^2/2) / sqrt(2 pi)
        np.add(t, _MILLS_M[0], out=r)               # R = s (s^8 + M[0] s^7 + ... + M[7]),
        for c in _MILLS_M[1:]:                      #   Horner's rule
            r *= t
            r += c
        r *= t
        r *= pdf                                    # a = Phi(-y) = phi(y) R(y)
        # Phi(x) = |[x > 0] - a|, i.e. a for x <= 0 and 1 - a for x > 0 (a <= 1/2)
        # (arithmetic instead of np.where, which is slow on randomly mixed signs; the 0/1
        # step is copied to float32 first: bool - float32 is a slow mixed-type loop)
        np.greater(xb, 0.0, out=pos)
        np.copyto(cdf, pos)
        cdf -= r
        np.abs(cdf, out=cdf)
        np.multiply(xb, cdf, out=out[blk])          # gelu(x) = x Phi(x)
        np.multiply(xb, pdf, out=dydx[blk])         # d gelu / dx = Phi(x) + x phi(x)
        dydx[blk] += cdf
    return out.reshape(x.shape), dydx.reshape(x.shape)


# ----------------------------------------------------------------------------------------
# GELU

_GELU_FORMS = ("none", "tanh")
_SQRT_8_OVER_PI = 1.5957691216057307118  # 2 sqrt(2/pi)
_GELU_CUBIC = 0.044715


def gelu_forward(x, *, approximate="none"):
    """GELU (Hendrycks & Gimpel 2016), the FFN nonlinearity of GPT-style models (in place of
    the ReLU of 004 eq. 17).

        approximate="none":  gelu(x) = x Phi(x) = x/2 * erfc(-x / sqrt(2))   (exact)
        approximate="tanh":  gelu(x) = x/2 * (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)   (GPT-2)

    Phi is the standard normal CDF, computed through erfc so that it keeps full relative
    precision for very negative x (float32 input: through Mills' ratio, to float32
    precision, see ``_gelu_float32``). The tanh form is computed as the identical
    x * sigmoid(2u), since (1 + tanh u)/2 = sigmoid(2u) and the sigmoid, unlike 1 + tanh u,
    does not cancel to 0 for negative x.

    x: any shape  ->  out: same shape and dtype
    cache: {"x", "approximate", and "dydx" = Phi(x) + x phi(x), the derivative (exact
            form) or "s", "s_c" = sigmoid(2u), 1 - sigmoid(2u) (tanh form)}
    """
    where = "gelu_forward"
    x = float_array(x, "x", where)
    choice(approximate, "approximate", where, _GELU_FORMS)
    with np.errstate(under="ignore"):  # Phi(x) underflows to 0 below x ~ -38: exact
        if approximate == "none":
            # the local derivative Phi + x phi is kept for the backward, computed here where
            # Phi and phi are at hand: the backward is then a single multiplication
            if x.dtype == np.float32:
                # x^2 may overflow to inf for |x| > 1.8e19: exp(-inf) = 0 is then exact
                with np.errstate(over="ignore"):
                    out, dydx = _gelu_float32(x)
            else:
                cdf = 0.5 * erfc(-x * _INV_SQRT_2)
                xc = np.clip(x, -40.0, 40.0)  # phi(40) underflows to 0 anyway; no x^2 overflow
                pdf = _INV_SQRT_2PI * np.exp(-0.5 * xc * xc)
                out = x * cdf
                dydx = cdf + x * pdf  # d(x Phi(x))/dx = Phi + x phi
            return out, {"x": x, "approximate": approximate, "dydx": dydx}
        # beyond |x| = 50 the sigmoid is 0 or 1 exactly; clipping keeps x^3 from overflowing
        xc = np.clip(x, -50.0, 50.0)
        v = _SQRT_8_OVER_PI * (xc + _GELU_CUBIC * xc * xc * xc)  # v = 2u
        e = np.exp(-np.abs(v))  # in (0, 1]: never overflows
        s = np.where(v >= 0, 1.0, e) / (1.0 + e)  # sigmoid(v), stable on both sides
        s_c = np.where(v >= 0, e, 1.0) / (1.0 + e)  # 1 - sigmoid(v), without cancellation
        return x * s, {"x": x, "approximate": approximate, "s": s, "s_c": s_c}


def gelu_backward(dout, cache):
    """Gradient of :func:`gelu_forward`.

        exact:  dx = dout * (Phi(x) + x phi(x)),   phi(x) = exp(-x^2/2) / sqrt(2 pi)
        tanh:   dx = dout * (s + x s (1 - s) dv/dx),   s = sigmoid(v), v = 2u,
                dv/dx = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    """
    x = cache["x"]
    with np.errstate(under="ignore"):  # products of tiny tail values may underflow to 0: exact
        if cache["approximate"] == "none":
            return (dout * cache["dydx"]).astype(x.dtype, copy=False)  # dydx = Phi + x phi
        s, s_c = cache["s"], cache["s_c"]
        xc = np.clip(x, -50.0, 50.0)  # where clipped, s (1 - s) is exactly 0
        dv = _SQRT_8_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * xc * xc)
        local = s + x * (s * s_c) * dv  # product rule; sigmoid' = s (1 - s)
        return (dout * local).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------------------
# softmax and log-softmax

def softmax_forward(x, *, axis=-1):
    """Softmax over ``axis`` (003 §5.1, 004 eq. 18), max-subtracted so it never overflows.

        y_i = exp(x_i - max_j x_j) / sum_k exp(x_k - max_j x_j)

    x: any shape (at least one axis)  ->  out: same shape; slices along ``axis`` sum to 1
    cache: {"y": the output, "axis": the axis as a non-negative int}
    """
    where = "softmax_forward"
    x = float_array(x, "x", where)
    if x.ndim == 0:
        raise ValueError(f"{where}: x has shape (); expected at least one axis to normalize over")
    axis = axis_arg(axis, x, "x", where)
    y = softmax(x, axis=axis)
    return y, {"y": y, "axis": axis}


def softmax_backward(dout, cache):
    """Gradient of :func:`softmax_forward` (the softmax Jacobian-vector product).

        dx = y * (dout - sum(dout * y))     (sum along the axis)
    """
    y, axis = cache["y"], cache["axis"]
    with np.errstate(under="ignore"):
        dx = y * (dout - np.sum(dout * y, axis=axis, keepdims=True))  # J = diag(y) - y y^T
    return dx.astype(y.dtype, copy=False)


def log_softmax_forward(x, *, axis=-1):
    """Log-softmax over ``axis`` (003 §5.1, 003 §2.1.2: the log-probabilities of cross-entropy).

        out_i = x_i - max_j x_j - log sum_k exp(x_k - max_j x_j)

    Finite for any finite x (logits of +-1e4 included).

    x: any shape (at least one axis)  ->  out: same shape
    cache: {"out": the log-probabilities, "axis": the axis as a non-negative int}
    """
    where = "log_softmax_forward"
    x = float_array(x, "x", where)
    if x.ndim == 0:
        raise ValueError(f"{where}: x has shape (); expected at least one axis to normalize over")
    axis = axis_arg(axis, x, "x", where)
    out = log_softmax(x, axis=axis)
    return out, {"out": out, "axis": axis}


def log_softmax_backward(dout, cache):
    """Gradient of :func:`log_softmax_forward`.

        dx = dout - softmax(x) * sum(dout)     (sum along the axis; softmax(x) = exp(out))
    """
    out, axis = cache["out"], cache["axis"]
    with np.errstate(under="ignore"):
        p = np.exp(out)  # out <= 0, so this never overflows
        dx = dout - p * np.sum(dout, axis=axis, keepdims=True)  # d log y_i / dx_j = delta_ij - y_j
    return dx.astype(out.dtype, copy=False)


# ----------------------------------------------------------------------------------------
# SiLU (swish)

def _sigmoid_pair(x):
    """sigmoid(x) and 1 - sigmoid(x), both without overflow or cancellation.

    With e = exp(-|x|) in (0, 1]: sigmoid(x) = 1/(1+e) for x >= 0 and e/(1+e) for x < 0,
    and 1 - sigmoid(x) is the other one of the two.
    """
    with np.errstate(under="ignore"):  # exp(-|x|) underflows to 0 for |x| > ~745: exact
        e = np.exp(-np.abs(x))
    pos = x >= 0
    s = np.where(pos, 1.0, e) / (1.0 + e)
    s_c = np.where(pos, e, 1.0) / (1.0 + e)
    return s.astype(x.dtype, copy=False), s_c.astype(x.dtype, copy=False)


def silu_forward(x):
    """SiLU, also called swish (Elfwing et al. 2018; Ramachandran et al. 2017): the gate
    activation of the SwiGLU feed-forward layer of LLaMA (Shazeer 2020).

        silu(x) = x sigmoid(x) = x / (1 + exp(-x))

    x: any shape  ->  out: same shape and dtype
    cache: {"x", "s": sigmoid(x), "s_c": 1 - sigmoid(x)}
    """
    x = float_array(x, "x", "silu_forward")
    s, s_c = _sigmoid_pair(x)
    return x * s, {"x": x, "s": s, "s_c": s_c}


def silu_backward(dout, cache):
    """Gradient of :func:`silu_forward`.

        dx = dout * (s + x s (1 - s)),   s = sigmoid(x)   (product rule; sigmoid' = s (1 - s))
    """
    x, s, s_c = cache["x"], cache["s"], cache["s_c"]
    local = s + x * (s * s_c)  # d(x s)/dx = s + x s (1 - s)
    return (dout * local).astype(x.dtype, copy=False)
