"""What a diagnosis looks at: the compared values of one failing input (:class:`Evidence`),
the check around it (:class:`Case`: inputs, output, the forward to probe, the terms), and
the :class:`Diagnosis` sentence, a ``str`` with a ``kind`` that tests and tools read."""
import functools

import numpy as np

__all__ = ["Diagnosis", "Evidence", "Case", "once"]


def once(make):
    """``make`` called on the first call of the returned function only, its value kept."""
    return functools.cache(make)


class Diagnosis(str):
    """A sentence that says how a gradient is wrong; ``kind`` names the cause (``"factor"``,
    ``"row_term"``, ...; ``"known_mistake"``, with the catalogue's name in ``mistake``)."""

    def __new__(cls, text, kind="other", mistake=None):
        obj = super().__new__(cls, text)
        obj.kind = kind
        obj.mistake = mistake
        return obj

    def __reduce__(self):
        return (Diagnosis, (str(self), self.kind, self.mistake))


class Case:
    """The check around input ``p``: everything but its compared values.

    inputs are float64 working copies; out (float64) and dout those of the check. terms:
    :class:`~.terms.Terms`, or a function that makes them when first asked for. recognised:
    a function returning ``recognise.recognise_all``'s list, shared by the check's inputs;
    None: computed for this case when asked."""

    def __init__(self, forward, inputs, p, out, dout, names, terms, recognised=None):
        self.forward, self.inputs, self.p = forward, list(inputs), p
        self.out, self.dout, self.names, self._terms = out, dout, names, terms
        self._recognised = recognised
        self._memo = {}

    @property
    def terms(self):
        """The case's :class:`~.terms.Terms` (given, or made when first asked for)."""
        return self._terms() if callable(self._terms) else self._terms

    def recognised(self):
        """The :class:`~.recognise.Recognition` list of the forward (what it computes)."""
        if self._recognised is not None:
            return self._recognised()
        from . import recognise
        return self.memo(("recognised",), lambda: recognise.recognise_all(
            self.forward, self.inputs, self.out))

    @property
    def x(self):
        return self.inputs[self.p]

    @property
    def name(self):
        return self.names[self.p]

    def run(self, **replace):
        """The forward's output with some inputs replaced (``run(p=array)`` by position:
        ``run(**{"0": x})``), as float64; None if the forward fails or changes shape."""
        args = list(self.inputs)
        for key, value in replace.items():
            args[int(key)] = value
        try:
            with np.errstate(all="ignore"):
                y = np.array(self.forward(*args)[0], dtype=np.float64)
        except Exception:  # noqa: BLE001 -- a probe the forward refuses just tells nothing
            return None
        return y if y.shape == self.out.shape else None

    def run_with(self, x):
        """The forward's output with the input under diagnosis replaced by ``x``."""
        return self.run(**{str(self.p): x})

    def ints(self):
        """(position, array) of the integer inputs (ids, targets)."""
        return [(q, v) for q, v in enumerate(self.inputs)
                if isinstance(v, np.ndarray) and v.dtype.kind in "iu"]

    def floats(self):
        """(position, array) of the float inputs other than the one under diagnosis."""
        return [(q, v) for q, v in enumerate(self.inputs)
                if q != self.p and isinstance(v, np.ndarray) and v.dtype.kind == "f"]

    def memo(self, key, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


class Evidence:
    """The analytic and numeric gradient of one input (arrays of its shape) and how they
    differ. ``tol`` is the tolerance for calling two arrays equal: far above the rounding
    of the finite differences, far below any real error."""

    def __init__(self, a, n, fail, dout, atol, rounding=0.0, case=None):
        self.a = np.asarray(a, dtype=np.float64)
        self.n = np.asarray(n, dtype=np.float64)
        self.r = self.n - self.a
        self.fail = np.asarray(fail, dtype=bool)
        self.dout = np.asarray(dout, dtype=np.float64)
        self.case = case
        self.scale = max(float(np.max(np.abs(self.a), initial=0.0)),
                         float(np.max(np.abs(self.n), initial=0.0)))
        self.tol = 1e-6 * self.scale + 10.0 * float(rounding) + atol

    @property
    def shape(self):
        return self.a.shape

    def close(self, u, v):
        u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
        if u.shape != v.shape or not u.size or not np.isfinite(u).all() or not np.isfinite(v).all():
            return False
        return float(np.max(np.abs(u - v))) <= self.tol

    def axis_label(self, axis):
        """``axis -1 (d = 7)``: an axis of the input, with its contract symbol when known."""
        size = self.shape[axis]
        neg = axis - len(self.shape)
        symbol = "d"
        if self.case is not None and self.case.terms is not None:
            symbol = self.case.terms.axis_name(self.case.p, axis % len(self.shape), size)
        return f"axis {neg} ({symbol} = {size})"
