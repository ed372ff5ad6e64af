"""Row-wise mistakes: a missing term of a normalisation, a reduction over the wrong axis.

The gradients of softmax, log-softmax, cross-entropy, LayerNorm and RMSNorm have terms
``V * c_i``: a fixed array ``V`` (ones, ``y``, ``softmax(x)``, ``xhat``, ``x``) times one
number per row along the normalised axis (``- mean(dxhat)``, ``- y * sum(dout * y)``). A
missing term leaves ``numeric - analytic = V * c_i``; one reduced over another axis,
``V * (c_i + e_j)``. Both are fitted by least squares along the axis the forward is
invariant along (a shift or scale per row), and ``c_i`` compared with the term's own
coefficient from ``dout``: missing, wrong sign, wrong normaliser, or summed over every axis.
"""
import numpy as np

from .evidence import Diagnosis

__all__ = ["row_diagnoses", "invariant_axes", "MAX_FIT_SIZE"]

MAX_FIT_SIZE = 4096         # row-by-row fits on larger inputs are skipped
MAX_TWO_AXIS_SIZE = 1024    # the two-axis fit is one dense least-squares problem

# family -> (the form of numeric - analytic, what the term is, the term as the notes write it)
_FAMILIES = {
    "ones": ("numeric - analytic is constant along {axis} within each row",
             "a term that is the same for every entry of a row",
             "the gradient through the row mean, LayerNorm's `- mean(dxhat)` (dxhat = dout * gamma; "
             "`- mean(dout)` without gamma)"),
    "xhat": ("numeric - analytic = c_i * xhat along {axis} (xhat = (x - mean) / std, one number "
             "c_i per row)",
             "the term along xhat",
             "LayerNorm's `- xhat * mean(dxhat * xhat)` (dxhat = dout * gamma), the gradient through "
             "sigma"),
    "x": ("numeric - analytic = c_i * x along {axis} (one number c_i per row)",
          "a term proportional to x",
          "RMSNorm's `- xhat * mean(dxhat * xhat)` (xhat = x / rms, dxhat = dout * gamma), the "
          "gradient through rms"),
    "y": ("numeric - analytic = c_i * y along {axis} (y the forward's output, one number c_i per "
          "row)",
          "a term proportional to the output",
          "softmax's `- y * sum(dout * y)` over that axis (the Jacobian-vector product is "
          "`y * (dout - sum(dout * y))`)"),
    "softmax": ("numeric - analytic = c_i * softmax(x) along {axis} (one number c_i per row)",
                "a term proportional to softmax(x)",
                "log-softmax's `- softmax(x) * sum(dout)` over that axis, or cross-entropy's "
                "`softmax(logits)` term (dlogits = (softmax - onehot) * dout / N)"),
    "ones+xhat": ("numeric - analytic = c_i + e_i * xhat along {axis} (two numbers per row)",
                  "both normalisation terms",
                  "LayerNorm's `- mean(dxhat)` and `- xhat * mean(dxhat * xhat)` (the gradients "
                  "through mu and sigma): dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) "
                  "/ sigma"),
    "ones+onehot": ("numeric - analytic = c_i + e_i * onehot({targets}) along {axis} (two numbers "
                    "per row)",
                    "the smoothed targets",
                    "with label smoothing the target of cross-entropy is q' = (1 - eps) onehot + "
                    "eps / K, and dlogits = (softmax - q') * dout / N: the smoothing is missing or "
                    "wrong in the backward"),
}
_TERM = {"ones": "`mean(dxhat)` term", "xhat": "`xhat * mean(dxhat * xhat)` term",
         "x": "`xhat * mean(dxhat * xhat)` term", "y": "`y * sum(dout * y)` term",
         "softmax": "`softmax(x) * sum(dout)` term"}


def row_diagnoses(ev):
    """Sentences for errors of the form ``V * (one number per row)`` (a missing term) or
    ``V * (one number per row + one per slice of another axis)`` (a reduction over the
    wrong axis), along an axis the forward normalises. [] when none fits."""
    case = ev.case
    if case is None or case.x.shape != ev.shape or ev.a.ndim == 0 or not 3 <= ev.a.size <= MAX_FIT_SIZE:
        return []
    axes = [k for k, _ in invariant_axes(case) if ev.shape[k] >= 3]
    found = next(filter(None, (_missing_term(ev, k) for k in axes)), None)
    if not found and ev.a.size <= MAX_TWO_AXIS_SIZE:
        found = next(filter(None, (_wrong_axis(ev, k) for k in axes)), None)
    return [found] if found else []


def _missing_term(ev, k):
    """numeric - analytic = sum_m c_m,i V_m along axis k, one set of c per row."""
    for name, Vs in _families(ev, k):
        if ev.shape[k] < len(Vs) + 2:
            continue                                  # as many unknowns as entries: proves nothing
        coef, fit = _fit_rows(ev.r, Vs, k)
        if coef is None or not ev.close(fit, ev.r) or float(np.max(np.abs(fit))) <= 10 * ev.tol:
            continue
        name, _, targets = name.partition(":")
        return _missing_sentence(ev, name, Vs, coef, k, targets)
    return None


def _wrong_axis(ev, k):
    """numeric - analytic = V * (one number per row along k + one per slice along k2)."""
    x = ev.case.x
    var = ((x - x.mean(axis=k, keepdims=True)) ** 2).mean(axis=k, keepdims=True)
    for name, Vs in _families(ev, k):
        if len(Vs) != 1 or name not in _TERM:
            continue
        variants = [Vs[0]]
        if name in ("ones", "xhat"):
            # LayerNorm's terms carry 1/sigma of the row, sigma = sqrt(var + eps): (m_j - m_i) / sigma_i
            variants += [Vs[0] / np.sqrt(var + eps) for eps in _eps_values(ev) if np.all(var + eps > 0)]
        for k2 in range(ev.a.ndim):
            if k2 == k or ev.shape[k2] < 2:
                continue
            for i, V in enumerate(variants):
                fit = _fit_two_axes(ev.r, V, k, k2)
                if fit is not None and ev.close(fit, ev.r):
                    return _wrong_axis_sentence(ev, name, k, k2, over_sigma=i > 0)
    return None


# --- The axis the forward normalises ---------------------------------------------------

def invariant_axes(case):
    """[(axis, "shift" | "scale")] of the input under diagnosis: the axes along which adding
    a constant to each row (or scaling each row) leaves the forward's output unchanged."""
    def probe():
        x, out = case.x, case.out
        if x.ndim == 0 or x.size < 2:
            return []
        finite = np.isfinite(out)
        rng = np.random.default_rng(20240611)
        spread = float(np.std(x)) + 1e-3
        found = []
        for k in range(x.ndim):
            if x.shape[k] < 2:
                continue
            row_shape = tuple(1 if i == k else s for i, s in enumerate(x.shape))
            for kind in ("shift", "scale"):
                # one change per row, and a reference change per entry (drawn in that order)
                if kind == "shift":
                    moved, ref = (x + 0.3 * spread * rng.standard_normal(s)
                                  for s in (row_shape, x.shape))
                else:
                    moved, ref = (x * rng.uniform(0.8, 1.25, s) for s in (row_shape, x.shape))
                y_moved, y_ref = case.run_with(moved), case.run_with(ref)
                if y_moved is None or y_ref is None:
                    continue
                with np.errstate(invalid="ignore"):
                    change = float(np.max(np.abs(np.where(finite, y_moved - out, 0.0)), initial=0.0))
                    ref_change = float(np.max(np.abs(np.where(finite, y_ref - out, 0.0)), initial=0.0))
                if np.isfinite(change) and ref_change > 0 and change <= 1e-4 * ref_change:
                    found.append((k, kind))
                    break
        # the last axis first: the usual one
        return sorted(found, key=lambda item: -item[0])
    return case.memo(("invariant", case.p), probe)


# --- Fits ------------------------------------------------------------------------------

def _families(ev, k):
    """[(name, [V arrays])] to try along axis k, simplest first; arrays proportional row by
    row to an earlier one are left out (softmax's output is softmax(x))."""
    ones = np.ones(ev.shape)
    x = ev.case.x
    out = ev.case.out
    candidates = [("ones", ones)]
    centred = x - x.mean(axis=k, keepdims=True)
    std = np.sqrt((centred ** 2).mean(axis=k, keepdims=True))
    if np.all(std > 0):
        candidates.append(("xhat", centred / std))
    candidates.append(("x", x))
    if out.shape == x.shape and np.isfinite(out).all():
        candidates.append(("y", out))
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x - x.max(axis=k, keepdims=True))
        sm = e / e.sum(axis=k, keepdims=True)
    if np.isfinite(sm).all():
        candidates.append(("softmax", sm))
    kept = []
    for name, V in candidates:
        if np.any(V) and not any(_rowwise_proportional(V, W, k) for _, W in kept):
            kept.append((name, V))
    families = [(name, [V]) for name, V in kept]
    if "xhat" in dict(kept):
        families.append(("ones+xhat", [ones, dict(kept)["xhat"]]))
    if k == x.ndim - 1:
        for q, t in ev.case.ints():                      # class targets of the rows
            if t.shape == x.shape[:-1]:
                onehot = np.arange(x.shape[-1]) == t[..., None]
                if onehot.any():
                    families.append((f"ones+onehot:{ev.case.names[q]}", [ones, onehot.astype(float)]))
    return families


def _rowwise_proportional(V, W, k):
    """Whether V = c_i * W row by row along axis k."""
    coef, fit = _fit_rows(V, [W], k)
    scale = float(np.max(np.abs(V)))
    return coef is not None and float(np.max(np.abs(fit - V))) <= 1e-9 * scale


def _fit_rows(r, Vs, k):
    """Least squares of r by sum_m c_m,i V_m along axis k, one set of c per row.
    Returns (coefficients (rows, m), fitted array), or (None, None)."""
    R = np.moveaxis(r, k, -1)
    rows = R.shape[:-1]
    d = R.shape[-1]
    R2 = R.reshape(-1, d)
    B = np.stack([np.moveaxis(np.broadcast_to(V, r.shape), k, -1).reshape(-1, d) for V in Vs], axis=1)
    G = np.einsum("gmd,gnd->gmn", B, B)                       # (rows, m, m)
    b = np.einsum("gmd,gd->gm", B, R2)
    try:
        coef = np.einsum("gmn,gn->gm", np.linalg.pinv(G), b)
    except np.linalg.LinAlgError:
        return None, None
    fit2 = np.einsum("gm,gmd->gd", coef, B)
    fit = np.moveaxis(fit2.reshape(rows + (d,)), -1, k)
    return coef, fit


def _fit_two_axes(r, V, k, k2):
    """Least squares of r by V * (u[row along k] + w[row along k2]); the fitted array or None."""
    shape = r.shape
    idx = np.indices(shape)
    g1 = np.ravel_multi_index(tuple(np.delete(idx, k, axis=0)), tuple(np.delete(shape, k)))
    g2 = np.ravel_multi_index(tuple(np.delete(idx, k2, axis=0)), tuple(np.delete(shape, k2)))
    n1, n2 = int(g1.max()) + 1, int(g2.max()) + 1
    size = r.size
    if n1 + n2 >= 0.75 * size:
        return None                                       # too few equations per unknown
    v = np.broadcast_to(V, shape).reshape(-1)
    D = np.zeros((size, n1 + n2))
    D[np.arange(size), g1.reshape(-1)] = v
    D[np.arange(size), n1 + g2.reshape(-1)] = v
    coef, *_ = np.linalg.lstsq(D, r.reshape(-1), rcond=None)
    fit = (D @ coef).reshape(shape)
    # both parts must be there: otherwise it is the one-axis form (tested before)
    part2 = (D[:, n1:] @ coef[n1:]).reshape(shape)
    part2 = part2 - np.moveaxis(np.moveaxis(part2, k2, 0).mean(axis=0, keepdims=True), 0, k2)
    return fit if np.any(np.abs(part2) > 0) else None


# --- The sentences: which term, missing or wrongly scaled, or reduced over the wrong axis ---

def _wrong_axis_sentence(ev, name, k, k2, over_sigma=False):
    v_text = {"ones": "", "y": "y * ", "softmax": "softmax(x) * ", "xhat": "xhat * ", "x": "x * "}[name]
    right, wrong = ev.axis_label(k), f"axis {k2 - ev.a.ndim}"
    return Diagnosis(
        f"numeric - analytic = {v_text}(one number per row along {right} + one number per slice of "
        f"{wrong}){' / sigma' if over_sigma else ''}: a reduction in the backward runs over {wrong} "
        f"where it must run over {right}, the axis the forward normalises -- check the axis= "
        "(and keepdims=True) of the sums and means in the backward", "wrong_axis")


def _missing_sentence(ev, name, Vs, coef, k, targets=""):
    form, what, term = _FAMILIES[name]
    head = f"{form.format(axis=ev.axis_label(k), targets=targets)}: "
    ratio = _coefficient_ratio(ev, name, coef[:, 0], k) if len(Vs) == 1 else None
    if ratio is not None:
        return Diagnosis(head + ratio[1], ratio[0])
    if name == "ones+onehot":
        return Diagnosis(head + term, "smoothing")
    verb = "are" if what.endswith("terms") else "is"
    return Diagnosis(head + f"{what} {verb} missing or wrong; {'they' if verb == 'are' else 'it'} must "
                     f"be {term}", "row_term")


def _coefficient_ratio(ev, name, c, k):
    """Compare the fitted row coefficients with the term's own coefficient computed from
    dout: (kind, text) when they are proportional (missing, wrong sign, wrong normaliser) or
    the term was summed over every axis; None when no base fits."""
    case = ev.case
    if case.dout.shape != ev.shape:
        return None
    x, dout = case.x, case.dout
    d = ev.shape[k]
    eps = _eps_values(ev)[0]
    if name == "y":
        bases = [np.sum(dout * case.out, axis=k)]
    elif name == "softmax":
        bases = [np.sum(dout, axis=k)]
    else:
        # dxhat = dout * gamma: every float input that broadcasts along the row is a gamma
        gains = [np.ones(1)] + [q for _, q in case.floats()
                                if q.ndim >= 1 and q.size > 1 and _broadcasts(q.shape, ev.shape)]
        centred = x - x.mean(axis=k, keepdims=True)
        sigma = np.sqrt((centred ** 2).mean(axis=k) + eps)
        xhat = centred / np.expand_dims(sigma, k)
        rms = np.sqrt((x ** 2).mean(axis=k) + eps)
        base_of = {"ones": lambda g: g.mean(axis=k) / sigma,
                   "xhat": lambda g: (g * xhat).mean(axis=k) / sigma,
                   "x": lambda g: (g * x).mean(axis=k) / rms ** 3}[name]
        bases = [base_of(dout * gamma) for gamma in gains]
    c = c.reshape(-1)
    for base in bases:
        base = np.asarray(base).reshape(-1)
        if base.shape != c.shape:
            continue
        big = np.abs(base) > 1e-3 * float(np.max(np.abs(base)))
        if big.sum() < 1:
            continue
        kappa = -c[big] / base[big]          # the term enters the right gradient as - base * V
        k0 = float(np.median(kappa))
        if np.max(np.abs(kappa - k0)) <= 1e-3 * max(abs(k0), 1e-3):
            return _ratio_text(ev, name, k0, d)
        if name in ("y", "softmax"):
            total = float(np.sum(base))
            if np.max(np.abs(c - (total - base))) <= 1e-5 * max(np.max(np.abs(base)), 1e-300) + ev.tol:
                return ("all_axes",
                        f"the {_TERM[name]} is summed over every axis instead of one row at a time: "
                        f"pass axis={k - len(ev.shape)}, keepdims=True to the sum")
    return None


def _ratio_text(ev, name, kappa, d):
    """(kind, text) for a term entering as (1 - kappa) x the right one."""
    term = _TERM[name]
    yours = 1.0 - kappa
    known = (
        (0.0, "row_term", f"{_FAMILIES[name][1]} is missing: {_FAMILIES[name][2]}"),
        (-1.0, "row_term", f"the {term} has the wrong sign: it is added where it must be "
                           "subtracted (or the reverse)"),
        (d / (d - 1.0), "normaliser", f"your {term} is d/(d-1) = {d}/{d - 1} x the right one: a "
                                      f"mean divided by d - 1 = {d - 1} instead of d = {d} (the "
                                      "variance of the notes is the population variance, "
                                      "normaliser 1/d)"),
        ((d - 1.0) / d, "normaliser", f"your {term} is (d-1)/d = {d - 1}/{d} x the right one: "
                                      f"divided by d = {d} where the forward divides by d - 1 = "
                                      f"{d - 1} (match the forward's variance normaliser)"),
        (float(d), "normaliser", f"your {term} is d = {d} x the right one: a sum where the mean "
                                 "over the row belongs (divide by d)"),
        (1.0 / d, "normaliser", f"your {term} is 1/d = 1/{d} x the right one: a mean where the "
                                "sum over the row belongs"))
    for value, kind, text in known:
        if abs(yours - value) <= 1e-3 * max(abs(value), 1.0):
            return kind, text
    named = ev.case.terms.name_factor(yours) if ev.case.terms is not None else ""
    return "row_term", (f"your {term} is {yours:.4g} x the right one" + (f" ({named})" if named else "")
                        + ": its coefficient is wrong")


def _eps_values(ev):
    """The eps of the case when known (a reference op's option), else the usual ones."""
    terms = ev.case.terms if ev.case is not None else None
    eps = terms.options.get("eps") if terms is not None else None
    return (float(eps),) if isinstance(eps, (int, float)) else (1e-5, 1e-6, 0.0, 1e-3, 1e-8)


def _broadcasts(small, big):
    try:
        return np.broadcast_shapes(small, big) == tuple(big)
    except ValueError:
        return False
