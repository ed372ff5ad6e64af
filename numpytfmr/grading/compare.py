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
from dataclasses import dataclass, field
import math

import numpy as np

from ..gradcheck import rel_error

__all__ = ["TOLERANCES", "Verdict", "check_value", "describe_shape_problem", "nonfinite_sentence",
           "diagnose_values", "forward_diagnoses", "matching_variants", "scaling_variants",
           "option_variants", "close_at"]

# (rtol, atol): an entry is right when |got - expected| <= atol * max(1, max|expected|) + rtol * |expected|
TOLERANCES = {"float64": (1e-6, 1e-9), "float32": (2e-3, 1e-5)}


@dataclass
class Verdict:
    ok: bool
    short: str = ""
    lines: list = field(default_factory=list)
    got: np.ndarray = None          # the value as float64 (when comparable)
    expected: np.ndarray = None
    wrong: np.ndarray = None        # boolean mask of wrong entries
    slip: str = ""                  # right values with a contract slip (a float64 result ...)


def _fmt(v):
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return f"{float(v):.10g}"


def _index(idx):
    return "(" + ", ".join(str(int(i)) for i in idx) + ("," if len(idx) == 1 else "") + ")"


def describe_shape_problem(got_shape, exp_shape):
    """A hint on how a wrong shape came about, or ""."""
    got_shape, exp_shape = tuple(got_shape), tuple(exp_shape)
    if len(got_shape) == len(exp_shape) >= 2 and got_shape[:-2] + got_shape[-1:-3:-1] == exp_shape:
        return "the last two axes are swapped: transposed?"
    if got_shape == tuple(d for d in exp_shape if d != 1) and got_shape != exp_shape:
        return "axes of size 1 are missing (keepdims=True, or a squeeze too many?)"
    if tuple(d for d in got_shape if d != 1) == exp_shape:
        return "extra axes of size 1 (keepdims where none belongs?)"
    if len(got_shape) > len(exp_shape) and got_shape[len(got_shape) - len(exp_shape):] == exp_shape:
        return ("leading axes too many: a gradient has its input's shape -- sum over the axes "
                "the input was broadcast along")
    if len(got_shape) < len(exp_shape) and exp_shape[len(exp_shape) - len(got_shape):] == got_shape:
        return "leading (batch) axes are missing: summed over the batch, or batch axes not supported?"
    if sorted(got_shape) == sorted(exp_shape):
        return "the same sizes in another order: axes permuted?"
    return ""


def check_value(ret, expected, what, *, tol="float64", none_reason=""):
    """Verdict on one returned value (a :class:`~.channel.Returned`) against ``expected``.

    expected: an ndarray (0-d for scalars), or None when the contract says None
    (``none_reason`` says why, e.g. "W is frozen").
    """
    if expected is None:
        if ret.kind == "none":
            return Verdict(True)
        why = f" ({none_reason})" if none_reason else ""
        return Verdict(False, f"{what}: expected None", [
            f"{what}: returned {ret.describe()}; expected None{why}"])
    exp = np.asarray(expected)
    want = f"an np.ndarray of shape {exp.shape} and dtype {exp.dtype}"
    if ret.kind == "refused":
        why = ret.why if "expected" in ret.why else f"{ret.why}; expected {want}"
        return Verdict(False, f"{what}: wrong type", [f"{what}: {why}"])
    if ret.kind == "none":
        return Verdict(False, f"{what}: returned None", [f"{what}: returned None; expected {want}"])
    if ret.kind in ("tuple", "list"):
        return Verdict(False, f"{what}: returned a {ret.kind}", [
            f"{what}: returned a {ret.kind}; expected {want} (convert with np.array, and keep "
            "results as arrays throughout)"])
    got = ret.array
    if ret.kind != "array" and exp.ndim > 0:
        return Verdict(False, f"{what}: returned a scalar", [
            f"{what}: returned {ret.describe()}; expected {want}"])
    lines, problems = [], []
    if got.shape != exp.shape:
        hint = describe_shape_problem(got.shape, exp.shape)
        return Verdict(False, f"{what}: wrong shape", [
            f"{what}: shape {got.shape}; expected {exp.shape}" + (f" -- {hint}" if hint else "")])
    dtype_ok = got.dtype == exp.dtype
    if not dtype_ok:
        if ret.kind == "pyscalar":
            problems.append(f"{what}: returned a Python {ret.type_name} (that is {got.dtype}); expected "
                            f"a value of dtype {exp.dtype} (e.g. np.asarray(value, dtype=x.dtype))")
        elif exp.dtype == np.float32 and got.dtype == np.float64:
            problems.append(f"{what}: dtype float64; expected float32 -- float32 inputs give float32 "
                            "results: look for a float64 constant or array mixed in, or a missing "
                            ".astype(x.dtype)")
        else:
            problems.append(f"{what}: dtype {got.dtype}; expected {exp.dtype}")
    if exp.dtype.kind in "biu":                        # masks and ids: compared exactly
        g, e = got.astype(np.float64), exp.astype(np.float64)
        wrong = g != e
        if not wrong.any():
            ok = dtype_ok
            return Verdict(ok, "" if ok else f"{what}: wrong dtype", problems, got, exp, wrong)
        idx = tuple(int(i) for i in np.argwhere(wrong)[0]) if exp.ndim else ()
        lines = problems + [
            f"{what}: {int(wrong.sum())} of {wrong.size} entries differ (shape {exp.shape})",
            f"  first mismatch at index {_index(idx)}: got {_fmt(got[idx])}, expected {_fmt(exp[idx])}"]
        lines += [f"  diagnosis: {s}" for s in diagnose_bool(got, exp)]
        return Verdict(False, f"{what}: wrong values", lines, got, exp, wrong)

    rtol, atol = TOLERANCES[tol]
    g = got.astype(np.float64)
    e = exp.astype(np.float64)
    finite = np.isfinite(e)
    scale = max(1.0, float(np.max(np.abs(e[finite]))) if finite.any() else 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - e)
        wrong = ~(diff <= atol * scale + rtol * np.abs(e))
        same_inf = ~finite & (g == e)                 # -inf expected and got (masked log-probs)
        wrong &= ~same_inf
        wrong |= np.isnan(g) & ~np.isnan(e)
    if not wrong.any():
        if exp.dtype == np.float32 and got.dtype == np.float64 and ret.kind in ("array", "scalar",
                                                                                "pyscalar"):
            # right values in float64 (an array, np.float64 or a Python float): a slip
            return Verdict(True, "", [], g, e, wrong, slip=problems[0])
        ok = dtype_ok
        return Verdict(ok, "" if ok else f"{what}: wrong dtype", problems, g, e, wrong)
    both = finite & np.isfinite(g)
    if (finite & ~np.isfinite(g)).any():      # NaN/inf where a finite value was expected
        max_abs = max_rel = float("nan")
    else:
        max_abs = float(np.max(diff[both])) if both.any() else float("nan")
        max_rel = rel_error(g[both], e[both]) if both.any() else float("nan")
    idx = tuple(int(i) for i in np.argwhere(wrong)[0]) if e.ndim else ()
    lines = problems + [
        f"{what}: {int(wrong.sum())} of {wrong.size} entries differ (shape {exp.shape}, dtype {got.dtype})",
        f"  max abs error {max_abs:.3g}, max rel error {max_rel:.3g}",
        f"  first mismatch at index {_index(idx)}: got {_fmt(got[idx])}, expected {_fmt(exp[idx])}"]
    return Verdict(False, f"{what}: wrong values", lines, g, e, wrong)


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


def solved_options(got, expected, forward, args, kwargs, terms=None, tol="float64"):
    """For each numeric option v of the case: the value v' with forward(option=v') = got,
    when there is one (the output is taken as affine in the option, and v' is verified),
    as a sentence naming v'/v in the case's terms: ``alpha`` used where ``alpha/r``
    belongs, a temperature applied twice."""
    from ..registry import bind
    got = np.asarray(got, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    out = []
    for key, value in kwargs.items():
        if key in ("rng", "axis") or isinstance(value, (bool, np.bool_)) or \
                not isinstance(value, (int, float, np.integer, np.floating)) or value == 0:
            continue
        try:
            with np.errstate(all="ignore"):
                moved = np.asarray(bind(forward, dict(kwargs, **{key: 2.0 * value}))(*args)[0],
                                   dtype=np.float64)
                d = (moved - e).reshape(-1)
                dd = float(np.dot(d, d))
                if not np.isfinite(dd) or dd == 0.0:
                    continue
                t = float(np.dot((got - e).reshape(-1), d)) / dd
                ratio = 1.0 + t
                if abs(t) < 1e-6 or ratio == 0.0:
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
        out.append(f"your output equals the expected output with {key} = {ratio * value:.4g} "
                   f"instead of {value:.4g}, i.e. {key} multiplied by {ratio:.4g}{named}: the "
                   f"factor {key} enters the formula with is wrong{check}")
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


def diagnose_bool(got, expected):
    """Inverted or off-by-one boolean (or integer) results."""
    out = []
    g, e = np.asarray(got), np.asarray(expected)
    if g.shape != e.shape or not g.size:
        return out
    if e.dtype == bool and np.array_equal(g.astype(bool), ~e):
        out.append("your result is the logical NOT of the expected one (True must mean 'may "
                   "attend'; a blocked position is False)")
        return out
    for axis, name in ((-1, "last"), (-2, "second-to-last")):
        if g.ndim < -axis or g.shape[axis] < 2:
            continue
        gm, em = np.moveaxis(g, axis, -1), np.moveaxis(e, axis, -1)
        if np.array_equal(gm[..., :-1], em[..., 1:]):
            out.append(f"off by one: your result is the expected one shifted by one position "
                       f"along the {name} axis (index i holds the expected value of i + 1) -- "
                       "check < against <=, or a diagonal offset (k=) one too small")
        elif np.array_equal(gm[..., 1:], em[..., :-1]):
            out.append(f"off by one: your result is the expected one shifted by one position "
                       f"along the {name} axis (index i holds the expected value of i - 1) -- "
                       "check < against <=, or a diagonal offset (k=) one too large")
    return out


def close_at(got, candidate, tol="float64"):
    """Whether ``got`` equals ``candidate`` at the case's tolerance (same shape, finite)."""
    try:
        c = np.asarray(candidate, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if c.shape != got.shape or not np.isfinite(c).all() or not np.isfinite(got).all():
        return False
    rtol, atol = TOLERANCES[tol]
    scale = max(1.0, float(np.max(np.abs(c))) if c.size else 1.0)
    return bool(np.all(np.abs(got - c) <= atol * scale + rtol * np.abs(c)))


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
