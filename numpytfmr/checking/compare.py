"""Finite differences of one input, entry by entry or along random directions.

Each compared value (an entry, or the derivative along a random unit direction) is PASS,
FAIL or INCONCLUSIVE (a kink, or not finite nearby). One that fails at step h is looked at
again at h/16: where the one-sided derivatives agree the finer estimate decides; where they
differ it is a kink, and any value between them is a valid gradient.
"""
import numpy as np

__all__ = ["PASS", "FAIL", "INCONCLUSIVE", "EPS", "compare_input"]

PASS, FAIL, INCONCLUSIVE = 0, 1, 2
EPS = np.finfo(np.float64).eps
# Each computed output value is assumed to carry up to this many ulps of rounding error
# (an op of a few steps loses a few ulps; 10 leaves room without hiding real errors).
_ULPS = 10.0
# Step of the refinement run on entries that fail at h (a power of two: exact scaling).
_REFINE = 1.0 / 16.0


def compare_input(forward, work, p, grad, out, blocked, dout, weight, h, rtol, atol, mode,
                  n_directions, n_coordinates, rng):
    """Compare ``grad`` with finite differences of forward along coordinates or directions.

    Returns a dict over the compared values: ``a``, ``n``, ``tol``, ``rounding``, ``status``,
    ``labels`` (index tuple or "direction k"), ``notes`` of inconclusive entries, and
    ``project`` (an input-shaped array -> the same compared values, for the diagnoses)."""
    x = work[p]
    args = list(work)
    out_clean = np.where(blocked, 0.0, out)
    dout_flat = dout.reshape(-1)
    has_blocked = bool(blocked.any())

    def output(xp):
        """sum-ready forward output at a perturbed input (a copy; infinite entries zeroed)."""
        args[p] = xp
        y = np.array(forward(*args)[0], dtype=np.float64)
        if y.shape != out.shape:
            raise ValueError(f"check_gradients: forward output changed shape from {out.shape} to "
                             f"{y.shape} when input {p} was perturbed")
        if has_blocked:
            y[blocked] = 0.0
        return y

    x_flat, g_flat = x.reshape(-1), grad.reshape(-1)
    if mode == "full":
        vectors, coords = [], np.arange(x.size)
    else:
        vectors = []
        for _ in range(n_directions if x.size else 0):
            u = rng.standard_normal(x.shape)
            vectors.append(u / np.linalg.norm(u))
        coords = (np.unique(np.round(np.linspace(0, x.size - 1, n_coordinates)).astype(np.int64))
                  if x.size and n_coordinates else np.zeros(0, dtype=np.int64))

    def direction(k):
        """(perturb(t) -> x + t*u, analytic derivative along u, label, is a coordinate)."""
        if k < len(vectors):
            u = vectors[k]
            return (lambda t: x + t * u), float(np.vdot(grad, u)), f"direction {k}", False
        j = int(coords[k - len(vectors)])

        def perturb(t):
            xp = x.copy()
            xp.reshape(-1)[j] = x_flat[j] + t
            return xp
        return perturb, float(g_flat[j]), tuple(int(i) for i in np.unravel_index(j, x.shape)), True

    def stencil(perturb, t):
        """Five-point derivative along a direction at step t, and the outputs it evaluated."""
        y = {k: output(perturb(k * t)) for k in (-2, -1, 1, 2)}
        diff = 8.0 * (y[1] - y[-1]) - (y[2] - y[-2])        # outputs differenced first
        return float(np.dot(diff.reshape(-1), dout_flat)) / (12.0 * t), y

    # Rounding noise of a difference quotient: each output value carries up to _ULPS * eps * |out|,
    # so sum_k |w_k| * sum_i |dout_i * y_k,i| / den bounds the error of the weighted sum (the y_k
    # differ from out by O(h), so sum_i |dout_i y_k,i| ~ weight = sum|out * dout|). The step itself
    # is off by up to eps * |x| (x + t is rounded), a relative error eps * max|x| / t.
    x_max = float(np.max(np.abs(x))) if x.size else 0.0

    def noise(weights_sum, den, t, value):
        return _ULPS * EPS * weights_sum * weight / (den * t) + 4.0 * EPS * x_max / t * abs(value)

    rows = [direction(k) for k in range(len(vectors) + len(coords))]
    perturbs, labels, is_coord = [r[0] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
    a = np.array([r[1] for r in rows], dtype=np.float64)
    n = np.array([stencil(perturb, h)[0] for perturb in perturbs], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        rounding = noise(18.0, 12.0, h, np.abs(n))
        tol = atol + rtol * np.maximum(np.abs(a), np.abs(n)) + rounding
        status = np.where(np.abs(a - n) <= tol, PASS, FAIL)
    notes = []

    def note(k, left, right, reason, **extra):
        notes.append(dict(index=labels[k], analytic=a[k], numeric=n[k], left=left, right=right,
                          reason=reason, **extra))

    # Entries that fail at h: look closer, at step s = h/16.
    s = h * _REFINE
    for k in np.flatnonzero(status != PASS):
        if not np.isfinite(a[k]):
            continue                                          # a NaN/inf gradient is simply wrong
        n_s, y = stencil(perturbs[k], s)
        # Second-order one-sided derivatives from the right and from the left.
        right = 4.0 * (y[1] - out_clean) - (y[2] - out_clean)       # (-3 f0 + 4 f(s) - f(2s))
        left = 4.0 * (out_clean - y[-1]) - (out_clean - y[-2])      # (3 f0 - 4 f(-s) + f(-2s))
        right = float(np.dot(right.reshape(-1), dout_flat)) / (2 * s)
        left = float(np.dot(left.reshape(-1), dout_flat)) / (2 * s)
        if not np.isfinite([n[k], n_s, left, right]).all():
            status[k] = INCONCLUSIVE
            note(k, left, right, "forward is not finite near this point (a domain boundary?); "
                                 "finite differences cannot judge it")
            continue
        tol_lr = (atol + rtol * max(abs(left), abs(right))
                  + 2 * noise(8.0, 2.0, s, max(abs(left), abs(right))))
        if abs(left - right) <= tol_lr:
            # Smooth at the scale of s: the refined value is the better estimate (a kink or large
            # higher derivatives within 2h spoiled the estimate at h).
            tol_s = atol + rtol * max(abs(a[k]), abs(n_s)) + noise(18.0, 12.0, s, abs(n_s))
            n[k], tol[k] = n_s, tol_s
            rounding[k] = noise(18.0, 12.0, s, abs(n_s))
            status[k] = PASS if abs(a[k] - n_s) <= tol_s else FAIL
            continue
        # The slope jumps here: a kink (ReLU at 0, max with ties). Any value between the one-sided
        # derivatives is a valid convention along a coordinate; along a random direction several
        # kinks can be crossed at once, so no range can be asserted there.
        lo, hi = min(left, right) - tol[k], max(left, right) + tol[k]
        if is_coord[k] and not lo <= a[k] <= hi:
            status[k] = FAIL
            n[k] = 0.5 * (left + right)
            note(k, left, right, f"at a kink (one-sided derivatives {left:.6g} from the left, "
                                 f"{right:.6g} from the right), and the analytic {a[k]:.6g} lies "
                                 "outside that range", failed=True)
            continue
        status[k] = INCONCLUSIVE
        slopes = f"one-sided derivatives {left:.6g} from the left, {right:.6g} from the right"
        reason = (f"the function has a kink here ({slopes}); analytic {a[k]:.6g} lies between them, "
                  "so it is a valid choice" if is_coord[k] else
                  f"the function has a kink along this direction ({slopes}, analytic {a[k]:.6g}); "
                  "finite differences cannot judge it")
        note(k, left, right, reason)

    def project(T):
        """An input-shaped array -> its values along the same directions and coordinates."""
        T = np.asarray(T, dtype=np.float64)
        along = [float(np.vdot(T, u)) for u in vectors]
        return np.concatenate([np.asarray(along), T.reshape(-1)[coords]])

    return dict(a=a, n=n, tol=tol, rounding=rounding, status=status, labels=labels, notes=notes,
                project=project, full=(mode == "full"))
