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
  says how: off by a factor named in the case's terms (``1/scale``, ``sqrt(d_k)``), wrong
  sign, transposed, a missing term (``- mean(dxhat)``, ``- y * sum(dout * y)``, with its
  axis), a sum over the wrong axis, a wrong ``f'(x)``, a transposed factor inside a product,
  repeated ids that overwrite, masked positions, a rotation in the wrong direction, an error
  confined to one slice, or a backward that ignores ``dout``; and which of the op's known
  wrong backwards it is (softmax's ``y * (1 - y) * dout``, LayerNorm's unbiased variance,
  DPO's ``sigmoid(+margin)``: the catalogue declared with each op's registration), for a
  reference op and for a forward of your own alike: the op yours computes is recognised by
  its output ("your forward computes layernorm (eps=1e-05)"), only when a gradient fails.
  docs/gradcheck.md is the user guide.

The gradient of ``L = sum(out * dout)`` with respect to an input is what ``backward(dout)``
must return (a vector-Jacobian product), so both sides are compared on that scalar.

This file holds what a student reads; the machinery of ``check_gradients`` (the structural
checks, the finite differences of one input, the diagnoses, the text of the report) is in
``numpytfmr/checking/``.
"""
from dataclasses import dataclass, field

import numpy as np

from .contract import one_of, positive, real
from .checking.compare import FAIL, INCONCLUSIVE, compare_input
from .checking.diagnose import NO_PATTERN, diagnose, kink_sentence
from .checking import recognise
from .checking.evidence import Case, once
from .checking.report import describe, format_result, reproduce_line
from .checking.structure import (check_backward_call, check_forward, check_linearity, shape_of,
                                 unpack, usable_gradients, work_copy)
from .checking.terms import learn_terms

__all__ = ["rel_error", "numerical_gradient", "check_gradients", "GradcheckResult"]

# Central stencils as pairs (k, w): derivative = sum_k w * (f(x + k h) - f(x - k h)) / (den * h).
_STENCILS = {2: (((1, 1.0),), 2.0),                 # (f(x+h) - f(x-h)) / 2h, error O(h^2)
             4: (((1, 8.0), (2, -1.0)), 12.0)}      # five-point stencil, error O(h^4)
# dout comes from its own stream of the seed: np.random.default_rng(seed) itself would often be
# the generator the inputs were drawn from, and then dout == x exactly (for LayerNorm without
# gamma, dout = x is a direction the output ignores: every gradient entry is ~0).
_DOUT_STREAM = 0x67726164
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
    one_of(*_STENCILS)(order, "order", where)
    h = positive(h, "h", where)
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
# check_gradients
# ---------------------------------------------------------------------------------------

def check_gradients(forward, backward, inputs, *, h=1e-3, rtol=1e-6, atol=1e-9, seed=0,
                    mode="full", n_directions=8, names=None, n_coordinates=4, terms=None):
    """Check ``backward`` against finite differences of ``forward``; return a GradcheckResult.

        out, cache = forward(*inputs)          grads = backward(dout, cache)
        numeric_j = (L(x - 2h e_j) - 8 L(x - h e_j) + 8 L(x + h e_j) - L(x + 2h e_j)) / (12 h),
        L = sum(out * dout),  dout ~ N(0, 1) (never all ones), drawn from
        np.random.default_rng([0x67726164, seed]) -- a stream of its own, so that inputs drawn
        from np.random.default_rng(seed) are not equal to dout; ``result.dout`` is the one used

    Why the five-point stencil at `h = 1e-3` and not central differences at `h = 1e-6`: with
    central differences the rounding error of the two forward values, `~eps * |L| / h`, alone
    gives relative errors above 1e-7 on 1-10% of random LayerNorm/softmax inputs; the
    fourth-order stencil has truncation error `O(h^4) ~ 1e-12` and 1000x less rounding, and
    stayed `<= 3e-8` over 200 seeds.

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
    terms:    names for the numbers of this case, e.g. {"batch size": 6}, used to name a
              wrong factor ("analytic = 6 x numeric (6 = batch size)"). The options of a
              reference op (``functools.partial(op, scale=0.5)``: ``1/scale``), the numbers in
              its cache and the symbolic axes of its contract (``d_k``) are found without it.

    An entry passes when `|analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|) +
    noise`, noise being the rounding error the difference quotient can carry. An entry that
    fails at `h` is refined at `h/16`; where the one-sided derivatives disagree the function has
    a kink there (ReLU at 0) and the entry is INCONCLUSIVE rather than failed.

    For a random op pass a forward that makes a fresh generator from a fixed seed on every
    call (``registry.bind`` does this): finite differences need a deterministic forward.
    """
    where = "check_gradients"
    one_of(*_MODES)(mode, "mode", where)
    h = positive(h, "h", where)
    rtol = real(rtol, "rtol", where, low=0.0)
    atol = real(atol, "atol", where, low=0.0)
    n_directions = _count(n_directions, "n_directions", where)
    n_coordinates = _count(n_coordinates, "n_coordinates", where)
    seed = _count(seed, "seed", where)
    if mode == "directional" and n_directions + n_coordinates == 0:
        raise ValueError(f"{where}: n_directions and n_coordinates are both 0; directional mode "
                         "needs at least one direction")
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, (tuple, list)):
        raise TypeError(f"{where}: inputs is {describe(inputs)}; expected a tuple of the positional "
                        "inputs of forward, e.g. (x,) for a single input")
    n_inputs = len(inputs)
    if n_inputs == 0:
        raise ValueError(f"{where}: inputs is empty; expected at least one positional input")
    names = _input_names(names, n_inputs, where)
    if terms is not None and not isinstance(terms, dict):
        raise TypeError(f"{where}: terms is {describe(terms)}; expected a dict of name -> number, "
                        "e.g. {'batch size': 6}")
    reproduce = reproduce_line(seed, h, mode, rtol, atol, n_directions, n_coordinates)

    report = _Report(names)
    work = [work_copy(x) for x in inputs]                    # the caller's arrays are never touched
    is_float = [isinstance(w, np.ndarray) and w.dtype == np.float64 for w in work]

    # 1. forward: output and cache; inputs unchanged, deterministic, no NaN
    out, cache, work, deterministic, blocked = check_forward(forward, work, names, report, where)

    # 2. the upstream gradient, from its own random stream (and a second one for linearity)
    rng = np.random.default_rng([_DOUT_STREAM, seed])
    dout = np.asarray(rng.standard_normal(out.shape))
    dout2 = np.asarray(rng.standard_normal(out.shape))
    if blocked.any():
        dout, dout2 = np.where(blocked, 0.0, dout), np.where(blocked, 0.0, dout2)
    report.dout = dout.copy()

    # 3. backward: the first call, watched for side effects; one gradient per input
    raw, cache_pristine, work = check_backward_call(backward, dout.copy(), cache, work, names,
                                                    report)
    grads, count_msg = unpack(raw, n_inputs)
    report.add("one gradient per input", count_msg is None, count_msg or "")
    if grads is None:
        for p in range(n_inputs):
            if is_float[p]:
                report.row(p, work[p].shape, "FAIL")
                report.diagnose(p, count_msg)
            else:
                report.row(p, shape_of(work[p]), "NOT FLOAT")
        return report.result(seed, h, mode, reproduce, rtol, atol)

    # 4. which gradients can be compared: float inputs, right shape (and dtype)
    analytic, grad_dtypes, wrong_dtype = usable_gradients(work, grads, is_float, names, report)

    # 5. backward is a linear map of dout, and deterministic
    if analytic:
        check_linearity(backward, cache_pristine, dout, dout2, analytic, grad_dtypes, n_inputs,
                        report)

    # 6. finite differences, input by input; a failing input is diagnosed with the whole case
    weight = float(np.sum(np.abs(np.where(blocked, 0.0, out) * dout)))
    # which registered op the forward computes (for the catalogue of known wrong backwards),
    # and the case's names for factors (d_k, 1/scale): made when a diagnosis first asks (a
    # failing gradient), once for all inputs
    recognised = once(lambda: recognise.recognise_all(forward, work, out))
    case_terms = once(lambda: learn_terms(forward, work, names, cache, terms, recognised))
    for p, x in enumerate(work):
        if not is_float[p]:
            report.row(p, shape_of(x), "NOT FLOAT")
        elif grads[p] is None:
            report.row(p, x.shape, "NO GRADIENT")
        elif p not in analytic:
            report.row(p, x.shape, "FAIL")
        elif not deterministic:
            report.row(p, x.shape, "INCONCLUSIVE")
        else:
            cmp = compare_input(forward, work, p, analytic[p], out, blocked, dout, weight, h, rtol,
                                atol, mode, n_directions, n_coordinates, rng)
            case = Case(forward, work, p, out, dout, names, case_terms, recognised)
            _record_comparison(report, p, cmp, analytic[p], dout, p in wrong_dtype, atol, case)
    return report.result(seed, h, mode, reproduce, rtol, atol)


# ---------------------------------------------------------------------------------------
# Its result
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
        return format_result(self)


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


def _record_comparison(report, p, cmp, grad, dout, forced_fail, atol, case=None):
    """One input's row of the report from its compared values: the verdict, the largest
    errors, the worst entries and, when it fails, the diagnoses."""
    a, n, status = cmp["a"], cmp["n"], cmp["status"]
    conclusive = status != INCONCLUSIVE
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
    if forced_fail or (status == FAIL).any():
        verdict = "FAIL"
    elif (status == INCONCLUSIVE).any():
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
    failing = np.flatnonzero(status == FAIL)
    if failing.size:
        order = failing[np.argsort(-np.nan_to_num(abs_err[failing], nan=np.inf), kind="stable")][:5]
        report.worst[p] = [dict(index=cmp["labels"][k], analytic=float(a[k]) + 0.0, numeric=float(n[k]) + 0.0,
                                abs_error=float(abs_err[k]), rel_error=rel_error(a[k], n[k]))
                           for k in order]
        linear = not any(getattr(s, "kind", "") == "linearity" for s in report.diagnoses.get(p, []))
        for sentence in diagnose(cmp, grad, dout, atol, case, case_wide=linear):
            report.diagnose(p, sentence)
        for e in cmp["notes"]:
            if e.get("failed"):
                report.diagnose(p, kink_sentence(e))
        if not report.diagnoses.get(p):
            report.diagnose(p, NO_PATTERN)


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
