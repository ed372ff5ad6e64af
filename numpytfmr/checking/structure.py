"""The properties every backward must have, checked around the finite differences.

A backward is the vector-Jacobian product ``dout -> dout J``: one gradient per input of its
shape and dtype (None for an input without one), linear in ``dout``, repeatable, leaving its
cache, the inputs and ``dout`` unchanged; the forward is deterministic and leaves its inputs
alone. Each check adds ``(name, passed, message)`` (``report.add``) and, where it can, what
to fix (``report.diagnose``).
"""
import copy

import numpy as np

from .compare import EPS
from .evidence import Diagnosis
from .report import describe

__all__ = ["LIN_A", "LIN_B", "work_copy", "shape_of", "unpack", "check_forward", "check_backward_call",
           "usable_gradients", "check_linearity"]

# Two extra douts for the linearity check: a + b != 1, so a backward that ignores dout fails.
LIN_A, LIN_B = 1.5, -2.0


def work_copy(x):
    """A private copy of one input: float data as C-ordered float64, other arrays copied."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "f":
            return np.array(x, dtype=np.float64, order="C")
        return x.copy()
    if isinstance(x, (float, np.floating)):
        return np.array(x, dtype=np.float64)
    return x


def shape_of(x):
    return x.shape if isinstance(x, np.ndarray) else None


def _run_forward(forward, args, where):
    result = forward(*args)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"{where}: forward must return (out, cache); got {describe(result)}")
    out, cache = result
    try:
        out = np.array(out, dtype=np.float64)      # a copy: out may be a view of an input
    except (TypeError, ValueError):
        raise TypeError(f"{where}: forward returned an out that is {describe(out)}; expected a "
                        "float array or a scalar") from None
    return out, cache


def unpack(raw, n_inputs):
    """The list of gradients, or None and a message when their number is wrong."""
    if n_inputs == 1:
        if isinstance(raw, (tuple, list)):
            return None, (f"backward returned a {type(raw).__name__} of {len(raw)} for 1 input; the "
                          "gradient of a single input is returned bare, not in a tuple")
        return [raw], None
    if not isinstance(raw, (tuple, list)):
        return None, (f"backward returned {describe(raw)} for {n_inputs} inputs; it must return a "
                      f"tuple of {n_inputs} gradients (None for inputs that take no gradient)")
    if len(raw) != n_inputs:
        return None, (f"backward returned {len(raw)} gradients for {n_inputs} inputs; it must return "
                      "one per positional input of forward, in order (None for inputs that take no "
                      "gradient)")
    return list(raw), None


# --- snapshots of caches and inputs, to catch in-place changes -----------------------------

def _snapshot(obj):
    """Copy the arrays inside dict/list/tuple containers; other objects are kept as they are."""
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, dict):
        new = copy.copy(obj)    # keeps the dict's type and attributes (an OpCache's tag)
        new.update((k, _snapshot(v)) for k, v in obj.items())
        return new
    if isinstance(obj, list):
        return [_snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        items = [_snapshot(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def _bitwise_equal(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "O":
        return bool(np.array_equal(a, b))
    return a.tobytes() == b.tobytes()


def _changes(before, after, path):
    """Paths under which ``after`` differs from the snapshot ``before``."""
    if isinstance(before, np.ndarray):
        same = isinstance(after, np.ndarray) and _bitwise_equal(before, after)
        return [] if same else [path or "the array"]
    if isinstance(before, dict):
        if not isinstance(after, dict) or before.keys() != after.keys():
            return [f"{path} (keys)"]
        return [c for k in before for c in _changes(before[k], after[k], f"{path}[{k!r}]")]
    if isinstance(before, (list, tuple)):
        if not isinstance(after, (list, tuple)) or len(before) != len(after):
            return [f"{path} (length)"]
        return [c for i, (u, v) in enumerate(zip(before, after)) for c in _changes(u, v, f"{path}[{i}]")]
    if isinstance(before, (bool, int, float, complex, str, bytes, np.generic)) or before is None:
        same = before is after or before == after or (before != before and after != after)  # NaN
        return [] if same else [path]
    return []


def _max_abs(a):
    return float(np.max(np.abs(a))) if a.size else 0.0


def _max_diff_note(a, b):
    if a.shape != b.shape:
        return f" (shapes {a.shape} and {b.shape})"
    with np.errstate(invalid="ignore"):
        return f" (max difference {float(np.nanmax(np.abs(a - b))) if a.size else 0.0:.3g})"


# --- forward and the first backward call ---------------------------------------------------

def check_forward(forward, work, names, report, where):
    """Run ``forward`` twice: unchanged inputs, deterministic, no NaN. Returns ``(out, cache,
    work, deterministic, blocked)``: out as float64, the first call's cache, the inputs
    (restored if changed), and the mask of infinite outputs (no gradient: dout = 0 there)."""
    pristine = [_snapshot(w) for w in work]
    out, cache = _run_forward(forward, work, where)
    changed = [names[p] for p in range(len(work)) if _changes(pristine[p], work[p], "")]
    report.add("forward leaves inputs unchanged", not changed,
               f"forward changed {', '.join(changed)} in place; an op must never modify its inputs")
    if changed:
        work = [_snapshot(w) for w in pristine]
    out_again, _ = _run_forward(forward, work, where)
    deterministic = out_again.shape == out.shape and _bitwise_equal(out, out_again)
    report.add("forward deterministic", deterministic,
               "two forward calls on the same inputs gave different outputs"
               + _max_diff_note(out, out_again) + "; finite differences need a deterministic forward. "
               "For a random op, pass a forward that makes a fresh rng from a fixed seed on every call "
               "(registry.bind does this for an int 'rng' keyword)")
    has_nan = bool(np.isnan(out).any())
    report.add("forward output has no NaN", not has_nan,
               f"forward returned NaN in {int(np.isnan(out).sum())} of {out.size} output entries")
    # +-inf outputs (e.g. log-probabilities of masked entries) carry no gradient: dout = 0 there.
    blocked = ~np.isfinite(out)
    if blocked.any() and not has_nan:
        report.add("forward output finite", True, "",
                   note=f"{int(blocked.sum())} infinite output entries get dout = 0 and are left out")
    return out, cache, work, deterministic, blocked


def check_backward_call(backward, dout, cache, work, names, report):
    """The first call of ``backward`` on the real cache: cache, inputs and ``dout`` must stay
    unchanged. Returns ``(raw, cache_pristine, work)``: what it returned, the cache as it
    was, and the inputs (restored if changed)."""
    cache_pristine = _snapshot(cache)
    work_pristine = [_snapshot(w) for w in work]
    dout_pristine = dout.copy()
    raw = backward(dout, cache)
    cache_changes = _changes(cache_pristine, cache, "cache")
    report.add("backward leaves cache unchanged", not cache_changes,
               f"backward changed {', '.join(cache_changes[:4])} in place; a backward must not modify its "
               "cache (a second backward call would see the changed values) -- write e.g. "
               "`x = cache['x'] * s`, not `cache['x'] *= s`")
    changed = [names[p] for p in range(len(work)) if _changes(work_pristine[p], work[p], "")]
    report.add("backward leaves inputs unchanged", not changed,
               f"backward changed {', '.join(changed)} in place (the cache holds the input arrays "
               "themselves, so an in-place update of a cached array changes the caller's input)")
    if changed:
        work = [_snapshot(w) for w in work_pristine]
    report.add("backward leaves dout unchanged", _bitwise_equal(dout, dout_pristine),
               "backward changed dout in place; dout belongs to the caller (a residual branch passes "
               "the same dout on) -- copy it before modifying, e.g. `dx = dout.copy()`")
    return raw, cache_pristine, work


def usable_gradients(work, grads, is_float, names, report):
    """The gradients finite differences can judge (a float input's, of its shape; a non-float
    input gets None). Returns ``(analytic, dtypes, wrong_dtype)``: position -> gradient as
    float64, position -> its dtype, positions whose dtype is not their input's."""
    analytic = {}
    bad_kind, bad_shape, bad_dtype = [], [], []
    wrong_dtype, grad_dtypes = set(), {}
    for p, (x, g) in enumerate(zip(work, grads)):
        if not is_float[p]:
            if g is not None:
                what = "None (an absent input)" if x is None else describe(x)
                bad_kind.append(f"{names[p]} is {what} but got {describe(g)}")
                report.diagnose(p, Diagnosis(f"backward returned a gradient for {names[p]}, which is "
                                             f"{what}; only float inputs take a gradient: return None "
                                             "for it", "not_float"))
            continue
        if g is None:
            continue
        g_arr = g if isinstance(g, np.ndarray) else np.asarray(g)
        if g_arr.dtype.kind not in "fiu" or g_arr.shape != x.shape:
            bad_shape.append(f"{names[p]}: {describe(g)}, input shape {x.shape}")
            swapped = g_arr.shape[:-2] + g_arr.shape[-1:-3:-1] if g_arr.ndim >= 2 else None
            hint = " (transposed?)" if swapped == x.shape else ""
            report.diagnose(p, Diagnosis(f"the gradient is {describe(g)} but the input has shape "
                                         f"{x.shape}{hint}; a gradient has exactly its input's shape "
                                         "(sum over broadcast axes)", "shape"))
            continue
        if g_arr.dtype != x.dtype:
            wrong_dtype.add(p)
            bad_dtype.append(f"{names[p]}: {g_arr.dtype}")
            report.diagnose(p, Diagnosis(f"the gradient has dtype {g_arr.dtype} but its input is "
                                         f"{x.dtype}; a gradient has its input's dtype (look for a "
                                         "constant or array of another dtype mixed in, or an astype)",
                                         "dtype"))
        analytic[p] = np.array(g_arr, dtype=np.float64)
        grad_dtypes[p] = g_arr.dtype
    report.add("no gradient for non-float inputs", not bad_kind, "; ".join(bad_kind))
    report.add("gradient shapes", not bad_shape, "; ".join(bad_shape))
    report.add("gradient dtypes", not bad_dtype,
               "; ".join(bad_dtype) + f" (inputs are {np.dtype(np.float64)})")
    return analytic, grad_dtypes, wrong_dtype


# --- linearity of backward in dout ------------------------------------------------------

def check_linearity(backward, cache_pristine, dout, dout2, analytic, dtypes, n_inputs, report):
    """backward(0) = 0, backward(a d1 + b d2) = a backward(d1) + b backward(d2), repeatable.
    Each call gets a fresh copy of the cache, so a backward that changes it does not spoil
    these checks."""
    def call(d):
        raw = backward(d.copy(), _snapshot(cache_pristine))
        grads, _ = unpack(raw, n_inputs)
        result = {}
        for p in analytic:
            g = None if grads is None else grads[p]
            try:
                g = None if g is None else np.array(g, dtype=np.float64)
            except (TypeError, ValueError):
                g = None
            result[p] = g if g is not None and g.shape == analytic[p].shape else None
        return result

    g_zero, g_2 = call(np.zeros_like(dout)), call(dout2)
    g_mix, g_again = call(LIN_A * dout + LIN_B * dout2), call(dout)
    not_zero, not_linear, not_repeatable = [], [], []
    # A gradient that is exactly zero in exact arithmetic (a key bias under softmax, whose
    # terms cancel) is left with rounding noise of the size of the terms that cancelled, which
    # are of the size of the other gradients, not of its own: so the rounding allowance also
    # scales with the largest gradient of any input.
    scale_all = max([_max_abs(g) for g in analytic.values()] + [0.0])
    for p, g_1 in analytic.items():
        name = report.names[p]
        if g_again[p] is None or not _bitwise_equal(g_again[p], g_1):
            not_repeatable.append(name)
        scale_1 = _max_abs(g_1)
        # backward rounds at its own precision (a float32 gradient is reported separately)
        rel = max(1e-8, 100.0 * float(np.finfo(dtypes[p]).eps)) if dtypes[p].kind == "f" else 1e-8
        floor = 100.0 * EPS * scale_all
        with np.errstate(invalid="ignore", over="ignore"):
            zero_ok = g_zero[p] is not None and bool(np.all(np.abs(g_zero[p]) <= rel * scale_1 + floor))
            lin_ok = g_2[p] is not None and g_mix[p] is not None
            if lin_ok:
                # rounding of backward is relative to the size of the gradients involved
                scale = abs(LIN_A) * scale_1 + abs(LIN_B) * _max_abs(g_2[p])
                residual = np.abs(g_mix[p] - (LIN_A * g_1 + LIN_B * g_2[p]))
                lin_ok = bool(np.all(residual <= rel * scale + floor))
        if not zero_ok:
            not_zero.append(name)
        if not lin_ok:
            not_linear.append(name)
        if zero_ok and lin_ok:
            continue
        parts = [text for ok, text in ((zero_ok, "backward(dout = 0) is not 0"),
                                       (lin_ok, "backward(a*d1 + b*d2) != a*backward(d1) + "
                                                "b*backward(d2)")) if not ok]
        sentence = "the gradient does not scale with dout: " + " and ".join(parts)
        if g_2[p] is not None and np.any(g_1 != 0) and _bitwise_equal(g_1, g_2[p]):
            sentence += ("; backward returns the same gradient for two different dout, so it ignores "
                         "dout (e.g. a gradient computed for dout = ones): multiply by dout")
        else:
            sentence += ("; a backward is linear in dout -- every term must carry dout exactly once "
                         "(no constant added, no dout squared or clipped)")
        report.diagnose(p, Diagnosis(sentence, "linearity"))
    report.add("backward(0) = 0", not not_zero,
               f"backward(zeros) gave a non-zero gradient for {', '.join(not_zero)}: "
               "the gradient does not scale with dout")
    report.add("backward linear in dout", not not_linear,
               f"backward(a*d1 + b*d2) != a*backward(d1) + b*backward(d2) for {', '.join(not_linear)}: "
               "the gradient does not scale with dout")
    report.add("backward deterministic", not not_repeatable,
               f"two backward calls with the same dout and cache gave different gradients for "
               f"{', '.join(not_repeatable)} (hidden state or randomness in backward?)")
