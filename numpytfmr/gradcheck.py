"""Gradient checking by finite differences.

Not an equation of the notes but the tool that verifies every backward pass of the package
(``numpytfmr check``, the tests, the autograder) and the one a student runs on a homework
backward. Three functions:

- ``rel_error(a, b)``: ``max |a - b| / max(|a| + |b|, 1e-8)``, the usual one-number summary.
- ``numerical_gradient(f, x, dout)``: plain central differences, for exercises.
- ``check_gradients(forward, backward, inputs)``: the full check. It compares each gradient
  returned by ``backward`` with finite differences of ``forward`` under a random upstream
  gradient ``dout``, checks the properties every backward must have (right shapes and dtypes,
  linear in ``dout``, leaves its cache, inputs and ``dout`` alone, deterministic), tells a
  non-smooth point (ReLU at 0) apart from a wrong gradient, and, when a gradient is wrong,
  says how: off by a named factor (``1/sqrt(64)``), wrong sign, transposed, a missing term,
  an error confined to one slice, or a backward that ignores ``dout``.

The gradient of ``L = sum(out * dout)`` with respect to an input is what ``backward(dout)``
must return (a vector-Jacobian product), so both sides are compared on that scalar.
"""
from dataclasses import dataclass, field
import copy

import numpy as np

from ._validate import choice, number

__all__ = ["rel_error", "numerical_gradient", "check_gradients", "GradcheckResult"]

_EPS = np.finfo(np.float64).eps
# Each computed output value is assumed to carry up to this many ulps of rounding error
# (an op of a few steps loses a few ulps; 10 leaves room without hiding real errors).
_ULPS = 10.0
# Central stencils as pairs (k, w): derivative = sum_k w * (f(x + k h) - f(x - k h)) / (den * h).
_STENCILS = {2: (((1, 1.0),), 2.0),                 # (f(x+h) - f(x-h)) / 2h, error O(h^2)
             4: (((1, 8.0), (2, -1.0)), 12.0)}      # five-point stencil, error O(h^4)
# Step of the refinement run on entries that fail at h (a power of two: exact scaling).
_REFINE = 1.0 / 16.0
# dout comes from its own stream of the seed: np.random.default_rng(seed) itself would often be
# the generator the inputs were drawn from, and then dout == x exactly (for LayerNorm without
# gamma, dout = x is a direction the output ignores: every gradient entry is ~0).
_DOUT_STREAM = 0x67726164
# Two extra douts for the linearity check: a + b != 1, so a backward that ignores dout fails.
_LIN_A, _LIN_B = 1.5, -2.0
_PASS, _FAIL, _INCONCLUSIVE = 0, 1, 2
_MODES = ("full", "directional")


# ---------------------------------------------------------------------------------------
# The two small functions of every gradient-check exercise
# ---------------------------------------------------------------------------------------

def rel_error(a, b):
    """Largest elementwise relative error ``max(|a - b| / max(|a| + |b|, 1e-8))``.

    The floor ``1e-8`` keeps entries where both values are ~0 from dividing by zero.
    Returns a Python float, 0.0 for empty arrays.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    ratio = np.abs(a - b) / np.maximum(np.abs(a) + np.abs(b), 1e-8)
    return float(np.max(ratio)) if ratio.size else 0.0


def numerical_gradient(f, x, dout=None, *, h=1e-6, order=2):
    """Finite-difference gradient of ``f`` at ``x``, in float64.

        order=2:  dL/dx_j ~ (L(x + h e_j) - L(x - h e_j)) / (2h)                     error O(h^2)
        order=4:  dL/dx_j ~ (L(x-2h e_j) - 8 L(x-h e_j) + 8 L(x+h e_j) - L(x+2h e_j)) / (12h)

    with ``L(x) = f(x)`` when ``f`` returns a scalar, or ``L(x) = sum(f(x) * dout)`` when it
    returns an array (the gradient a backward returns for upstream gradient ``dout``).

    ``f`` is called with a float64 COPY of ``x`` whose entries are moved one at a time, so
    ``f`` must compute from its argument (not from an ``x`` captured in a closure); the
    caller's ``x`` is never changed. Output arrays are differenced element by element
    before they are weighted by ``dout``, which loses less to rounding.

    x: any shape -> gradient of the same shape (float64).
    """
    where = "numerical_gradient"
    choice(order, "order", where, tuple(_STENCILS))
    h = number(h, "h", where, low=0.0, low_open=True)
    pairs, den = _STENCILS[order]
    x = np.array(x, dtype=np.float64, order="C")      # our own copy; f only ever sees this one
    if dout is not None:
        dout = np.asarray(dout, dtype=np.float64)
    grad = np.zeros(x.shape)
    x_flat, grad_flat = x.reshape(-1), grad.reshape(-1)   # views: writing x_flat[j] moves x[j]
    for j in range(x_flat.size):
        x_j = x_flat[j]
        diff = 0.0
        for k, w in pairs:
            x_flat[j] = x_j + k * h
            f_plus = np.array(f(x), dtype=np.float64)   # a copy: f may return a view of x
            x_flat[j] = x_j - k * h
            f_minus = np.array(f(x), dtype=np.float64)
            diff = diff + w * (f_plus - f_minus)
        x_flat[j] = x_j                                    # restore before the next entry
        grad_flat[j] = _weigh(diff, dout, where) / (den * h)
    return grad


def _weigh(diff, dout, where):
    """``sum(diff * dout)``, or the scalar ``diff`` when there is no ``dout``."""
    diff = np.asarray(diff)
    if dout is None:
        if diff.size != 1:
            raise ValueError(f"{where}: f returned an array of shape {diff.shape} but dout is None; "
                             "pass dout (an array of that shape) to get the gradient of sum(f(x) * dout)")
        return float(diff.reshape(-1)[0])
    if diff.shape != dout.shape:
        raise ValueError(f"{where}: f returned shape {diff.shape} but dout has shape {dout.shape}; "
                         "they must match")
    return float(np.sum(diff * dout))


# ---------------------------------------------------------------------------------------
# The result of check_gradients
# ---------------------------------------------------------------------------------------

@dataclass
class GradcheckRow:
    """One line of the table: one positional input of ``forward``.

    verdict is one of "PASS", "FAIL", "INCONCLUSIVE" (some entries sit at a kink, the rest
    pass, or forward is not deterministic), "NO GRADIENT" (a float input whose gradient is
    None: frozen or not differentiable), "NOT FLOAT" (None, integer or other input).
    Fields are also readable as keys: ``row["verdict"]``.
    """
    position: int
    name: str
    shape: tuple
    max_abs_error: float
    max_rel_error: float
    verdict: str

    def __getitem__(self, key):
        return getattr(self, key)

    def keys(self):
        return ("position", "name", "shape", "max_abs_error", "max_rel_error", "verdict")


@dataclass(repr=False)
class GradcheckResult:
    """What :func:`check_gradients` found; ``str(result)`` is a readable report.

    passed:       True when no input FAILs and every structural check passed
                  (INCONCLUSIVE entries at kinks do not fail the check)
    errors:       input position -> ``rel_error`` over the compared values (checked inputs only;
                  entries at a kink are left out)
    rows:         one :class:`GradcheckRow` per input, in order
    structural:   list of ``(check_name, passed, message)``
    worst:        position of a failing input -> its worst entries, dicts with keys
                  index, analytic, numeric, abs_error, rel_error
    inconclusive: position -> entries at a kink, dicts with keys index, analytic, numeric,
                  left, right (the one-sided derivatives) and reason
    diagnoses:    position -> list of sentences on what is wrong
    analytic, numeric: position -> the compared values (full mode: arrays of the input's shape;
                  directional mode: 1-D, the directional derivatives then the coordinates)
    dout:         the upstream gradient used
    seed, h, mode, rtol, atol: the settings;  reproduce: a call that repeats the check
    """
    passed: bool
    errors: dict
    rows: list
    structural: list
    worst: dict
    diagnoses: dict
    seed: int
    h: float
    mode: str
    reproduce: str
    rtol: float = 1e-6
    atol: float = 1e-9
    inconclusive: dict = field(default_factory=dict)
    analytic: dict = field(default_factory=dict)
    numeric: dict = field(default_factory=dict)
    dout: np.ndarray = None

    def __bool__(self):
        return bool(self.passed)

    def __repr__(self):
        return self.__str__()

    def __str__(self):
        names = {row.position: row.name for row in self.rows}
        lines = [f"gradient check {'PASSED' if self.passed else 'FAILED'} "
                 f"(mode={self.mode!r}, rtol={self.rtol:g}, atol={self.atol:g})", ""]
        table = [("input", "shape", "max abs err", "max rel err", "verdict")]
        for row in self.rows:
            table.append((row.name, "None" if row.shape is None else str(row.shape),
                          _fmt_err(row.max_abs_error), fmt_rel_error(row.max_rel_error), row.verdict))
        widths = [max(len(r[c]) for r in table) for c in range(5)]
        for r in table:
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        if any(r[3] == _BELOW_NOISE for r in table):
            lines.append(f"  ({_BELOW_NOISE}: every difference is within the rounding error of the "
                         "finite differences)")
        failed = [(name, msg) for name, ok, msg in self.structural if not ok]
        if failed:
            lines += ["", "structural checks that failed:"]
            lines += [f"  - {name}: {msg}" for name, msg in failed]
        if self.worst:
            lines += ["", "worst entries (analytic = from backward, numeric = finite differences):"]
            for pos, entries in self.worst.items():
                for e in entries:
                    lines.append(f"  {names[pos]} {_fmt_index(e['index'])}: analytic {e['analytic']:.8g}, "
                                 f"numeric {e['numeric']:.8g} (abs err {e['abs_error']:.2e})")
        if self.inconclusive:
            lines += ["", "inconclusive entries (not failures):"]
            for pos, entries in self.inconclusive.items():
                for e in entries[:3]:
                    lines.append(f"  {names[pos]} {_fmt_index(e['index'])}: {e['reason']}")
                if len(entries) > 3:
                    lines.append(f"  {names[pos]}: ... {len(entries) - 3} more")
        if any(self.diagnoses.values()):
            lines += ["", "diagnoses:"]
            for pos, sentences in self.diagnoses.items():
                lines += [f"  {names[pos]}: {s}" for s in sentences]
        lines += ["", f"seed {self.seed}, step h = {self.h:g} (five-point stencil)",
                  f"reproduce: {self.reproduce}"]
        return "\n".join(lines)


def _fmt_err(v):
    return "-" if v is None else f"{v:.2e}"


_BELOW_NOISE = "< noise"


def fmt_rel_error(v):
    """A reported relative error as text; 0 means no difference rose above the rounding noise."""
    return _BELOW_NOISE if v == 0.0 else _fmt_err(v)


def _fmt_index(index):
    return index if isinstance(index, str) else f"index {index}"


# ---------------------------------------------------------------------------------------
# check_gradients
# ---------------------------------------------------------------------------------------

def check_gradients(forward, backward, inputs, *, h=1e-3, rtol=1e-6, atol=1e-9, seed=0,
                    mode="full", n_directions=8, names=None, n_coordinates=4):
    """Check ``backward`` against finite differences of ``forward``; return a GradcheckResult.

        out, cache = forward(*inputs)          grads = backward(dout, cache)
        numeric_j = (L(x - 2h e_j) - 8 L(x - h e_j) + 8 L(x + h e_j) - L(x + 2h e_j)) / (12 h),
        L = sum(out * dout),  dout ~ N(0, 1) (never all ones), drawn from
        np.random.default_rng([0x67726164, seed]) -- a stream of its own, so that inputs drawn
        from np.random.default_rng(seed) are not equal to dout; ``result.dout`` is the one used

    Why the five-point stencil at h = 1e-3 and not central differences at h = 1e-6: with
    central differences the rounding error of the two forward values, ~eps * |L| / h, alone
    gives relative errors above 1e-7 on 1-10% of random LayerNorm/softmax inputs; the
    fourth-order stencil has truncation error O(h^4) ~ 1e-12 and 1000x less rounding, and
    stayed <= 3e-8 over 200 seeds.

    inputs:   the positional inputs of forward. All of them are copied (floats to float64),
              so the caller's arrays never change. Only float inputs whose gradient is not None
              are checked; None (an absent optional input) and integer arrays (ids, targets)
              must get a None gradient.
    backward: returns one gradient per input as a tuple, or the bare gradient for one input.
    mode:     "full" compares every entry; "directional" compares, per input, the derivative
              along n_directions random unit directions u (analytic: sum(grad * u)) plus
              n_coordinates entries spread over the flattened input (so a small bias is not
              missed) -- for large inputs.
    names:    names of the inputs for the report, e.g. ("x", "W", "b").

    An entry passes when |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|) +
    noise, noise being the rounding error the difference quotient can carry. An entry that
    fails at h is refined at h/16; where the one-sided derivatives disagree the function has
    a kink there (ReLU at 0) and the entry is INCONCLUSIVE rather than failed.

    For a random op pass a forward that makes a fresh generator from a fixed seed on every
    call (``registry.bind`` does this): finite differences need a deterministic forward.
    """
    where = "check_gradients"
    choice(mode, "mode", where, _MODES)
    h = number(h, "h", where, low=0.0, low_open=True)
    rtol = number(rtol, "rtol", where, low=0.0)
    atol = number(atol, "atol", where, low=0.0)
    n_directions = _count(n_directions, "n_directions", where)
    n_coordinates = _count(n_coordinates, "n_coordinates", where)
    seed = _count(seed, "seed", where)
    if mode == "directional" and n_directions + n_coordinates == 0:
        raise ValueError(f"{where}: n_directions and n_coordinates are both 0; directional mode "
                         "needs at least one direction")
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, (tuple, list)):
        raise TypeError(f"{where}: inputs is {_describe(inputs)}; expected a tuple of the positional "
                        "inputs of forward, e.g. (x,) for a single input")
    n_inputs = len(inputs)
    if n_inputs == 0:
        raise ValueError(f"{where}: inputs is empty; expected at least one positional input")
    names = _input_names(names, n_inputs, where)
    reproduce = _reproduce_line(seed, h, mode, rtol, atol, n_directions, n_coordinates)

    report = _Report(names)
    work = [_work_copy(x) for x in inputs]                   # the caller's arrays are never touched
    is_float = [isinstance(w, np.ndarray) and w.dtype == np.float64 for w in work]

    # --- forward: output, cache, determinism -------------------------------------------
    pristine = [_snapshot(w) for w in work]
    out, cache = _run_forward(forward, work, where)
    changed = [names[p] for p in range(n_inputs) if _changes(pristine[p], work[p], "")]
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

    rng = np.random.default_rng([_DOUT_STREAM, seed])
    dout = np.asarray(rng.standard_normal(out.shape))
    dout2 = np.asarray(rng.standard_normal(out.shape))
    if blocked.any():
        dout, dout2 = np.where(blocked, 0.0, dout), np.where(blocked, 0.0, dout2)
    report.dout = dout.copy()

    # --- backward: first call on the real cache, watched for side effects ---------------
    cache_pristine = _snapshot(cache)
    work_pristine = [_snapshot(w) for w in work]
    dout_pristine = dout.copy()
    raw = backward(dout, cache)
    cache_changes = _changes(cache_pristine, cache, "cache")
    report.add("backward leaves cache unchanged", not cache_changes,
               f"backward changed {', '.join(cache_changes[:4])} in place; a backward must not modify its "
               "cache (a second backward call would see the changed values) -- write e.g. "
               "`x = cache['x'] * s`, not `cache['x'] *= s`")
    changed = [names[p] for p in range(n_inputs) if _changes(work_pristine[p], work[p], "")]
    report.add("backward leaves inputs unchanged", not changed,
               f"backward changed {', '.join(changed)} in place (the cache holds the input arrays "
               "themselves, so an in-place update of a cached array changes the caller's input)")
    if changed:
        work = [_snapshot(w) for w in work_pristine]
    report.add("backward leaves dout unchanged", _bitwise_equal(dout, dout_pristine),
               "backward changed dout in place; dout belongs to the caller (a residual branch passes "
               "the same dout on) -- copy it before modifying, e.g. `dx = dout.copy()`")
    dout = dout_pristine

    grads, count_msg = _unpack(raw, n_inputs)
    report.add("one gradient per input", count_msg is None, count_msg or "")
    if grads is None:
        for p in range(n_inputs):
            if is_float[p]:
                report.row(p, work[p].shape, "FAIL")
                report.diagnose(p, count_msg)
            else:
                report.row(p, _shape_of(work[p]), "NOT FLOAT")
        return report.result(seed, h, mode, reproduce, rtol, atol)

    # --- which gradients can be compared -----------------------------------------------
    analytic = {}
    bad_kind, bad_shape, bad_dtype = [], [], []
    wrong_dtype, grad_dtypes = set(), {}
    for p, (x, g) in enumerate(zip(work, grads)):
        if not is_float[p]:
            if g is not None:
                what = "None (an absent input)" if x is None else _describe(x)
                bad_kind.append(f"{names[p]} is {what} but got {_describe(g)}")
                report.diagnose(p, f"backward returned a gradient for {names[p]}, which is {what}; "
                                   "only float inputs take a gradient: return None for it")
            continue
        if g is None:
            continue
        g_arr = g if isinstance(g, np.ndarray) else np.asarray(g)
        if g_arr.dtype.kind not in "fiu" or g_arr.shape != x.shape:
            bad_shape.append(f"{names[p]}: {_describe(g)}, input shape {x.shape}")
            swapped = g_arr.shape[:-2] + g_arr.shape[-1:-3:-1] if g_arr.ndim >= 2 else None
            hint = " (transposed?)" if swapped == x.shape else ""
            report.diagnose(p, f"the gradient is {_describe(g)} but the input has shape {x.shape}{hint}; "
                               "a gradient has exactly its input's shape (sum over broadcast axes)")
            continue
        if g_arr.dtype != x.dtype:
            wrong_dtype.add(p)
            bad_dtype.append(f"{names[p]}: {g_arr.dtype}")
            report.diagnose(p, f"the gradient has dtype {g_arr.dtype} but its input is {x.dtype}; "
                               "a gradient has its input's dtype (look for a constant or array of another "
                               "dtype mixed in, or an astype)")
        analytic[p] = np.array(g_arr, dtype=np.float64)
        grad_dtypes[p] = g_arr.dtype
    report.add("no gradient for non-float inputs", not bad_kind, "; ".join(bad_kind))
    report.add("gradient shapes", not bad_shape, "; ".join(bad_shape))
    report.add("gradient dtypes", not bad_dtype,
               "; ".join(bad_dtype) + f" (inputs are {np.dtype(np.float64)})")

    # --- backward is a linear map of dout, and deterministic -----------------------------
    if analytic:
        _check_linearity(backward, cache_pristine, dout, dout2, analytic, grad_dtypes, n_inputs, report)

    # --- finite differences --------------------------------------------------------------
    weight = float(np.sum(np.abs(np.where(blocked, 0.0, out) * dout)))
    for p, x in enumerate(work):
        if not is_float[p]:
            report.row(p, _shape_of(x), "NOT FLOAT")
        elif grads[p] is None:
            report.row(p, x.shape, "NO GRADIENT")
        elif p not in analytic:
            report.row(p, x.shape, "FAIL")
        elif not deterministic:
            report.row(p, x.shape, "INCONCLUSIVE")
        else:
            cmp = _compare_input(forward, work, p, analytic[p], out, blocked, dout, weight, h, rtol,
                                 atol, mode, n_directions, n_coordinates, rng)
            _record_comparison(report, p, cmp, analytic[p], dout, p in wrong_dtype, atol)
    return report.result(seed, h, mode, reproduce, rtol, atol)


class _Report:
    """Collects rows, structural checks and diagnoses while the check runs."""

    def __init__(self, names):
        self.names = names
        self.rows, self.structural = [], []
        self.errors, self.worst, self.inconclusive, self.diagnoses = {}, {}, {}, {}
        self.analytic, self.numeric = {}, {}
        self.dout = None

    def add(self, name, ok, message, note="ok"):
        self.structural.append((name, bool(ok), note if ok else message))

    def diagnose(self, p, sentence):
        if sentence not in self.diagnoses.setdefault(p, []):
            self.diagnoses[p].append(sentence)

    def row(self, p, shape, verdict, max_abs=None, max_rel=None):
        self.rows.append(GradcheckRow(p, self.names[p], shape, max_abs, max_rel, verdict))

    def result(self, seed, h, mode, reproduce, rtol, atol):
        passed = (all(ok for _, ok, _ in self.structural)
                  and not any(row.verdict == "FAIL" for row in self.rows))
        self.rows.sort(key=lambda row: row.position)
        diagnoses = {p: self.diagnoses[p] for p in sorted(self.diagnoses) if self.diagnoses[p]}
        return GradcheckResult(passed=passed, errors=self.errors, rows=self.rows,
                               structural=self.structural, worst=self.worst, diagnoses=diagnoses,
                               seed=seed, h=h, mode=mode, reproduce=reproduce, rtol=rtol, atol=atol,
                               inconclusive=self.inconclusive, analytic=self.analytic,
                               numeric=self.numeric, dout=self.dout)


def _count(v, name, where):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{where}: {name} is {v!r}; expected a non-negative integer")
    if v < 0:
        raise ValueError(f"{where}: {name} is {v}; expected a non-negative integer")
    return int(v)


def _input_names(names, n_inputs, where):
    if names is None:
        return [f"input {p}" for p in range(n_inputs)]
    if isinstance(names, str) or len(names) != n_inputs:
        raise ValueError(f"{where}: names is {names!r}; expected {n_inputs} names, one per input")
    return [str(name) for name in names]


def _reproduce_line(seed, h, mode, rtol, atol, n_directions, n_coordinates):
    extra = ""
    if rtol != 1e-6:
        extra += f", rtol={rtol!r}"
    if atol != 1e-9:
        extra += f", atol={atol!r}"
    if mode == "directional":
        extra += f", n_directions={n_directions}, n_coordinates={n_coordinates}"
    return f"check_gradients(forward, backward, inputs, seed={seed!r}, h={h!r}, mode={mode!r}{extra})"


def _describe(x):
    if isinstance(x, np.ndarray):
        return f"an array of dtype {x.dtype} and shape {x.shape}"
    return "None" if x is None else f"a {type(x).__name__}"


def _shape_of(x):
    return x.shape if isinstance(x, np.ndarray) else None


def _work_copy(x):
    """A private copy of one input: float data as C-ordered float64, other arrays copied."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "f":
            return np.array(x, dtype=np.float64, order="C")
        return x.copy()
    if isinstance(x, (float, np.floating)):
        return np.array(x, dtype=np.float64)
    return x


def _run_forward(forward, args, where):
    result = forward(*args)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"{where}: forward must return (out, cache); got {_describe(result)}")
    out, cache = result
    try:
        out = np.array(out, dtype=np.float64)      # a copy: out may be a view of an input
    except (TypeError, ValueError):
        raise TypeError(f"{where}: forward returned an out that is {_describe(out)}; expected a "
                        "float array or a scalar") from None
    return out, cache


def _unpack(raw, n_inputs):
    """The list of gradients, or None and a message when their number is wrong."""
    if n_inputs == 1:
        if isinstance(raw, (tuple, list)):
            return None, (f"backward returned a {type(raw).__name__} of {len(raw)} for 1 input; the "
                          "gradient of a single input is returned bare, not in a tuple")
        return [raw], None
    if not isinstance(raw, (tuple, list)):
        return None, (f"backward returned {_describe(raw)} for {n_inputs} inputs; it must return a "
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


# --- linearity of backward in dout ------------------------------------------------------

def _check_linearity(backward, cache_pristine, dout, dout2, analytic, dtypes, n_inputs, report):
    """backward(0) = 0, backward(a d1 + b d2) = a backward(d1) + b backward(d2), repeatable.

    A backward is the map dout -> dout J (a vector-Jacobian product), linear in dout. Each call
    gets a fresh copy of the cache, so a backward that changes its cache (reported above) does
    not spoil these checks.
    """
    def call(d):
        raw = backward(d.copy(), _snapshot(cache_pristine))
        grads, _ = _unpack(raw, n_inputs)
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
    g_mix, g_again = call(_LIN_A * dout + _LIN_B * dout2), call(dout)
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
        floor = 100.0 * _EPS * scale_all
        with np.errstate(invalid="ignore", over="ignore"):
            zero_ok = g_zero[p] is not None and bool(np.all(np.abs(g_zero[p]) <= rel * scale_1 + floor))
            lin_ok = g_2[p] is not None and g_mix[p] is not None
            if lin_ok:
                # rounding of backward is relative to the size of the gradients involved
                scale = abs(_LIN_A) * scale_1 + abs(_LIN_B) * _max_abs(g_2[p])
                residual = np.abs(g_mix[p] - (_LIN_A * g_1 + _LIN_B * g_2[p]))
                lin_ok = bool(np.all(residual <= rel * scale + floor))
        if not zero_ok:
            not_zero.append(name)
        if not lin_ok:
            not_linear.append(name)
        if zero_ok and lin_ok:
            continue
        parts = []
        if not zero_ok:
            parts.append("backward(dout = 0) is not 0")
        if not lin_ok:
            parts.append("backward(a*d1 + b*d2) != a*backward(d1) + b*backward(d2)")
        sentence = "the gradient does not scale with dout: " + " and ".join(parts)
        if g_2[p] is not None and np.any(g_1 != 0) and _bitwise_equal(g_1, g_2[p]):
            sentence += ("; backward returns the same gradient for two different dout, so it ignores "
                         "dout (e.g. a gradient computed for dout = ones): multiply by dout")
        else:
            sentence += ("; a backward is linear in dout -- every term must carry dout exactly once "
                         "(no constant added, no dout squared or clipped)")
        report.diagnose(p, sentence)
    report.add("backward(0) = 0", not not_zero,
               f"backward(zeros) gave a non-zero gradient for {', '.join(not_zero)}: "
               "the gradient does not scale with dout")
    report.add("backward linear in dout", not not_linear,
               f"backward(a*d1 + b*d2) != a*backward(d1) + b*backward(d2) for {', '.join(not_linear)}: "
               "the gradient does not scale with dout")
    report.add("backward deterministic", not not_repeatable,
               f"two backward calls with the same dout and cache gave different gradients for "
               f"{', '.join(not_repeatable)} (hidden state or randomness in backward?)")


# --- finite differences of one input ----------------------------------------------------

def _compare_input(forward, work, p, grad, out, blocked, dout, weight, h, rtol, atol, mode,
                   n_directions, n_coordinates, rng):
    """Compare ``grad`` with finite differences of forward along coordinates or directions.

    Returns a dict of arrays over the compared values: analytic ``a``, numeric ``n``, tolerance
    ``tol``, ``status`` (_PASS/_FAIL/_INCONCLUSIVE), ``labels`` (index tuple or "direction k"),
    plus ``notes`` for inconclusive entries and ``project`` (maps an input-shaped array to the
    same compared values, used by the diagnoses).
    """
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
        return _ULPS * _EPS * weights_sum * weight / (den * t) + 4.0 * _EPS * x_max / t * abs(value)

    count = len(vectors) + len(coords)
    a = np.empty(count)
    n = np.empty(count)
    labels, perturbs, is_coord = [], [], []
    for k in range(count):
        perturb, a[k], label, coord = direction(k)
        n[k], _ = stencil(perturb, h)
        labels.append(label)
        perturbs.append(perturb)
        is_coord.append(coord)
    with np.errstate(invalid="ignore"):
        rounding = noise(18.0, 12.0, h, np.abs(n))
        tol = atol + rtol * np.maximum(np.abs(a), np.abs(n)) + rounding
        status = np.where(np.abs(a - n) <= tol, _PASS, _FAIL)
    notes = []
    # Entries that fail at h: look closer, at step s = h/16.
    s = h * _REFINE
    for k in np.flatnonzero(status != _PASS):
        if not np.isfinite(a[k]):
            continue                                          # a NaN/inf gradient is simply wrong
        n_s, y = stencil(perturbs[k], s)
        # Second-order one-sided derivatives from the right and from the left.
        right = 4.0 * (y[1] - out_clean) - (y[2] - out_clean)       # (-3 f0 + 4 f(s) - f(2s))
        left = 4.0 * (out_clean - y[-1]) - (out_clean - y[-2])      # (3 f0 - 4 f(-s) + f(-2s))
        right = float(np.dot(right.reshape(-1), dout_flat)) / (2 * s)
        left = float(np.dot(left.reshape(-1), dout_flat)) / (2 * s)
        if not np.isfinite([n[k], n_s, left, right]).all():
            status[k] = _INCONCLUSIVE
            notes.append(dict(index=labels[k], analytic=a[k], numeric=n[k], left=left, right=right,
                              reason="forward is not finite near this point (a domain boundary?); "
                                     "finite differences cannot judge it"))
            continue
        tol_lr = (atol + rtol * max(abs(left), abs(right))
                  + 2 * noise(8.0, 2.0, s, max(abs(left), abs(right))))
        if abs(left - right) <= tol_lr:
            # Smooth at the scale of s: the refined value is the better estimate (a kink or large
            # higher derivatives within 2h spoiled the estimate at h).
            tol_s = atol + rtol * max(abs(a[k]), abs(n_s)) + noise(18.0, 12.0, s, abs(n_s))
            n[k], tol[k] = n_s, tol_s
            rounding[k] = noise(18.0, 12.0, s, abs(n_s))
            status[k] = _PASS if abs(a[k] - n_s) <= tol_s else _FAIL
            continue
        # The slope jumps here: a kink (ReLU at 0, max with ties). Any value between the one-sided
        # derivatives is a valid convention along a coordinate; along a random direction several
        # kinks can be crossed at once, so no range can be asserted there.
        lo, hi = min(left, right) - tol[k], max(left, right) + tol[k]
        if is_coord[k] and not lo <= a[k] <= hi:
            notes_fail = (f"at a kink (one-sided derivatives {left:.6g} from the left, {right:.6g} "
                          f"from the right), and the analytic {a[k]:.6g} lies outside that range")
            status[k] = _FAIL
            n[k] = 0.5 * (left + right)
            notes.append(dict(index=labels[k], analytic=a[k], numeric=n[k], left=left, right=right,
                              reason=notes_fail, failed=True))
            continue
        status[k] = _INCONCLUSIVE
        slopes = f"one-sided derivatives {left:.6g} from the left, {right:.6g} from the right"
        reason = (f"the function has a kink here ({slopes}); analytic {a[k]:.6g} lies between them, "
                  "so it is a valid choice" if is_coord[k] else
                  f"the function has a kink along this direction ({slopes}, analytic {a[k]:.6g}); "
                  "finite differences cannot judge it")
        notes.append(dict(index=labels[k], analytic=a[k], numeric=n[k], left=left, right=right,
                          reason=reason))

    def project(T):
        """An input-shaped array -> its values along the same directions and coordinates."""
        T = np.asarray(T, dtype=np.float64)
        along = [float(np.vdot(T, u)) for u in vectors]
        return np.concatenate([np.asarray(along), T.reshape(-1)[coords]])

    return dict(a=a, n=n, tol=tol, rounding=rounding, status=status, labels=labels, notes=notes,
                project=project, full=(mode == "full"))


def _record_comparison(report, p, cmp, grad, dout, forced_fail, atol):
    a, n, status = cmp["a"], cmp["n"], cmp["status"]
    conclusive = status != _INCONCLUSIVE
    with np.errstate(invalid="ignore"):
        abs_err = np.abs(a - n)
        max_abs = float(np.max(abs_err[conclusive])) if conclusive.any() else 0.0
    # The reported relative error leaves out entries whose difference is below the rounding
    # noise of the difference quotient: there finite differences cannot resolve anything (a
    # gradient that is zero in exact arithmetic, left with 1e-13 of rounding, would otherwise
    # show a "relative error" of 1e-5 against rel_error's 1e-8 floor).
    # The bound used for pass/fail is about 20x the typical rounding error (10 ulps, stencil
    # weights); for the report only differences within the typical error are left out.
    with np.errstate(invalid="ignore"):
        resolvable = conclusive & ~(abs_err <= cmp["rounding"] / 20.0)
    max_rel = rel_error(a[resolvable], n[resolvable])
    max_abs = float("inf") if np.isnan(max_abs) else max_abs
    max_rel = float("inf") if np.isnan(max_rel) else max_rel
    if forced_fail or (status == _FAIL).any():
        verdict = "FAIL"
    elif (status == _INCONCLUSIVE).any():
        verdict = "INCONCLUSIVE"
    else:
        verdict = "PASS"
    report.row(p, grad.shape, verdict, max_abs, max_rel)
    report.errors[p] = max_rel
    if cmp["full"]:
        report.analytic[p], report.numeric[p] = grad.copy(), n.reshape(grad.shape)
    else:
        report.analytic[p], report.numeric[p] = a.copy(), n.copy()
    inconclusive = [e for e in cmp["notes"] if not e.get("failed")]
    if inconclusive:
        report.inconclusive[p] = inconclusive
    failing = np.flatnonzero(status == _FAIL)
    if failing.size:
        order = failing[np.argsort(-np.nan_to_num(abs_err[failing], nan=np.inf), kind="stable")][:5]
        report.worst[p] = [dict(index=cmp["labels"][k], analytic=float(a[k]) + 0.0, numeric=float(n[k]) + 0.0,
                                abs_error=float(abs_err[k]), rel_error=rel_error(a[k], n[k]))
                           for k in order]
        for sentence in _diagnose(cmp, grad, dout, atol):
            report.diagnose(p, sentence)
        for e in cmp["notes"]:
            if e.get("failed"):
                report.diagnose(p, f"at {_fmt_index(e['index'])} the input sits at a kink, and the analytic "
                                   f"value {e['analytic']:.6g} is outside the range of the one-sided "
                                   f"derivatives [{min(e['left'], e['right']):.6g}, "
                                   f"{max(e['left'], e['right']):.6g}]")
        if not report.diagnoses.get(p):
            report.diagnose(p, "no simple pattern fits (constant factor, sign, transpose, zeros, a missing "
                               "dout term, one slice); compare the worst entries below with the derivation "
                               "term by term")


# --- diagnoses -------------------------------------------------------------------------

def _diagnose(cmp, grad, dout, atol):
    """Sentences that say how a failing gradient is wrong (every one that fits)."""
    use = cmp["status"] != _INCONCLUSIVE
    a, n, project = cmp["a"][use], cmp["n"][use], cmp["project"]
    fail = (cmp["status"] == _FAIL)[use]
    if not np.isfinite(a).all():
        bad = int((~np.isfinite(a)).sum())
        return [f"the analytic gradient has {bad} NaN/inf values (a division by zero or the log/exp "
                "of an unguarded value in backward?)"]
    sentences = []
    scale = max(float(np.max(np.abs(a))) if a.size else 0.0, float(np.max(np.abs(n))) if n.size else 0.0)
    tiny = atol + 1e-12 * scale

    def close(u, v):
        return u.size > 0 and float(np.max(np.abs(u - v))) <= 1e-5 * max(scale, 1e-300) + atol

    # 1. everything zero, or zeros where the numeric gradient is not
    a_zero, n_zero = np.abs(a) <= tiny, np.abs(n) <= tiny
    if a_zero.all() and not n_zero.all():
        sentences.append("the analytic gradient is all zeros but the numeric one is not: this gradient "
                         "is never computed or never added in (a missing term, or a forgotten +=)")
    else:
        k = int((fail & a_zero & ~n_zero).sum())
        if k and 2 * k >= int(fail.sum()):
            sentences.append(f"analytic is zero at {k} of the {int(fail.sum())} wrong entries where the "
                             "numeric gradient is not: a term of the gradient is missing there")
        k = int((fail & n_zero & ~a_zero).sum())
        if k and 2 * k >= int(fail.sum()):
            sentences.append(f"analytic is non-zero at {k} of the {int(fail.sum())} wrong entries where "
                             "the output does not depend on this input (numeric 0): an extra term, or a "
                             "mask not applied in backward")

    # 2. a constant factor (sign included)
    factor_found = False
    nn = float(np.dot(n, n))
    if nn > 0 and not a_zero.all():
        c = float(np.dot(a, n)) / nn
        if abs(c - 1.0) > 1e-4 and close(a, c * n) and (int((~n_zero).sum()) >= 2 or _factor_names(c)):
            factor_found = True
            sentences.append(_factor_sentence(c))
    m = int(fail.sum())
    if not factor_found and 2 <= m < fail.size:
        # the same test on the wrong entries alone: a factor applied to part of the gradient
        a_f, n_f = a[fail], n[fail]
        nn = float(np.dot(n_f, n_f))
        c = float(np.dot(a_f, n_f)) / nn if nn > 0 else 0.0
        if c != 0.0 and abs(c - 1.0) > 1e-4 and close(a_f, c * n_f):
            labels = _factor_names(c)
            named = f" ({abs(c):.4g} = {' = '.join(labels)})" if labels else ""
            sentences.append(f"at the {m} wrong entries analytic = {c:.4g} x numeric{named} (the other "
                             "entries are right): a factor applied to part of the gradient only")

    # 3. transposed over the last two axes
    if (grad.ndim >= 2 and grad.shape[-1] == grad.shape[-2] >= 2
            and close(project(np.swapaxes(grad, -1, -2))[use], n)):
        sentences.append("transposed: analytic equals numeric with the last two axes swapped; the "
                         "gradient is built transposed (for y = x @ W the weight gradient is x^T @ dout, "
                         "of W's shape (d_in, d_out))")

    # 4. a missing (or extra) term proportional to dout: a direct path from this input to out
    reduced = _reduce_to_shape(dout, grad.shape)
    if reduced is not None and not factor_found:
        d = project(reduced)[use]
        r = n - a
        dd = float(np.dot(d, d))
        if dd > 0:
            c = float(np.dot(r, d)) / dd
            if abs(c) > 1e-6 and close(r, c * d) and float(np.max(np.abs(r))) > tiny:
                what = "dout" if reduced.shape == dout.shape else "dout summed over the broadcast axes"
                if c > 0 and reduced.shape == dout.shape:
                    sentences.append(f"numeric - analytic = {_trim(c)}{what}: a term is missing -- the "
                                     "gradient of a direct path from this input to the output (e.g. the identity "
                                     "path of a residual y = f(x) + x, whose gradient is dout itself)")
                elif c > 0:
                    sentences.append(f"numeric - analytic = {_trim(c)}{what}: a term is missing -- the "
                                     "gradient of a path where this input is added to the output directly (as a "
                                     "bias is: its gradient is dout summed over the broadcast axes)")
                else:
                    sentences.append(f"analytic - numeric = {_trim(-c)}{what}: an extra term -- dout "
                                     "passed straight through once too often")

    # 5. errors confined to one slice (full mode)
    if cmp["full"] and grad.ndim >= 1:
        fail_mask = (cmp["status"] == _FAIL).reshape(grad.shape)
        where = np.nonzero(fail_mask)
        m = int(fail_mask.sum())
        if m == 1 and grad.size > 1:
            sentences.append(f"only one entry is wrong, at index {tuple(int(i[0]) for i in where)}: look for "
                             "a special case (a boundary element, an off-by-one)")
        elif m >= 2 and m < grad.size:
            confined = []
            for axis, size in enumerate(grad.shape):
                values = np.unique(where[axis])
                if size > 1 and values.size == 1:
                    i = int(values[0])
                    tag = " (the first)" if i == 0 else (" (the last)" if i == size - 1 else "")
                    confined.append(f"index {i}{tag} of axis {axis}")
            if confined:
                sentences.append(f"the error is confined to one slice: all {m} wrong entries are at "
                                 f"{' and '.join(confined)}; look for an off-by-one, a boundary row handled "
                                 "separately (first/last position, a padded or masked slot), or a slice "
                                 "assignment that misses part of the array")
    return sentences


def _trim(c):
    return "" if abs(c - 1) < 1e-6 else f"{c:.4g} x "


def _reduce_to_shape(dout, shape):
    """dout summed over the axes along which an input of ``shape`` was broadcast, or None."""
    if dout.shape == tuple(shape):
        return dout
    try:
        if np.broadcast_shapes(dout.shape, shape) != dout.shape:
            return None
    except ValueError:
        return None
    lead = dout.ndim - len(shape)
    reduced = dout.sum(axis=tuple(range(lead))) if lead else dout
    ones = tuple(i for i, size in enumerate(shape) if size == 1 and reduced.shape[i] != 1)
    return reduced.sum(axis=ones, keepdims=True) if ones else reduced


def _factor_names(c):
    """Names of common factors equal to |c|, e.g. ["8", "sqrt(64)"] or ["1/8", "1/sqrt(64)"]."""
    c = abs(c)
    ds = sorted(set(range(2, 17)) | {2 ** k for k in range(1, 13)})   # small ints and powers of 2
    candidates = ([(float(d), f"{d}") for d in ds] + [(1.0 / d, f"1/{d}") for d in ds]
                  + [(np.sqrt(d), f"sqrt({d})") for d in ds]
                  + [(1.0 / np.sqrt(d), f"1/sqrt({d})") for d in ds])
    return [label for value, label in candidates if abs(c - value) <= 1e-4 * value]


def _factor_sentence(c):
    labels = _factor_names(c)
    named = f" ({abs(c):.4g} = {' = '.join(labels)})" if labels else ""
    if abs(c + 1.0) <= 1e-4:
        return ("wrong sign: analytic = -1 x numeric; a sign is flipped somewhere (a subtraction "
                "reversed, or the gradient of -L returned)")
    if c < 0:
        return (f"wrong sign and scale: analytic = {c:.4g} x numeric{named}: a sign is flipped and a "
                "scale factor is missing or applied twice")
    if not labels:
        return (f"off by a constant factor: analytic = {c:.4g} x numeric at every compared entry; a "
                "scale factor is wrong (a mean vs a sum, a temperature, a normaliser)")
    sentence = f"analytic = {c:.4g} x numeric{named}: a scale factor is missing or applied twice"
    if abs(c - 2.0) <= 1e-4:
        sentence += " (e.g. a gradient added twice, or d(x^2)/dx = 2x doubled again)"
    elif abs(c - 0.5) <= 1e-4:
        sentence += (" (e.g. the 2 of d(x^2)/dx = 2x dropped, or only one of two paths of a shared "
                     "input added)")
    return sentence
