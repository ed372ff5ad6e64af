"""Transposes inside matrix products.

A transposed square factor inside a gradient's product (``dout @ W`` for ``dout @ W.T``,
``dS @ Q`` for ``dS.T @ Q``) keeps the shape right. For each factor the checker sees, in
either orientation ``G``, the numeric gradient is written as ``N = M @ G`` or ``G @ M``
(``M`` through ``pinv(G)``); when exact, ``M @ G^T`` (``G`` transposed) and ``M^T @ G``
(the other factor transposed) are the candidates.
"""
import numpy as np

from .evidence import Diagnosis

__all__ = ["product_diagnoses"]


def product_diagnoses(ev):
    """A sentence when the analytic gradient is the right product with one factor
    transposed; [] otherwise."""
    if ev.a.ndim < 2 or ev.case is None:
        return []
    case = ev.case
    name = f"d{case.name}" if len(case.name) <= 5 and " " not in case.name else f"the gradient of {case.name}"
    factors = [(case.names[q], F) for q, F in case.floats() if F.ndim >= 2]
    if case.dout.ndim >= 2:
        factors.append(("dout", case.dout))
    N, A = ev.n, ev.a
    with np.errstate(all="ignore"):
        for fname, F in factors:
            for G, g_text, g_swapped in ((F, fname, f"{fname}.T"),
                                         (np.swapaxes(F, -1, -2), f"{fname}.T", fname)):
                for side in ("right", "left"):
                    try:
                        found = _candidates(N, G, side, g_text, g_swapped, name)
                    except ValueError:                 # batch axes that do not broadcast
                        continue
                    for cand, text in found:
                        if cand.shape == A.shape and ev.close(A, cand):
                            return [Diagnosis(text, "transpose_product")]
    return []


def _candidates(N, G, side, g_text, g_swapped, name):
    """(candidate, sentence) pairs for N = M @ G (side "right") or N = G @ M ("left")."""
    right = side == "right"
    try:
        P = np.linalg.pinv(G)
    except np.linalg.LinAlgError:
        return []
    axis = -1 if right else -2
    if G.shape[axis] != N.shape[axis]:
        return []
    M = N @ P if right else P @ N
    if not _reproduces(M @ G if right else G @ M, N):
        return []
    out = []
    if G.shape[-1] == G.shape[-2]:
        G_T = np.swapaxes(G, -1, -2)
        where, rule = ((f"(... @ {g_text})", "dx = dout @ W.T") if right
                       else (f"({g_text} @ ...)", "dW = x.T @ dout"))
        out.append((M @ G_T if right else G_T @ M,
                    f"transposed factor in a product: {name} equals the right gradient "
                    f"{where} computed with {g_swapped} in place of {g_text}, i.e. you "
                    f"multiply by {g_swapped} where {g_text} belongs (for y = x @ W, {rule}); "
                    "a square factor keeps the shape right, so only the values show it"))
    if M.shape[-1] == M.shape[-2]:
        M_T = np.swapaxes(M, -1, -2)
        if right:
            example = ("dV = A @ dout where dV = A.T @ dout is right" if g_text == "dout" else
                       "attention's dK = dS @ Q where dK = dS.T @ Q * scale is right")
            out.append((M_T @ G,
                        f"transposed factor in a product: {name} = X @ {g_text} where the right "
                        f"gradient is X.T @ {g_text}: the factor multiplying {g_text} is "
                        f"transposed (e.g. {example})"))
        else:
            out.append((G @ M_T,
                        f"transposed factor in a product: {name} = {g_text} @ X where the right "
                        f"gradient is {g_text} @ X.T: the factor that {g_text} multiplies is "
                        "transposed (e.g. dV = A @ dout where dV = A.T @ dout is right)"))
    return out


def _reproduces(u, v):
    if u.shape != v.shape:
        try:
            u = np.broadcast_to(u, v.shape)
        except ValueError:
            return False
    scale = float(np.max(np.abs(v))) if v.size else 0.0
    return bool(np.all(np.isfinite(u))) and float(np.max(np.abs(u - v))) <= 1e-8 * max(scale, 1e-300)
