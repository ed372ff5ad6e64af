"""Which registered op does a forward compute? Recognised by what it computes.

A forward written independently of the package (a student's own softmax in plain NumPy)
is no reference op, so the catalogue (``catalogue.py``) cannot be read off its name: every
registered op that fits is run on the case's inputs with its declared options, a tunable
option solved for, and an op reproducing the output up to rounding (``_REL``) is what the
forward computes, or one it is close to (a constant times its output, an input left out).
Steps: docs/gradcheck.md, "Your own forward: which op it computes". :func:`recognise` is
the entry point for other tools (the grader).
"""
import math

import numpy as np

from .terms import find_op

__all__ = ["Recognition", "recognise", "recognise_all"]

_REL = 1e-9          # equal up to rounding: max |y - out| <= _REL * max |out| (float64 forwards)
_GRID = 25           # points of the log-scale search of a tunable option
_GOLDEN = 44         # golden-section steps that refine it
_NEAR = 0.5          # solve only for an op whose output is this near (relative)


class Recognition:
    """What a forward computes: the registered op ``op`` called with ``options`` on ``args``
    (None for an absent or left-out input), times ``factor``. ``close``: it differs from the
    op (``factor != 1`` or ``left_out``); ``solved``: options solved for; ``reference``: the
    forward is a reference op or a thin wrapper around one."""

    def __init__(self, op, options, args, *, factor=1.0, left_out=(), solved=(), reference=False):
        self.op, self.options, self.args = op, dict(options), tuple(args)
        self.factor, self.left_out, self.solved = float(factor), tuple(left_out), tuple(solved)
        self.reference = reference

    @property
    def close(self):
        return self.factor != 1.0 or bool(self.left_out)

    @property
    def exact(self):
        return not self.close

    def spec(self):
        from ..registry import get
        return get(self.op)

    def run(self):
        """``(out, cache)`` of the op as recognised (the output times ``factor``)."""
        from ..registry import bind
        with np.errstate(all="ignore"):
            out, cache = bind(self.spec().forward, self.options)(*self.args)
        return np.asarray(out, dtype=np.float64) * self.factor, cache

    def describe(self):
        """``layernorm (eps=1e-05)``, ``attention (mask=causal)``, ``softmax (axis=-1)``."""
        shown = []
        for key, value in self.options.items():
            if key in ("rng", "positions", "freqs") or value is None:
                continue
            if isinstance(value, np.ndarray):
                value = "causal" if _is_causal(value) else "given"
            elif isinstance(value, float):
                value = f"{value:.4g}"
            else:
                value = repr(value) if isinstance(value, str) else str(value)
            shown.append(f"{key}={value}")
        return f"{self.op} ({', '.join(shown)})" if shown else self.op

    def difference(self):
        """How a close forward differs from the op, one sentence; "" when it does not."""
        if self.factor != 1.0:
            return (f"your forward's output is {self.factor:.4g} x what {self.describe()} computes: "
                    "a scale factor is missing or applied twice in the forward itself")
        if self.left_out:
            names = " and ".join(self.left_out)
            return (f"your forward computes {self.describe()} with {names} left out (as if {names} "
                    f"were None): the term with {names} is missing from the forward itself")
        return ""

    def __repr__(self):
        extra = f", factor={self.factor:.4g}" if self.factor != 1.0 else ""
        extra += f", left_out={self.left_out}" if self.left_out else ""
        return f"Recognition({self.describe()}{extra})"


def recognise(forward, inputs, output):
    """The registered op ``forward`` computes on ``inputs`` (``output`` being its ``out``), as
    a :class:`Recognition`, or None. ``forward`` may be None (a function that runs
    elsewhere, such as a submission's in the grader's sandbox): only the output is used."""
    return next(iter(recognise_all(forward, inputs, output, limit=1)), None)


def recognise_all(forward, inputs, output, *, limit=4):
    """Every recognition, best first: the ops that reproduce the output (in the registry's
    order), then the ops the forward is close to; at most ``limit``. Never raises."""
    try:
        return _recognise(forward, list(inputs), np.asarray(output, dtype=np.float64), limit)
    except Exception:  # noqa: BLE001 -- recognising never fails a check
        return []


def _recognise(forward, inputs, out, limit):
    from ..registry import input_names, registry, spec_of
    op, options = find_op(forward)
    if op is not None:
        spec = spec_of(op)
        return [Recognition(spec.name, options, inputs, reference=True)] if spec else []
    if not out.size or not np.isfinite(out).any() or float(np.max(np.abs(out[np.isfinite(out)]))) == 0:
        return []                                    # an output of zeros tells nothing
    exact, close = [], []
    for name, spec in registry().items():
        names = input_names(spec.forward)
        if len(inputs) > len(names):
            continue
        args = tuple(inputs) + (None,) * (len(names) - len(inputs))
        grid = _grid(spec, inputs, out)
        ran, hit = [], None
        for opts in grid:
            y = _run(spec, opts, args, out.shape)
            if y is None:
                continue
            ran.append((opts, y))
            if _same(y, out):
                hit = opts
                break
        solved = None
        if hit is None and spec.tune and ran and _near(ran, out):
            solved = _solve(spec, [o for o, _ in ran], args, out)
        if hit is not None:
            exact.append(Recognition(name, hit, args))
        elif solved is not None:
            exact.append(Recognition(name, solved[0], args, solved=solved[1]))
        elif ran and not close:
            close += _close(spec, name, names, ran, args, inputs, out)
        if len(exact) >= limit:
            break
    return (exact + ([] if exact else close))[:limit]


def _grid(spec, inputs, out):
    if spec.options is None:
        return [{}]
    try:
        return [dict(o) for o in spec.options(inputs, out)]
    except Exception:  # noqa: BLE001 -- options that do not apply to these inputs
        return []


def _run(spec, options, args, shape):
    """The op's output on ``args`` with ``options`` (float64), or None (it refuses, or the
    shape differs)."""
    from ..registry import bind
    try:
        with np.errstate(all="ignore"):
            y = np.asarray(bind(spec.forward, options)(*args)[0], dtype=np.float64)
    except Exception:  # noqa: BLE001 -- a signature that does not fit
        return None
    return y if y.shape == shape else None


def _same(y, out):
    """Equal up to rounding (infinities where the other is the same infinity)."""
    if y.shape != out.shape:
        return False
    fy, fo = np.isfinite(y), np.isfinite(out)
    if not np.array_equal(fy, fo) or not np.array_equal(y[~fy], out[~fo]):
        return False
    if not fo.any():
        return True
    scale = float(np.max(np.abs(out[fo])))
    return float(np.max(np.abs(y[fy] - out[fo]))) <= _REL * max(scale, 1e-300)


def _distance(y, out):
    if y is None or not np.array_equal(np.isfinite(y), np.isfinite(out)):
        return math.inf
    keep = np.isfinite(out)
    return float(np.sqrt(np.sum((y[keep] - out[keep]) ** 2)))


def _near(ran, out):
    """Whether some option's output is within half the output's size of it: a numeric
    option (eps, a scale) moves the output that little; an op that is further off is not
    worth solving for."""
    size = _distance(np.zeros_like(out), out)
    return any(_distance(y, out) <= _NEAR * size for _, y in ran)


def _solve(spec, grid, args, out):
    """``(options, (name,))`` with one tunable option solved so that the op reproduces
    ``out``, or None. A log-scale search then a golden-section refinement, and the value
    rounded to the fewest digits that still reproduce the output."""
    for name, low, high in spec.tune:
        for base in grid[:4]:
            def f(log_v):
                return _distance(_run(spec, {**base, name: math.exp(log_v)}, args, out.shape), out)
            logs = np.linspace(math.log(low), math.log(high), _GRID)
            values = [f(v) for v in logs]
            k = int(np.argmin(values))
            if not np.isfinite(values[k]):
                continue
            a, b = logs[max(k - 1, 0)], logs[min(k + 1, _GRID - 1)]
            g = (math.sqrt(5) - 1) / 2
            c, d = b - g * (b - a), a + g * (b - a)
            fc, fd = f(c), f(d)
            for _ in range(_GOLDEN):
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - g * (b - a)
                    fc = f(c)
                else:
                    a, c, fc = c, d, fd
                    d = a + g * (b - a)
                    fd = f(d)
            v = math.exp((a + b) / 2)
            for digits in (1, 2, 3, 4, 6, 9, 12, 17):
                nice = float(f"{v:.{digits}g}")
                y = _run(spec, {**base, name: nice}, args, out.shape)
                if y is not None and _same(y, out):
                    return {**base, name: nice}, (name,)
    return None


def _close(spec, name, names, ran, args, inputs, out):
    """A forward close to the op: a constant times its output, or one input left out."""
    for opts, y in ran:
        yy = float(np.sum(y[np.isfinite(y)] ** 2))
        if yy > 0 and np.array_equal(np.isfinite(y), np.isfinite(out)):
            keep = np.isfinite(out)
            c = float(np.sum(out[keep] * y[keep])) / yy
            if c != 0 and abs(c - 1.0) > 1e-6 and _same(c * y, out):
                return [Recognition(name, opts, args, factor=c)]
    opts = ran[0][0]
    for q, x in enumerate(inputs):
        if not (isinstance(x, np.ndarray) and x.dtype.kind == "f") or q == 0:
            continue
        changed = args[:q] + (None,) + args[q + 1:]
        y = _run(spec, opts, changed, out.shape)
        if y is not None and _same(y, out):
            return [Recognition(name, opts, changed, left_out=(names[q],))]
    return []


def _is_causal(mask):
    if mask.dtype != bool or mask.ndim != 2:
        return False
    n_q, n_k = mask.shape
    return bool(np.array_equal(mask, np.arange(n_k)[None, :] <= (n_k - n_q) + np.arange(n_q)[:, None]))
