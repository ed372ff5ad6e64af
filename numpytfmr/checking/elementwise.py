"""Elementwise ops: is your f'(x) right, and where is it wrong?

An op is elementwise when permuting the input permutes the output the same way; then
``analytic / dout`` is your ``f'(x)``, compared with a five-point difference of the forward
at every entry at once, to say where it is wrong (large ``|x|``, near 0, ``x < 0``, ...).
"""
import numpy as np

from .evidence import Diagnosis

__all__ = ["elementwise_diagnoses", "is_elementwise"]

_H = 1e-3


def is_elementwise(case):
    """Whether ``out = f(x)`` entry by entry for the input under diagnosis."""
    def probe():
        x, out = case.x, case.out
        if out.shape != x.shape or x.size < 4:
            return False
        perm = np.random.default_rng(3).permutation(x.size)
        y = case.run_with(x.reshape(-1)[perm].reshape(x.shape))
        if y is None:
            return False
        expected = out.reshape(-1)[perm].reshape(x.shape)
        finite = np.isfinite(expected)
        if not np.array_equal(finite, np.isfinite(y)):
            return False
        scale = float(np.max(np.abs(expected[finite]), initial=0.0))
        return bool(np.all(np.abs(y[finite] - expected[finite]) <= 1e-12 * max(scale, 1e-300)))
    return case.memo(("elementwise", case.p), probe)


def derivative(case):
    """f'(x) at every entry, by the five-point stencil applied to all entries at once."""
    ys = {k: case.run_with(case.x + k * _H) for k in (-2, -1, 1, 2)}
    if any(y is None for y in ys.values()):
        return None
    with np.errstate(invalid="ignore"):
        return (8.0 * (ys[1] - ys[-1]) - (ys[2] - ys[-2])) / (12.0 * _H)


def elementwise_diagnoses(ev):
    """"your f'(x) is wrong", with where, for an elementwise op."""
    case = ev.case
    if case is None or case.dout.shape != ev.shape or not is_elementwise(case):
        return []
    fprime = derivative(case)
    if fprime is None:
        return []
    x, dout = case.x, case.dout
    usable = (np.abs(dout) > 1e-3 * float(np.max(np.abs(dout)))) & np.isfinite(fprime)
    if usable.sum() < 2:
        return []
    with np.errstate(all="ignore"):
        yours = ev.a / dout
    diff = yours - fprime
    tol = 1e-5 * (1.0 + np.abs(fprime))
    wrong = usable & (np.abs(diff) > tol)
    right = usable & ~wrong
    if not wrong.any():
        return []
    xw, xr = x[wrong], x[right]
    aw, ar = np.abs(xw), np.abs(xr)
    if not right.any() or wrong.sum() >= 0.9 * usable.sum():
        where = "everywhere"
    elif aw.min() > ar.max():
        where = f"for large |x| (|x| >= {aw.min():.2g}; right for |x| <= {ar.max():.2g})"
    elif aw.max() < ar.min():
        where = f"near 0 (|x| <= {aw.max():.2g}; right for |x| >= {ar.min():.2g})"
    elif xw.max() < 0 <= xr.min():
        where = "for x < 0 (right for x >= 0)"
    elif xw.min() > 0 >= xr.max():
        where = "for x > 0 (right for x <= 0)"
    else:
        where = _interval(x[usable], wrong[usable])
    k = np.unravel_index(int(np.argmax(np.where(wrong, np.abs(diff), -1.0))), ev.shape)
    text = (f"elementwise op: analytic / dout should be f'(x), and your f'(x) is wrong {where}: the "
            f"largest difference is at x = {x[k]:.3g}, where yours is {yours[k]:.6g} and finite "
            f"differences give f'(x) = {fprime[k]:.6g}")
    return [Diagnosis(text, "elementwise")]


def _interval(x, wrong):
    """"for x between a and b (right outside)" when the wrong entries are one run of x."""
    order = np.argsort(x, kind="stable")
    w = wrong[order]
    first, last = int(np.argmax(w)), len(w) - 1 - int(np.argmax(w[::-1]))
    if w[first:last + 1].all():
        lo, hi = x[order][first], x[order][last]
        return f"for x between {lo:.2g} and {hi:.2g} (right outside)"
    return f"at {int(wrong.sum())} of {wrong.size} entries, spread over x"
