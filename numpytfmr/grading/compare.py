"""Comparing a submission's results with the reference, and saying how they differ.

:func:`check_value` turns one returned value into a verdict and lines of feedback: wrong
type, shape or dtype, or, for a value mismatch, the number of wrong entries, the max absolute
and relative error, the first mismatching index with the value got and expected, and a
diagnosis. Diagnoses come from three places:

- the gradient checker's own (a constant factor, a sign, a transpose, a missing term, an
  error confined to one slice), reworded for "yours" against "expected";
- variants of the reference run here: an input scaled by a factor built from the shapes
  (a missing ``1/sqrt(d_k)``), an option changed or left out (``axis``, ``mask``, ``alpha``),
  and the common mistakes of :mod:`.mistakes`;
- for a forward output, the factor named in the case's terms, as the gradient checker names
  it (``your output is the expected output times 2 (2 = alpha/r, ...)``), and the value a
  numeric option would need for the reference to give your output (``alpha x 3/7 =
  r/d_in``: a LoRA scale built with the input size where the rank belongs);
- NaN/inf where the expected output is finite (overflow), and, for boolean results, an
  inverted or off-by-one mask.
"""
import math

import numpy as np

from .judge import (TOLERANCES, Verdict, check_value, close_at, describe_shape_problem,
                    diagnose_bool, option_ratio, option_sentence)

__all__ = ["TOLERANCES", "Verdict", "check_value", "describe_shape_problem", "nonfinite_sentence",
           "diagnose_values", "forward_diagnoses", "matching_variants", "scaling_variants",
           "option_variants", "close_at", "diagnose_bool", "numeric_options"]


# --- diagnoses --------------------------------------------------------------------------------

def nonfinite_sentence(got, expected, inputs=()):
    """NaN/inf where the expected value is finite, with an overflow hint for large inputs."""
    bad = ~np.isfinite(got) & np.isfinite(expected)
    if not bad.any():
        return None
    big = 0.0
    for a in inputs:
        if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size:
            fin = a[np.isfinite(a)]
            if fin.size:
                big = max(big, float(np.max(np.abs(fin))))
    sentence = f"{int(bad.sum())} entries are NaN or inf where the expected value is finite"
    if big >= 100:
        sentence += (f"; the inputs reach |x| = {big:.3g}, and exp() overflows for arguments above "
                     "~709 (1e4 certainly): subtract the maximum along the axis before exp (and "
                     "compute log-sum-exp the same way)")
    else:
        sentence += " (a division by zero, a log of 0, or an exp that overflows?)"
    return sentence


_REWORD = (("the analytic gradient", "your result"), ("the numeric one", "the expected one"),
           ("the numeric gradient", "the expected result"), ("analytic", "yours"),
           ("numeric", "expected"))


# For a forward output the checker's gradient wording is recast.
_REWORD_OUTPUT = (("this gradient is never computed or never added in (a missing term, or a "
                   "forgotten +=)", "this result is never computed or never filled in"),
                  ("where the output does not depend on this input (expected 0): an extra term, "
                   "or a mask not applied in backward", "where the expected value is 0: a mask "
                   "not applied, or an extra term"),
                  ("a term of the gradient is missing there", "a term is missing there"),
                  ("the gradient is built transposed (for y = x @ W the weight gradient is x^T @ "
                   "dout, of W's shape (d_in, d_out))", "the result is built transposed"),
                  ("part of the gradient only", "part of the result only"))


def _reword(sentence, output=False):
    for a, b in _REWORD:
        sentence = sentence.replace(a, b)
    if output:
        for a, b in _REWORD_OUTPUT:
            sentence = sentence.replace(a, b)
    return sentence


def diagnose_values(got, expected, dout=None, *, forward=None, inputs=None, position=None,
                    names=None, out=None, terms=None):
    """The gradient checker's diagnoses of ``got`` against ``expected`` (float arrays).

    dout: the upstream gradient, for a gradient (finds a missing or extra ``dout`` term);
    None for a forward output.

    For a gradient, passing the case as well -- ``forward`` (the reference forward with the
    case's options bound), its positional ``inputs``, the ``position`` of the input this is
    the gradient of, the input ``names`` and the forward's output ``out`` -- adds the
    checker's case-wide diagnoses (a missing normalisation term, a reduction over the wrong
    axis, a wrong elementwise derivative, a transposed factor, repeated ids, a mask, a
    rotation, factors named in the case's terms); for a forward output, ``terms`` (a
    ``checking.terms.Terms``) names a constant factor. Without it only the patterns of the two
    arrays are looked for; the self-check against finite differences of the submission's own
    forward (``check_gradients``) reports the case-wide ones in any case.
    """
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape or not got.size:
        return []
    if not (np.isfinite(got).all() and np.isfinite(expected).all()):
        return []
    rtol, atol = TOLERANCES["float64"]
    scale = max(1.0, float(np.max(np.abs(expected))))
    a, n = got.reshape(-1), expected.reshape(-1)
    try:
        from ..checking.compare import FAIL, PASS
        from ..checking.diagnose import diagnose
        status = np.where(np.abs(a - n) <= atol * scale + rtol * np.abs(n), PASS, FAIL)
        cmp = dict(a=a, n=n, tol=None, status=status, labels=None, notes=[], rounding=np.zeros(a.size),
                   project=lambda T: np.asarray(T, dtype=np.float64).reshape(-1), full=True)
        d = np.zeros(expected.shape) if dout is None else np.asarray(dout, dtype=np.float64)
        case = _case(forward, inputs, position, names, out, d) if dout is not None else None
        sentences = diagnose(cmp, got, d, atol * scale, case, terms=terms)
    except (ImportError, AttributeError, TypeError, KeyError, ValueError):
        sentences = _simple_diagnose(a, n)
    return [_reword(s, output=dout is None) for s in sentences]


def forward_diagnoses(got, expected, forward, args, kwargs, names):
    """Diagnoses of a forward output ``got`` against the reference's ``expected``: the
    checker's (a constant factor named in the case's terms, a sign, a transpose, one slice)
    and :func:`solved_options`. ``forward`` is the reference op (None: the patterns alone)."""
    if forward is None:
        return diagnose_values(got, expected)
    from ..checking.structure import work_copy
    from ..checking.terms import learn_terms
    from ..registry import bind
    bound = bind(forward, kwargs)
    try:
        terms = learn_terms(bound, [work_copy(a) for a in args], list(names))
    except Exception:  # noqa: BLE001 -- no names: the factor is still reported, unnamed
        terms = None
    sentences = [s.replace("yours = ", "your output = ").replace(" x expected", " x the expected output")
                 for s in diagnose_values(got, expected, terms=terms)]
    return sentences + solved_options(got, expected, forward, args, kwargs, terms)


def numeric_options(kwargs):
    """``[(name, value)]``: the options of a case a wrong output can be solved for (each nonzero
    number but ``rng`` and ``axis``); the self-check's data holds the same ones, moved."""
    return [(k, v) for k, v in kwargs.items()
            if k not in ("rng", "axis") and not isinstance(v, (bool, np.bool_))
            and isinstance(v, (int, float, np.integer, np.floating)) and v != 0]


def solved_options(got, expected, forward, args, kwargs, terms=None, tol="float64"):
    """For each numeric option v of the case: the value v' with forward(option=v') = got,
    when there is one (the output is taken as affine in the option, and v' is verified),
    as a sentence naming v'/v in the case's terms: ``alpha`` used where ``alpha/r``
    belongs, a temperature applied twice."""
    from ..registry import bind
    got = np.asarray(got, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    out = []
    for key, value in numeric_options(kwargs):
        try:
            with np.errstate(all="ignore"):
                moved = bind(forward, dict(kwargs, **{key: 2.0 * value}))(*args)[0]
                ratio = option_ratio(got, e, moved)
                if ratio is None:
                    continue
                solved = np.asarray(bind(forward, dict(kwargs, **{key: ratio * value}))(*args)[0],
                                    dtype=np.float64)
        except Exception:  # noqa: BLE001 -- an option value the reference refuses: no match
            continue
        if not close_at(got, solved, tol):
            continue
        label = terms.name_factor(ratio) if terms is not None else ""
        named = f" ({abs(ratio):.4g} = {label})" if label and ratio > 0 else ""
        check = ""
        if label:
            expr = label.split(",")[0].split(" = ")[0]
            top, _, bottom = expr.partition("/")
            if bottom and top.isidentifier() and bottom.isidentifier():
                check = (f" -- a {bottom} where {top} belongs? (e.g. {key}/{bottom} in place of "
                         f"{key}/{top})")
            else:
                check = f" -- check how {expr} enters the expression of {key}"
        out.append(option_sentence(key, value, ratio, named, check))
    return out


def _case(forward, inputs, position, names, out, dout):
    """The checker's view of a graded case (None when it is not given in full)."""
    if forward is None or inputs is None or position is None or out is None:
        return None
    from ..checking.evidence import Case
    from ..checking.structure import work_copy
    from ..checking.terms import learn_terms
    work = [work_copy(x) for x in inputs]
    names = list(names) if names is not None else [f"input {i}" for i in range(len(work))]
    out = np.array(out, dtype=np.float64)
    return Case(forward, work, position, out, dout, names, learn_terms(forward, work, names))


def _simple_diagnose(a, n):
    """A constant factor or sign, when the gradient checker's diagnoses are unavailable."""
    nn = float(np.dot(n, n))
    if nn == 0 or not np.any(a):
        return []
    c = float(np.dot(a, n)) / nn
    if abs(c - 1) > 1e-4 and np.max(np.abs(a - c * n)) <= 1e-5 * max(np.max(np.abs(n)), 1e-300):
        return [f"analytic = {c:.4g} x numeric: a constant factor (or a sign) is wrong"]
    return []


def matching_variants(got, variants, *, limit=2, tol="float64"):
    """Sentences of the variants ``(sentence, thunk)`` whose output equals ``got``."""
    found = []
    for sentence, thunk in variants:
        try:
            with np.errstate(all="ignore"):
                candidate = thunk()
        except Exception:  # noqa: BLE001 -- a variant the reference refuses is simply not a match
            continue
        if close_at(got, candidate, tol):
            found.append(sentence)
            if len(found) >= limit:
                break
    return found


def _factors(args, names):
    """Candidate factors (value, label, note) from the sizes in the input shapes."""
    dims = {}
    for a, name in zip(args, names):
        if isinstance(a, np.ndarray):
            for ax, d in enumerate(a.shape):
                if d > 1:
                    dims.setdefault(d, []).append(f"{name}.shape[{ax - a.ndim}]")
    out = [(-1.0, "-1", "")]
    for d, where in dims.items():
        note = f" ({d} = {' = '.join(where[:3])})"
        out += [(float(d), f"{d}", note), (1.0 / d, f"1/{d}", note),
                (math.sqrt(d), f"sqrt({d})", note), (1.0 / math.sqrt(d), f"1/sqrt({d})", note)]
    if 2 not in dims:
        out += [(2.0, "2", ""), (0.5, "1/2", "")]
    return out


def scaling_variants(forward, args, kwargs, names):
    """The reference with one float input multiplied by a factor built from the shapes."""
    out = []
    factors = _factors(args, names)
    for p, (a, name) in enumerate(zip(args, names)):
        if not (isinstance(a, np.ndarray) and a.dtype.kind == "f"):
            continue
        for value, label, note in factors:
            def thunk(p=p, value=value):
                scaled = list(args)
                scaled[p] = args[p] * value
                return forward(*scaled, **kwargs)[0]
            shown = label if label == f"{value:g}" else f"{label} = {value:.4g}"
            what = "negated" if value == -1.0 else f"multiplied by {shown}{note}"
            out.append((f"a constant factor: your output equals the expected output with {name} "
                        f"{what} -- a scale factor (or a sign) is missing or extra", thunk))
    return out


def option_variants(forward, args, kwargs, seen_options=None, ndim=None):
    """The reference with one option changed: left out, scaled, flipped, or another choice."""
    out = []
    seen_options = seen_options or {}
    factors = _factors(args, [f"input {i}" for i in range(len(args))])
    for key, value in kwargs.items():
        if key == "rng":
            continue
        rest = {k: v for k, v in kwargs.items() if k != key}

        def left_out(rest=rest):
            return forward(*args, **rest)[0]
        out.append((f"your output equals the expected output without the option {key}= -- "
                    f"{key} seems to be ignored", left_out))
        if isinstance(value, (bool, np.bool_)):
            def flipped(key=key, value=value):
                return forward(*args, **dict(kwargs, **{key: not value}))[0]
            out.append((f"your output equals the expected output with {key}={not value} "
                        f"(this case passes {key}={value})", flipped))
        elif key == "axis" and isinstance(value, (int, np.integer)) and ndim:
            for other in range(-ndim, 0):
                if other % ndim == value % ndim:
                    continue
                def moved(other=other):
                    return forward(*args, **dict(kwargs, axis=other))[0]
                out.append((f"your output equals the expected output along axis={other}; this case "
                            f"passes axis={value} -- the axis option is not used as given", moved))
        elif isinstance(value, (int, float, np.integer, np.floating)) and value != 0:
            for c, label, note in factors:
                def scaled(key=key, c=c):
                    return forward(*args, **dict(kwargs, **{key: value * c}))[0]
                out.append((f"your output equals the expected output with {key} multiplied by "
                            f"{label}{note} -- the option {key} is scaled wrongly", scaled))
        elif isinstance(value, str):
            for other in sorted(seen_options.get(key, ())):
                if other == value:
                    continue
                def chosen(key=key, other=other):
                    return forward(*args, **dict(kwargs, **{key: other}))[0]
                out.append((f"your output equals the expected output with {key}={other!r}; this "
                            f"case passes {key}={value!r}", chosen))
    return out
