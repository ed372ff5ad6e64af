"""Special functions NumPy lacks: the error function and the standard normal's CDF and
density, which the exact GELU needs (``gelu(x) = x Phi(x)``, ``activations.py``).

- ``erf(x)`` and ``erfc(x) = 1 - erf(x)``, by Cody's rational approximations, with a
  relative error below 1e-15 in float64, ``erfc`` also in its far tail;
- ``normal_cdf(x)``, Phi, through ``erfc`` so that it keeps its relative precision for very
  negative x; ``normal_pdf(x)``, phi.

Each takes any array, computes in float64 and returns float32 for float32 input.

The error function follows W. J. Cody, "Rational Chebyshev approximations for the error
function", Math. Comp. 23 (1969), p. 631, with the coefficients of his later FORTRAN package
SPECFUN (CALERF, 1990). Three ranges of y = |x|:

    y <= 0.46875       erf(y)  = y P1(y^2) / Q1(y^2)
    0.46875 < y <= 4   erfc(y) = exp(-y^2) P2(y) / Q2(y)
    y > 4              erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - z P3(z) / Q3(z)),  z = 1/y^2
"""
import math

import numpy as np

__all__ = ["erf", "erfc", "normal_cdf", "normal_pdf"]

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


def _horner(coeffs, y):
    """The polynomial with ``coeffs`` (highest degree first) at ``y``, by Horner's rule."""
    acc = np.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        acc = acc * y + c
    return acc


def _exp_minus_square(y):
    """exp(-y^2) without the rounding error of y*y (Cody's device).

    With a = y rounded down to a multiple of 1/16, a*a is exact and
    exp(-y^2) = exp(-a^2) exp((a - y)(y + a)), the second factor's argument small and
    exact up to one rounding; erfc keeps its relative precision in the far tail.
    """
    a = np.trunc(16.0 * y) / 16.0
    return np.exp(-a * a) * np.exp((a - y) * (y + a))


def _cody(y):
    """Cody's approximations at ``y = |x|`` (float64): ``(small, r)`` with ``small = y <= 0.46875``,
    ``r = erf(y)`` where small and ``r = erfc(y)`` elsewhere (NaN propagates)."""
    small = y <= _ERF_SMALL
    mid = ~small & (y <= 4.0)
    big = ~small & ~mid
    r = np.empty_like(y)
    ys = y[small]
    r[small] = _horner(_P1, ys * ys) / _horner(_Q1, ys * ys) * ys
    ym = y[mid]
    r[mid] = _horner(_P2, ym) / _horner(_Q2, ym) * _exp_minus_square(ym)
    # erfc(28) underflows to 0, so larger y are clipped to 28: the result is 0 either way
    # and 1/y^2 cannot overflow
    yb = np.minimum(y[big], 28.0)
    z = 1.0 / (yb * yb)
    r[big] = (_INV_SQRT_PI - z * (_horner(_P3, z) / _horner(_Q3, z))) / yb * _exp_minus_square(yb)
    return small, r


def _float64(x):
    """``x`` as a float64 array, and the dtype to return (float32 stays float32)."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    return x.astype(np.float64, copy=False), dtype


def erf(x):
    """The error function ``erf(x) = 2/sqrt(pi) * int_0^x exp(-t^2) dt``, elementwise.

    Cody's rational approximations (1969), evaluated in float64: relative error below
    1e-15. Returns the dtype of a float32/float64 array (other input is read as float64).
    """
    x, dtype = _float64(x)
    with np.errstate(under="ignore"):  # tails underflow to 0: the exact float answer
        small, r = _cody(np.abs(x))
        out = np.where(small, r, 1.0 - r)                  # erf(y) = 1 - erfc(y) beyond 0.46875
        return np.copysign(out, x).astype(dtype, copy=False)   # erf(-y) = -erf(y)


def erfc(x):
    """The complementary error function ``erfc(x) = 1 - erf(x)``, elementwise.

    Accurate in relative terms also where it is tiny (up to `x = 26.5`; beyond, it underflows
    to 0), which ``1 - erf(x)`` is not: ``erfc(-z) = 1 + erf(z)`` is how the exact GELU
    gets Phi(x) without cancellation for x << 0. Keeps the dtype like :func:`erf`.
    """
    x, dtype = _float64(x)
    with np.errstate(under="ignore"):
        small, r = _cody(np.abs(x))
        out = np.where(small, 1.0 - np.copysign(r, x),      # 1 - erf(x) near 0
                       np.where(x < 0, 2.0 - r, r))          # erfc(-y) = 2 - erfc(y)
        return out.astype(dtype, copy=False)                 # (a float32 tail may round to 0)


def normal_cdf(x):
    """The standard normal CDF ``Phi(x) = (1 + erf(x / sqrt(2))) / 2``, elementwise.

    Computed as ``erfc(-x / sqrt(2)) / 2`` (the same number: ``1 + erf(z) = erfc(-z)``) in
    float64, so that it keeps its relative precision for very negative x, where
    ``1 + erf`` would cancel to 0; returned in x's dtype (float32 stays float32).
    """
    x, dtype = _float64(x)
    with np.errstate(under="ignore"):
        return (0.5 * erfc(-x / math.sqrt(2))).astype(dtype, copy=False)


def normal_pdf(x):
    """The standard normal density ``phi(x) = exp(-x^2 / 2) / sqrt(2 pi)``, elementwise.

    Evaluated in float64 and returned in x's dtype; beyond `|x| = 40` it is 0 (it underflows
    there anyway), without computing `x^2` for huge `x`.
    """
    x, dtype = _float64(x)
    xc = np.clip(x, -40.0, 40.0)
    with np.errstate(under="ignore"):
        return (np.exp(-xc * xc / 2) / math.sqrt(2 * math.pi)).astype(dtype, copy=False)
