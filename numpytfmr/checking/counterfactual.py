"""Gradients of a slightly different forward: a factor left out, a path left out, a factor
transposed.

A backward that forgets ``gamma`` in ``dxhat = dout * gamma`` returns the gradient of the
forward with ``gamma = 1``; one that forgets the LoRA branch, that with ``B = 0``; one that
uses ``W`` for ``W.T``, that with ``W`` transposed. The analytic gradient is compared with
finite differences of each changed forward along a few random directions.
"""
import numpy as np

from .evidence import Diagnosis

__all__ = ["counterfactual_diagnoses"]

_H = 1e-3
_DIRECTIONS = 3


def counterfactual_diagnoses(ev):
    """A sentence when the analytic gradient is the gradient of the forward with another
    input set to 1, set to 0, or transposed; [] otherwise."""
    case = ev.case
    if case is None or case.dout.shape != case.out.shape or not np.isfinite(case.out).all():
        return []
    x = case.x
    if x.size == 0:
        return []
    rng = np.random.default_rng(11)
    dirs = [u / np.linalg.norm(u) for u in (rng.standard_normal(x.shape) for _ in range(_DIRECTIONS))]
    along_a = [float(np.vdot(ev.a, u)) for u in dirs]
    along_n = [float(np.vdot(ev.n, u)) for u in dirs]
    size = (float(np.linalg.norm(ev.a)) + float(np.linalg.norm(ev.n))) or 1.0
    tol = 1e-6 * size + 10 * ev.tol
    if max(abs(p - q) for p, q in zip(along_a, along_n)) <= 100 * tol:
        return []                       # the directions do not see the error
    grad = f"d{case.name}" if len(case.name) <= 5 and " " not in case.name else f"the gradient of {case.name}"
    for q, F in case.floats():
        qname = case.names[q]
        variants = []
        if F.ndim >= 1 and F.size > 1 and not np.all(F == 1):
            variants.append((np.ones_like(F), "missing_factor",
                             f"{grad} equals the gradient the forward would have with {qname} = 1: the "
                             f"factor {qname} is missing from {grad} (e.g. dxhat = dout * gamma, not dout)"))
        if F.size and np.any(F != 0):
            variants.append((np.zeros_like(F), "missing_path",
                             f"{grad} equals the gradient the forward would have with {qname} = 0: the "
                             f"term of {grad} that goes through {qname} is missing (a path of the forward "
                             "left out of the backward)"))
        if F.ndim >= 2 and F.shape[-1] == F.shape[-2] and not np.array_equal(F, np.swapaxes(F, -1, -2)):
            variants.append((np.swapaxes(F, -1, -2).copy(), "transpose_product",
                             f"{grad} equals the gradient the forward would have with {qname} transposed: "
                             f"a product in the backward uses {qname} where {qname}.T belongs, or the "
                             "reverse (for y = x @ W, dx = dout @ W.T)"))
        for changed, kind, text in variants:
            if _matches(case, q, changed, dirs, along_a, tol):
                return [Diagnosis(text, kind)]
    return []


def _matches(case, q, changed, dirs, along_a, tol):
    """Whether the changed forward's directional derivatives equal the analytic ones."""
    for u, target in zip(dirs, along_a):
        ys = {k: case.run(**{str(case.p): case.x + k * _H * u, str(q): changed})
              for k in (-2, -1, 1, 2)}
        if any(y is None or not np.isfinite(y).all() for y in ys.values()):
            return False
        deriv = float(np.vdot(8.0 * (ys[1] - ys[-1]) - (ys[2] - ys[-2]), case.dout)) / (12.0 * _H)
        if abs(deriv - target) > tol:
            return False
    return True
