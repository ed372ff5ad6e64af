"""The case's own terms, so that a factor is named as the student wrote it (``d_k``,
``1/scale``, ``alpha/r``, ``N``, a batch size). Sources, first found first named: the
caller's ``terms=``; the options of a reference op, a thin wrapper around one, or the op a
forward of the student's own computes exactly; the op's contract axes bound to the input
shapes, and ``N`` rows; numbers in the cache; else the inputs' axis sizes. The expressions
formed and which terms take no root: docs/gradcheck.md, "Factors, in the case's own terms".
"""
import functools
import inspect
import math
import numbers

import numpy as np

__all__ = ["Terms", "learn_terms", "find_op"]

_REL = 1e-4          # a factor matches a term within this relative tolerance


class Terms:
    """Named numbers of one case, in the order they are preferred when naming a factor.

    named, shapes: (name, value) lists; shapes (axis sizes) are used when nothing named fits.
    axes: (input position, axis) -> contract symbol; options: the keyword options found;
    notes: name -> how it reads in a sentence (default ``"name = value"``)."""

    def __init__(self, named=(), shapes=(), axes=None, options=None, notes=None, counts=()):
        self.named, self.shapes = [], []
        self.notes = dict(notes or {})
        self.counts = set(counts)     # names that count positions or rows: no square roots
        for name, value in named:
            self._add(self.named, name, value)
        for name, value in shapes:
            self._add(self.shapes, name, value)
        self.axes = dict(axes or {})
        self.options = dict(options or {})

    @staticmethod
    def _add(where, name, value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            return
        value = float(value)
        if not np.isfinite(value) or value <= 0 or value == 1.0:
            return
        if all(n != name for n, _ in where):
            where.append((name, value))

    def axis_name(self, p, axis, size):
        """The contract's symbol of input ``p``'s ``axis``, else ``d`` (its size shown)."""
        return self.axes.get((p, axis)) or "d"

    def name_factor(self, c, limit=4):
        """How ``|c|`` reads in the case's terms (``"alpha/r, alpha = 6, r = 3"``): every
        expression of the simplest kind that fits, up to ``limit``; "" when none fits."""
        c = abs(float(c))
        if not np.isfinite(c) or c == 0 or abs(c - 1.0) <= _REL:
            return ""                                  # 1 is no factor (d/n_k = 1 says nothing)
        exprs, used = [], []
        for tier in (self._single_expressions(), self._pair_expressions()):
            for expr, value, names in tier:
                if abs(c - value) <= _REL * value and expr not in exprs and len(exprs) < limit:
                    exprs.append(expr)
                    used += [n for n in names if n not in used]
            if exprs:
                break
        if exprs:
            values = dict(self.named)
            shown = [self.notes.get(n, f"{n} = {_num(values[n])}") for n in used
                     if n not in exprs or n in self.notes]
            return " = ".join(exprs) + (f", {', '.join(shown)}" if shown else "")
        for name, v in self.shapes:
            if v <= 2:
                continue
            k = _num(v)
            for expr, value in ((k, v), (f"1/{k}", 1.0 / v), (f"sqrt({k})", math.sqrt(v)),
                                (f"1/sqrt({k})", 1.0 / math.sqrt(v))):
                if abs(c - value) <= _REL * value:
                    return name if expr == k else f"{expr}, {k} = {name}"
        return ""

    def _single_expressions(self):
        """(expression, value, names used) of one named term: t, 1/t, sqrt(t), 1/sqrt(t)."""
        for name, v in self.named:
            yield name, v, [name]
            yield f"1/{_wrap(name)}", 1.0 / v, [name]
            if name not in self.counts:
                yield f"sqrt({name})", math.sqrt(v), [name]
                yield f"1/sqrt({name})", 1.0 / math.sqrt(v), [name]

    def _pair_expressions(self):
        """(expression, value, names used) of two named terms."""
        for i, (n1, v1) in enumerate(self.named):
            for n2, v2 in self.named[i + 1:]:
                yield f"{_wrap(n1)}*{_wrap(n2)}", v1 * v2, [n1, n2]
        for n1, v1 in self.named:
            for n2, v2 in self.named:
                if n1 != n2:
                    yield f"{_wrap(n1)}/{_wrap(n2)}", v1 / v2, [n1, n2]
                    if n2 not in self.counts:
                        yield f"{_wrap(n1)}/sqrt({n2})", v1 / math.sqrt(v2), [n1, n2]
                        yield f"1/({n1}*sqrt({n2}))", 1.0 / (v1 * math.sqrt(v2)), [n1, n2]


def _num(v):
    return f"{int(round(v))}" if abs(v - round(v)) < 1e-12 else f"{v:.4g}"


def _wrap(name):
    return f"({name})" if " " in name or "/" in name else name


# --- Learning the terms of one check ---------------------------------------------------

def find_op(forward):
    """``(op, options)``: the reference op behind ``forward`` and its keyword options, through
    ``functools.partial`` and thin wrappers (a closure calling one op with its own inputs in
    order, options in a dict, as ``registry.bind``); ``(None, {})`` when there is none."""
    options = {}
    f = forward
    for _ in range(4):
        if getattr(f, "__contract__", None) is not None:
            return f, options
        if isinstance(f, functools.partial):
            options = {**f.keywords, **options}
            f = f.func
            continue
        if not callable(f) or not hasattr(f, "__code__"):
            return None, {}
        try:
            seen = inspect.getclosurevars(f)
        except (TypeError, ValueError):
            return None, {}
        values = list(seen.nonlocals.values()) + list(seen.globals.values())
        # ops reached through a module: nt.softmax_forward (the attribute is in "unbound")
        values += [getattr(m, name, None) for m in values if inspect.ismodule(m)
                   for name in seen.unbound]
        ops = list({id(v): v for v in values if getattr(v, "__contract__", None) is not None}.values())
        if len(ops) != 1:
            return None, {}
        op = ops[0]
        # the wrapper must pass its inputs on in order: lambda Q, K, V: op(Q, K, V, mask=M),
        # or *args as registry.bind does (else the contract's axes would name other arrays)
        own = _positional_names(f)
        if own and own != _positional_names(op)[:len(own)]:
            return None, {}
        keyword = _keyword_names(op)
        for v in seen.nonlocals.values():
            if isinstance(v, dict) and v and all(isinstance(k, str) and k in keyword for k in v):
                options = {**v, **options}
        return op, options
    return None, {}


def _keyword_names(op):
    try:
        params = inspect.signature(op).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind == p.KEYWORD_ONLY}


def learn_terms(forward, inputs, names, cache=None, extra=None, recognised=None):
    """The :class:`Terms` of one check (sources: the module docstring); never fails a check.
    ``recognised()``: the recognitions of the forward, whose exact op lends its axes and
    options to a forward of the student's own."""
    named = [(str(k), v) for k, v in (extra or {}).items()]
    try:
        return _learn(forward, inputs, names, cache, named, recognised)
    except Exception:  # noqa: BLE001 -- an unusual forward just gives fewer names
        return Terms(named)


def _learn(forward, inputs, names, cache, named, recognised=None):
    op, options = find_op(forward)
    if op is None and recognised is not None:
        found = recognised()
        if found and found[0].exact and not found[0].reference:
            op, options = found[0].spec().forward, dict(found[0].options)
            ref_cache = found[0].run()[1]                # the op's own numbers (scale, n_valid)
            mine = cache if isinstance(cache, dict) else {}
            cache = {**{k: v for k, v in ref_cache.items() if isinstance(k, str)}, **mine}
    if op is not None:
        defaults = {p.name: p.default for p in inspect.signature(op).parameters.values()
                    if p.kind == p.KEYWORD_ONLY and p.default is not inspect.Parameter.empty}
        options = {**defaults, **options}
    named += [(key, value) for key, value in options.items()
              if key not in ("rng", "axis") and _is_number(value)]
    axes, notes, counts = {}, {}, set()
    if op is not None:
        spec = op.__contract__
        positional = _positional_names(op)
        rows_named = False
        for s in spec.arrays:
            if s.name not in positional or s.kind == "any":
                continue
            p = positional.index(s.name)
            x = inputs[p] if p < len(inputs) else None
            n = len(s.axes)
            if not isinstance(x, np.ndarray) or x.ndim < n:
                continue
            for k, symbol in enumerate(s.axes):
                axis = x.ndim - n + k
                if symbol.isidentifier():
                    axes[(p, axis)] = symbol
                    if x.shape[axis] > 2:            # 2 = d_k would name every doubled gradient
                        named.append((symbol, x.shape[axis]))
                        if not (symbol.startswith("d") or symbol == "r"):
                            counts.add(symbol)       # n_q, n_k, K, T: counts, never rooted
            if s.ellipsis and s.kind == "float" and not rows_named and x.ndim > n:
                rows = int(np.prod(x.shape[:x.ndim - n]))
                rows_named = True
                if rows > 2:
                    named.append(("N", rows))
                    counts.add("N")
                    lead = x.shape[:x.ndim - n]
                    notes["N"] = f"N = {rows} rows of {s.name}" + (
                        f" ({' x '.join(str(k) for k in lead)})" if len(lead) > 1 else "")
    if isinstance(cache, dict):
        named += [(key, value) for key, value in cache.items()
                  if isinstance(key, str) and _is_number(value) and key != "axis"]
    shapes = []
    if op is None:
        for p, x in enumerate(inputs):
            if isinstance(x, np.ndarray) and x.dtype.kind == "f":
                for axis, size in enumerate(x.shape):
                    shapes.append((f"the size of {names[p]}'s last axis" if axis == x.ndim - 1
                                   else f"the size of axis {axis} of {names[p]}", size))
    return Terms(named, shapes, axes, options, notes, counts)


def _positional_names(fn):
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _is_number(v):
    return (isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))
            and np.isfinite(float(v)))
