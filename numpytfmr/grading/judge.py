"""The judge: how a returned value is compared with the expected one, and what a verdict says.

The grader (numpytfmr/grading/grader.py, through compare.py and cases.py) and the students'
self-check ``check.py`` (selfcheck.py) both judge with this module, so that their verdicts
agree by construction: the tolerances, the kinds of returned values and their descriptions,
the value comparison and its feedback, the near misses a wrong forward output is recognised
by (a scale, a numeric option with another value), random ops judged against the student's
own draw (dropout and LoRA masks, their statistics, the near misses of their scale), the
own-forward credit, and the numbers these rules use.

``numpytfmr make-assignment`` copies this file, unchanged, beside ``check.py`` in the student
folder: it imports only the standard library and NumPy, never numpytfmr.
"""
from dataclasses import dataclass, field
import math

import numpy as np

# (rtol, atol): an entry is right when |got - expected| <= atol * max(1, max|expected|) + rtol * |expected|
TOLERANCES = {"float64": (1e-6, 1e-9), "float32": (2e-3, 1e-5)}
DRAW_ALPHA = 1e-6          # a fair mask fails the statistics test with at most this probability
RNG_DRAWS = 6              # more draws of a random case's mask, from other generators
FD_STEP = 1e-3             # finite-difference step of the own-forward check (five-point stencil)
FULL_CHECK_ENTRIES = 1000  # float input entries above which the own-forward check goes by directions
SLIP_DEDUCTION = 0.1       # the part of a test's points a contract slip costs, by default
NOT_COUNTED = ("not run", "not defined", "submission not loaded")   # forward verdicts not counted


# --- what came back ---------------------------------------------------------------------------

class Returned:
    """A value a submission returned, as the judge classes it.

    kind: "array" | "scalar" (NumPy scalar) | "pyscalar" (Python number) | "none" |
          "tuple" | "list" (``items``) | "refused" (``why``)
    array: the value as an ndarray for the three number kinds.
    """

    def __init__(self, kind, array=None, items=None, type_name=None, why=None):
        self.kind, self.array, self.items = kind, array, items
        self.type_name, self.why = type_name, why

    @property
    def is_number(self):
        return self.kind in ("array", "scalar", "pyscalar")

    def describe(self):
        if self.kind == "array":
            return f"an array of shape {self.array.shape} and dtype {self.array.dtype}"
        if self.kind == "scalar":
            return f"a NumPy scalar ({self.type_name})"
        if self.kind == "pyscalar":
            return f"a Python {self.type_name}"
        if self.kind == "none":
            return "None"
        if self.kind in ("tuple", "list"):
            return f"a {self.kind} of {len(self.items)}"
        return f"an object of type {self.type_name}"


def type_name(v):
    """The name of ``v``'s type as feedback gives it: ``float``, ``numpy.float64``, a class of
    the submission by its own name."""
    t = type(v)
    mod = getattr(t, "__module__", "") or ""
    return t.__qualname__ if mod in ("builtins", "submission") else f"{mod}.{t.__qualname__}"


def returned(v):
    """The :class:`Returned` of a Python value (check.py calls the functions in its own process;
    the grader's submission process describes the value and channel.py rebuilds it)."""
    t, name = type(v), type_name(v)
    if v is None:
        return Returned("none")
    if t is np.ndarray:
        if v.dtype.kind not in "biuf":
            return Returned("refused", type_name=name,
                            why=f"returned an array of dtype {v.dtype}; expected a numeric array")
        return Returned("array", v)
    if isinstance(v, np.ndarray):
        return Returned("refused", type_name=name, why=f"returned an object of type {name} (a "
                        "subclass of np.ndarray); expected a plain np.ndarray")
    if isinstance(v, np.generic) and t.__module__ == "numpy" and np.dtype(t).kind in "biuf":
        return Returned("scalar", np.asarray(v), type_name=name)
    if t in (float, int, bool):
        return Returned("pyscalar", np.asarray(v), type_name=name)
    if t in (tuple, list):
        return Returned(t.__name__, items=[returned(x) for x in v], type_name=name)
    return Returned("refused", type_name=name,
                    why=f"returned an object of type {name}; expected np.ndarray")


def gradient_items(value, names, bwd):
    """(items, slips, short, lines): a backward's answer (:class:`Returned`) as one gradient per
    input of ``names``. A bare gradient for one input; a tuple of one there is a slip. ``items``
    is None when the answer has the wrong form, said in ``short`` and ``lines``."""
    n = len(names)
    listed = ", ".join(grad_name(x) for x in names)
    if n == 1:
        if value.kind in ("tuple", "list") and len(value.items) == 1 and value.items[0].is_number:
            return value.items, [f"{bwd} returned a {value.kind} of one gradient for an op with one "
                                 "input; the gradient of a single input is returned bare, not in a "
                                 "tuple"], "", []
        if value.kind in ("tuple", "list"):
            return None, [], "not a bare gradient", [
                f"{bwd} returned a {value.kind} of {len(value.items)} for an op with one input; the "
                "gradient of a single input is returned bare, not in a tuple"]
        return [value], [], "", []
    if value.kind not in ("tuple", "list"):
        return None, [], "not a tuple of gradients", [
            f"{bwd} returned {value.describe()}; expected a tuple of {n} gradients ({listed}), None "
            "for inputs that take no gradient"]
    if len(value.items) != n:
        return None, [], "wrong number of gradients", [
            f"{bwd} returned {len(value.items)} gradients; expected {n}, one per input ({listed}), "
            "None for inputs that take no gradient"]
    return value.items, [], "", []


def grad_name(name):
    """``dx``, ``dW``; ``d_policy_chosen`` for long names."""
    return f"d_{name}" if "_" in name or len(name) > 5 else f"d{name}"


def no_gradient_reason(name, arg):
    """Why input ``name`` (passed as ``arg``) takes no gradient, in words."""
    if arg is None:
        return f"{name} was passed as None"
    if isinstance(arg, np.ndarray) and arg.dtype.kind != "f":
        return f"{name} holds integers, which take no gradient"
    return f"{name} takes no gradient (frozen)"


def changed_in_place(fn, inputs=(), cache=False, dout=False):
    """The contract slips of function ``fn`` that changed something it was given in place: the
    inputs named in ``inputs``, a backward's ``cache`` and ``dout``. A list of sentences."""
    out = [f"{fn} changed its input {name} in place; a function must not modify its inputs "
           "(copy first, e.g. x = x.copy())" for name in inputs]
    if cache:
        out.append(f"{fn} changed its cache in place; a backward must leave the cache as the "
                   "forward returned it (a second backward call would see other values)")
    if dout:
        out.append(f"{fn} changed dout in place; dout belongs to the caller -- copy it before "
                   "modifying it")
    return out


# --- one value against the expected one -------------------------------------------------------

@dataclass
class Verdict:
    ok: bool
    short: str = ""
    lines: list = field(default_factory=list)
    got: np.ndarray = None          # the value as float64 (when comparable)
    expected: np.ndarray = None
    wrong: np.ndarray = None        # boolean mask of wrong entries
    slip: str = ""                  # right values with a contract slip (a float64 result ...)


def fmt_number(v):
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return f"{float(v):.10g}"


def _index(idx):
    return "(" + ", ".join(str(int(i)) for i in idx) + ("," if len(idx) == 1 else "") + ")"


def _scale(values):
    """max(1, max |values|): the atol of a comparison is relative to it."""
    return max(1.0, float(np.max(np.abs(values))) if values.size else 1.0)


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
    """:class:`Verdict` on one returned value (a :class:`Returned`) against ``expected``.

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
    problems = []
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
            f"  first mismatch at index {_index(idx)}: got {fmt_number(got[idx])}, expected "
            f"{fmt_number(exp[idx])}"]
        lines += [f"  diagnosis: {s}" for s in diagnose_bool(got, exp)]
        return Verdict(False, f"{what}: wrong values", lines, got, exp, wrong)

    rtol, atol = TOLERANCES[tol]
    g = got.astype(np.float64)
    e = exp.astype(np.float64)
    finite = np.isfinite(e)
    scale = _scale(e[finite])
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - e)
        wrong = ~(diff <= atol * scale + rtol * np.abs(e))
        same_inf = ~finite & (g == e)                 # -inf expected and got (masked log-probs)
        wrong &= ~same_inf
        wrong |= np.isnan(g) & ~np.isnan(e)
    if not wrong.any():
        if exp.dtype == np.float32 and got.dtype == np.float64:
            # right values in float64 (an array, np.float64 or a Python float): a slip
            return Verdict(True, "", [], g, e, wrong, slip=problems[0])
        ok = dtype_ok
        return Verdict(ok, "" if ok else f"{what}: wrong dtype", problems, g, e, wrong)
    both = finite & np.isfinite(g)
    if (finite & ~np.isfinite(g)).any() or not both.any():     # NaN/inf where a finite value was expected
        max_abs = max_rel = float("nan")
    else:
        max_abs = float(np.max(diff[both]))
        # the relative error of gradcheck.rel_error: |a - b| / max(|a| + |b|, 1e-8)
        max_rel = float(np.max(diff[both] / np.maximum(np.abs(g[both]) + np.abs(e[both]), 1e-8)))
    idx = tuple(int(i) for i in np.argwhere(wrong)[0]) if e.ndim else ()
    lines = problems + [
        f"{what}: {int(wrong.sum())} of {wrong.size} entries differ (shape {exp.shape}, dtype {got.dtype})",
        f"  max abs error {max_abs:.3g}, max rel error {max_rel:.3g}",
        f"  first mismatch at index {_index(idx)}: got {fmt_number(got[idx])}, expected "
        f"{fmt_number(exp[idx])}"]
    return Verdict(False, f"{what}: wrong values", lines, g, e, wrong)


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
    return bool(np.all(np.abs(got - c) <= atol * _scale(c) + rtol * np.abs(c)))


# --- a wrong forward output that is recognisably the op ----------------------------------------

def scaled_output(got, expected, tol):
    """"your output is the expected output times c" when ``got`` is ``expected`` times a
    constant c != 1 (a scale, or a sign), else "". Both float64 arrays of one shape, finite."""
    ee = float(np.vdot(expected, expected))
    if ee > 0:
        c = float(np.vdot(got, expected)) / ee
        if c != 0 and abs(c - 1) > 1e-9 and close_at(got, c * expected, tol):
            return f"your output is the expected output times {c:.4g} (a scale, or a sign)"
    return ""


def option_ratio(got, expected, moved):
    """The ratio v'/v of a numeric option, taking the output as affine in it: ``moved`` is the
    output with the option doubled. None when no other value fits (the caller verifies it)."""
    d = (np.asarray(moved, dtype=np.float64) - expected).reshape(-1)
    dd = float(np.dot(d, d))
    if not np.isfinite(dd) or dd == 0.0:
        return None
    t = float(np.dot((got - expected).reshape(-1), d)) / dd
    ratio = 1.0 + t
    if abs(t) < 1e-6 or ratio == 0.0:
        return None
    return ratio


def option_sentence(key, value, ratio, named="", check=""):
    """The output of option ``key`` = ``value`` times ``ratio``, in words."""
    return (f"your output equals the expected output with {key} = {ratio * value:.4g} "
            f"instead of {value:.4g}, i.e. {key} multiplied by {ratio:.4g}{named}: the "
            f"factor {key} enters the formula with is wrong{check}")


# --- random ops: judged against the student's own draw ----------------------------------------
#
# The mask a submission draws depends on how it uses the generator (``rng.random(shape) >= p``,
# ``< 1 - p``, ``rng.binomial``, ...), all equally valid. So the mask is read off the
# submission's forward output, and the mask's statistics are judged.

def binomial_pmf(n, q):
    """P(K = k) for k = 0..n, K ~ Binomial(n, q): one pass in logs, normalised."""
    pmf = np.zeros(n + 1)
    if q >= 1.0 or q <= 0.0:
        pmf[n if q >= 1.0 else 0] = 1.0
        return pmf
    lg = [math.lgamma(i + 1) for i in range(n + 1)]
    logs = np.array([lg[n] - lg[i] - lg[n - i] for i in range(n + 1)])
    i = np.arange(n + 1)
    logs = logs + i * math.log(q) + (n - i) * math.log1p(-q)
    w = np.exp(logs - logs.max())
    return w / w.sum()


def binomial_tails(n, k, q):
    """P(K <= k) and P(K >= k) for K ~ Binomial(n, q)."""
    pmf = binomial_pmf(n, q)
    return float(pmf[:k + 1].sum()), float(pmf[k:].sum())


def fair_range(n, q, alpha=DRAW_ALPHA):
    """The kept counts a fair draw lands in except with probability ``alpha``."""
    pmf = binomial_pmf(n, q)
    low = np.cumsum(pmf)                      # P(K <= k)
    high = np.cumsum(pmf[::-1])[::-1]         # P(K >= k)
    lo = next((k for k in range(n + 1) if low[k] >= alpha / 2), 0)
    hi = next((k for k in range(n, -1, -1) if high[k] >= alpha / 2), n)
    return lo, hi


def _tolerance(dtype):
    return TOLERANCES["float32" if dtype == "float32" else "float64"]


def dropout_mask(args, kwargs, got, dtype):
    """dropout: kept where out = x/(1-p), dropped where out = 0 exactly. (mask, lines)."""
    x = np.asarray(args[0], dtype=np.float64)
    p = float(kwargs["p"])
    want = x / (1.0 - p)
    rtol, atol = _tolerance(dtype)
    dropped = got == 0
    kept = ~dropped & (np.abs(got - want) <= atol * _scale(want) + rtol * np.abs(want))
    known = x != 0
    bad = ~(kept | dropped) & known
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        lines = [f"out: {int(bad.sum())} of {bad.size} entries are neither 0 (dropped) nor "
                 f"x/(1-p) = x * {1 / (1 - p):.6g} (kept)",
                 f"  first at index {idx}: got {got[idx]:.10g}, x = {x[idx]:.10g}, expected 0 or "
                 f"{want[idx]:.10g}"]
        ratio = got[known & ~dropped] / x[known & ~dropped]
        if ratio.size and np.allclose(ratio, ratio[0], rtol=1e-6):
            lines.append(f"  diagnosis: every kept entry is x * {ratio[0]:.6g}; inverted dropout "
                         f"scales the kept entries by 1/(1-p) = {1 / (1 - p):.6g}")
        return None, lines
    return kept | ~known, []


def lora_scale(kwargs, A):
    """The LoRA branch's scale s: alpha/r, or alpha/sqrt(r) with rank_stabilized."""
    r = A.shape[1]
    return kwargs["alpha"] / (math.sqrt(r) if kwargs.get("rank_stabilized") else r)


def _every_mask(d_in):
    """Every boolean mask of ``d_in`` entries, one a row: (2^d_in, d_in)."""
    return ((np.arange(2 ** d_in)[:, None] >> np.arange(d_in)) & 1).astype(bool)


def _lora_base(args):
    """(x, A, B, X, x W + b): the inputs, the rows of x and the frozen part of the output."""
    x, W, A, B = (np.asarray(a, dtype=np.float64) for a in args[:4])
    b = args[4] if len(args) > 4 and args[4] is not None else None
    X = x.reshape(-1, x.shape[-1])
    return x, A, B, X, X @ W + (0.0 if b is None else np.asarray(b, dtype=np.float64))


def lora_mask(args, kwargs, got, dtype, s=None):
    """lora_linear: per row, the one dropout mask of the branch input that gives ``out``
    (with the branch scale ``s``; default: the right one). (mask, lines); the mask is
    "too wide" where the input has more than 14 features (2^14 masks a row)."""
    x, A, B, X, base = _lora_base(args)
    p = float(kwargs["dropout"])
    s = lora_scale(kwargs, A) if s is None else s
    if X.shape[1] > 14:
        return "too wide", []
    Y = np.asarray(got, dtype=np.float64).reshape(base.shape)
    C = (s / (1.0 - p)) * (A @ B)                                 # (d_in, d_out)
    M = _every_mask(X.shape[1])
    rtol, atol = _tolerance(dtype)
    scale = _scale(Y)
    mask = np.zeros(X.shape, dtype=bool)
    for i in range(X.shape[0]):
        cand = base[i] + (M * X[i]) @ C                           # (2^d_in, d_out)
        err = np.abs(cand - Y[i]) - rtol * np.abs(cand)
        worst = err.max(axis=1)
        best = int(np.argmin(worst))
        if worst[best] > atol * scale:
            plain = base[i] + s * (X[i] @ A) @ B
            lines = [f"out: row {i} of the flattened output is x W + b + s (drop(x) A) B for no "
                     f"dropout mask of that row's x (the closest mask is off by "
                     f"{worst[best] + rtol * np.abs(cand[best]).max():.3g})"]
            if np.allclose(Y[i], plain, rtol=rtol, atol=atol * scale):
                lines.append("  diagnosis: this row equals the output without dropout")
            return None, lines
        mask[i] = M[best]
    return mask.reshape(x.shape), []


def _named(c, names):
    """`` = name`` of the first of ``names`` ({value: name}) equal to ``c``, or ""."""
    return next((f" = {n}" for v, n in names.items() if math.isclose(c, v, rel_tol=1e-6)), "")


def dropout_near_miss(args, kwargs, got, dtype):
    """Dropout whose kept entries are all scaled by one wrong factor: the sentence, or ""."""
    x = np.asarray(args[0], dtype=np.float64)
    p = float(kwargs["p"])
    known = x != 0
    used = (got != 0) & known
    if not used.any() or used.sum() == known.sum():   # drops nothing: not dropout at all
        return ""
    ratio = got[used] / x[used]
    if not np.allclose(ratio, ratio[0], rtol=max(_tolerance(dtype)[0], 1e-6), atol=0):
        return ""
    c = float(ratio[0])
    label = _named(c, {1.0: "no scaling", 1.0 / p: "1/p", 1.0 - p: "1 - p", p: "p"})
    return (f"dropout that scales the kept entries by {c:.6g}{label} instead of 1/(1-p) = "
            f"{1 / (1 - p):.6g}")


def lora_near_miss(args, kwargs, got, dtype):
    """LoRA whose branch is scaled by a wrong constant s' (for one dropout mask): the sentence
    naming s' in the case's terms, or ""."""
    x, A, B, X, base = _lora_base(args)
    p = float(kwargs["dropout"])
    d_in = X.shape[1]
    if d_in > 14:
        return ""
    R = np.asarray(got, dtype=np.float64).reshape(base.shape) - base
    i = int(np.argmax(np.abs(R).max(axis=1)))
    if not np.any(R[i]):
        return ""
    G = (_every_mask(d_in) * X[i]) @ (A @ B) / (1.0 - p)          # the branch per mask, s' = 1
    gg = np.einsum("md,md->m", G, G)
    fit = np.where(gg > 0, G @ R[i] / np.where(gg > 0, gg, 1.0), 0.0)
    resid = np.abs(fit[:, None] * G - R[i]).max(axis=1)
    s = lora_scale(kwargs, A)
    for k in np.argsort(resid)[:8]:
        c = float(fit[k])
        if c == 0.0 or resid[k] > 1e-3 * np.abs(R[i]).max() or \
                math.isclose(c, s, rel_tol=_tolerance(dtype)[0]):
            continue
        mask, _ = lora_mask(args, kwargs, got, dtype, s=c)
        if mask is None or isinstance(mask, str):
            continue
        alpha, r = kwargs["alpha"], A.shape[1]
        label = _named(c, {alpha / d_in: f"alpha/d_in (d_in = A.shape[0] = {d_in})",
                           alpha / math.sqrt(r): "alpha/sqrt(r)", alpha / r: "alpha/r", alpha: "alpha",
                           1.0 / r: "1/r", 1.0: "1 (no scale)", alpha * r: "alpha r",
                           alpha / B.shape[1]: f"alpha/d_out (d_out = B.shape[1] = {B.shape[1]})"})
        right = "alpha/sqrt(r)" if kwargs.get("rank_stabilized") else "alpha/r"
        return (f"LoRA with its branch scaled by {c:.6g}{label} instead of s = {right} = {s:.6g} "
                f"(r = A.shape[1] = {r})")
    return ""


# op -> (reader of the mask, name of the drop probability, near miss of a wrong scale)
DRAWS = {"dropout": (dropout_mask, "p", dropout_near_miss),
         "lora_linear": (lora_mask, "dropout", lora_near_miss)}


def drop_probability(op, kwargs):
    """The drop probability p of a case of ``op`` with options ``kwargs`` when the case draws a
    mask (a random op, p > 0, ``train`` not False, an ``rng`` given); None otherwise."""
    if op not in DRAWS:
        return None
    p = float(kwargs.get(DRAWS[op][1], 0.0) or 0.0)
    if p == 0.0 or not kwargs.get("train", True) or "rng" not in kwargs:
        return None
    return p


def redraw_seeds(op, args, kwargs):
    """The seeds of the more draws of a case's mask, from other generators: RNG_DRAWS of them
    for the larger cases (at least 200 nonzero inputs, an integer seed), else none."""
    seed = kwargs.get("rng")
    if drop_probability(op, kwargs) is None or not isinstance(seed, int) or \
            np.count_nonzero(np.asarray(args[0])) < 200:
        return []
    return [seed + 7919 * j for j in range(1, RNG_DRAWS + 1)]


def read_draw(op, args, kwargs, got, dtype):
    """(mask, lines, near_miss) of a random op's forward output ``got`` (float64, the output's
    shape, finite): the mask read off it, or None with what is wrong in ``lines`` and the near
    miss that gives it ("" when none); the mask is "too wide" when it cannot be read."""
    reader, _, near_miss = DRAWS[op]
    mask, lines = reader(args, kwargs, got, dtype)
    if mask is not None:
        return mask, lines, ""
    try:
        near = near_miss(args, kwargs, got, dtype)
    except Exception:  # noqa: BLE001 -- looking for a near miss never fails the judging
        near = ""
    if near and not any(line.startswith("  diagnosis:") for line in lines):
        lines = lines + [f"  diagnosis: your output is {near}"]
    return None, lines, near


def mask_statistics(mask, x, p):
    """(ok, lines): the kept fraction of ``mask`` where the input ``x`` is nonzero, tested
    against Bernoulli(1 - p) with an exact binomial test at level DRAW_ALPHA."""
    known = np.asarray(x) != 0
    n, k, q = int(known.sum()), int((mask & known).sum()), 1.0 - p
    low, high = binomial_tails(n, k, q)
    if min(low, high) >= DRAW_ALPHA / 2:
        return True, []
    lo, hi = fair_range(n, q)
    lines = [f"mask: your forward keeps {k} of {n} entries ({k / max(n, 1):.3f}); each entry must "
             f"be kept with probability 1 - p = {q:g}, and a fair draw keeps between {lo} and {hi} "
             f"of {n} (all but {DRAW_ALPHA:g} of the time)"]
    if abs(k / max(n, 1) - p) < abs(k / max(n, 1) - q):
        lines.append("  diagnosis: the fraction kept is close to p: is the mask the dropped "
                     "entries instead of the kept ones (keep = rng.random(shape) < 1 - p)?")
    return False, lines


def rng_dependence(masks, x, p):
    """Whether the masks of one case drawn from ``1 + RNG_DRAWS`` different generators look like
    independent Bernoulli(1 - p) draws: not all the same, and few positions kept (or dropped) in
    every draw -- a fair draw does that at a fraction q = p^n + (1-p)^n of the positions, a mask
    that ignores ``rng`` at all of them. ``x``: the input (its zeros tell nothing). (ok, lines)."""
    known = np.asarray(x) != 0
    stack = np.stack([np.asarray(m) for m in masks])[:, known]
    n_draws, n = stack.shape
    always = int(np.sum(stack.all(axis=0) | (~stack).all(axis=0)))
    q = p ** n_draws + (1 - p) ** n_draws
    _, hi = fair_range(n, q)
    if always <= hi:
        return True, []
    same = all(np.array_equal(stack[0], m) for m in stack[1:])
    return False, [
        f"mask: over {n_draws} calls with different generators (rng), {always} of {n} entries were "
        f"kept in every call or dropped in every call; independent draws do that to at most {hi} "
        "(all but 1e-6 of the time)" + (": the mask was the same every time" if same else ""),
        "  diagnosis: draw the mask from the rng argument (keep = rng.random(x.shape) < 1 - p), "
        "not from a fixed seed, np.random's global state or the input's values"]


# --- the own-forward credit ---------------------------------------------------------------------

def nontrivial(items, grads):
    """Whether a backward's gradients (:class:`Returned`) are nonzero wherever the correct
    gradient is: a forward and a backward that both ignore an input are consistent, and earn
    nothing for it."""
    for got, exp in zip(items, grads):
        if exp is not None and np.any(np.asarray(exp) != 0):
            if not got.is_number or not np.any(got.array != 0):
                return False
    return True


def own_forward_head(fwd, bwd, dtype="float64"):
    """The first words of the own-forward check's feedback."""
    return (f"check of {bwd} against finite differences of your own {fwd}"
            + (" (on the case's inputs in float64)" if dtype == "float32" else ""))


def own_forward_lines(fwd, bwd, consistent, fwd_passed, report=(), dtype="float64"):
    """The feedback of the own-forward check: a backward that failed against the expected
    gradients, checked against finite differences of the student's own forward (``report``:
    the lines that say where they differ)."""
    head = own_forward_head(fwd, bwd, dtype)
    if consistent and fwd_passed:
        return [f"{head}: PASSED -- your backward matches your forward here, though not the "
                "reference gradient (see above)"]
    if consistent:
        return [f"{head}: PASSED -- your backward is consistent with your forward, so the mismatch "
                f"comes from {fwd}: fix the forward first (its test says how it differs)"]
    return [f"{head}: FAILED -- your backward does not match your forward:"] + ["  " + line for line in report]


def own_forward_credit(fwd, op, near_miss, passed, graded):
    """Why a backward that is the gradient of the student's own forward ``fwd`` of ``op``
    (wrong on this case) keeps its points, in words; None when it does not.

    The credit is for a forward that is recognisably the op: on this case a near miss the
    grader can name (``near_miss``: a scale, a rank, a keep probability, an option, a known
    slip), or a forward that matches the reference on most of the cases counted (``passed``
    of ``graded``). Never for a forward unrelated to the op, whose exact gradient any backward
    can be (``out = x + sum(others)``, ``dx = dout``).
    """
    if near_miss:
        return f"your {fwd} is {op} with one mistake the grader names: {near_miss}"
    if graded and 2 * passed > graded:
        return f"your {fwd} matches the reference on {passed} of {graded} cases (most of them)"
    return None


def settle_claim(fwd, bwd, op, why, is_nontrivial, passed, graded):
    """(credited, sentence) for a backward consistent with its own wrong forward: the credit
    line ("credited: ...") when ``why`` (:func:`own_forward_credit`) holds and the gradients
    are nontrivial, else the line that says why not ("not credited: ...")."""
    if why is not None and is_nontrivial:
        return True, (f"{bwd} is the gradient of your own {fwd} (checked by finite differences), "
                      f"and {why}: so it keeps its points; {fwd}'s own test costs the mistake")
    reason = ("it is nonzero only where the correct gradient is zero: a forward and a "
              "backward that both ignore an input earn nothing for it"
              if why is not None else
              f"your {fwd} is not recognisably {op} on this case: no near miss "
              f"the grader can name (a scale, a factor, an option, a known slip) gives its "
              f"output, and it matches the reference on {passed} of {graded} cases")
    return False, (f"not credited: {bwd} agrees with your own {fwd}, but {reason}; so it is graded "
                   "against the correct gradient")
