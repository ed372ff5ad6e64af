"""The contract layer: the conventions of ``docs/contract.md`` applied once, declaratively.

A reference op's body is its equation. Everything else a caller relies on is declared on
the line above the function and applied here, the same way for every op::

    @op("x: (..., d)", "gamma: (d,)?", "beta: (d,)?", eps=positive)
    def layernorm_forward(x, gamma, beta, *, eps=1e-5): ...

    @backward_of(layernorm_forward)
    def layernorm_backward(dout, cache): ...

An array spec reads like the docstring's shape line: ``name: [kind] shape [?]``.

- kind: ``float`` (the default: float32 or float64; lists are converted), ``int`` (ids),
  ``bool`` (masks) or ``any`` (passed through unchecked).
- shape: ``(...)`` for any shape, or a tuple of axes: ``...`` (any leading axes, at most
  once, first), a symbol (``d``, ``n_k``: every array that names it must agree, and it
  must be at least 1), or a literal size. ``~(..., n_q, n_k)`` means "broadcastable to
  that shape without enlarging it" (masks and additive biases).
- ``?``: the argument may be ``None`` (an optional input).

The leading ``...`` axes of all float inputs must broadcast against each other. Options
(keyword arguments) are checked by the small validators below (``positive``, ``fraction``,
``one_of(...)``, ...), each named in the decorator.

What the decorator does around the body:

- forward: checks and converts every declared argument, with a ``TypeError``/``ValueError``
  that names the op, the argument, what it got and what was expected; casts the float
  inputs to their common dtype (float32 when all of them are float32: float32 in, float32
  out) and float keyword arrays (a bias) to that dtype; casts the output to it; and tags
  the cache with the op's name and the output's shape and dtype.
- backward: refuses a ``cache`` that did not come from its own forward, checks ``dout``
  against the forward's output (shape; cast to its dtype), and casts every gradient to
  the dtype of the input it belongs to.
"""
import functools
import inspect
import numbers
import re

import numpy as np

__all__ = ["op", "backward_of", "OpCache", "ContractSpec",
           "positive", "nonnegative", "fraction", "probability", "real", "count", "flag",
           "one_of", "generator", "optional", "axis_of", "int_array", "broadcasts_to",
           "check_broadcastable", "broadcastable_to"]

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# ---------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------

def describe(x):
    """``an array of dtype float64 and shape (2, 3)`` / ``a list`` / ``None``, for messages."""
    if x is None:
        return "None"
    if isinstance(x, np.ndarray):
        return f"an array of dtype {x.dtype} and shape {x.shape}"
    return f"a {type(x).__name__}"


def _fmt_shape(axes):
    inner = ", ".join(axes)
    return f"({inner},)" if len(axes) == 1 else f"({inner})"


# ---------------------------------------------------------------------------------------
# Array conversion (also used by the models and the machinery)
# ---------------------------------------------------------------------------------------

def float_array(x, name, where):
    """``x`` as a float32/float64 ndarray, or a TypeError naming ``name``.

    Lists and scalars of floats are accepted; integer, boolean, complex and object data
    are refused (a float op fed token ids is almost always a bug).
    """
    if isinstance(x, np.matrix):  # np.matrix changes the meaning of `*`
        x = np.asarray(x).view(np.ndarray)
    if not isinstance(x, np.ndarray):
        if x is None or isinstance(x, (bool, np.bool_, str, bytes, dict)):
            raise TypeError(f"{where}: {name} is {describe(x)}; expected a floating-point array")
        try:
            x = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise TypeError(f"{where}: {name} could not be read as an array ({exc})") from None
        if x.dtype.kind in "iu":
            raise TypeError(f"{where}: {name} has integer dtype {x.dtype}; expected a floating-point "
                            "array (float32 or float64)")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{where}: {name} has dtype {x.dtype}; expected a floating-point array "
                        "(float32 or float64)")
    return x


def int_array(x, name, where, *, low=0, high=None):
    """``x`` as an integer ndarray with ``low <= x < high`` (``high`` optional)."""
    if isinstance(x, np.matrix):
        x = np.asarray(x).view(np.ndarray)
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if x.dtype.kind not in "iu":
        raise TypeError(f"{where}: {name} has dtype {x.dtype}; expected an integer array of ids")
    if x.size:
        lo, hi = x.min(), x.max()
        if lo < low or (high is not None and hi >= high):
            bound = f"[{low}, {high})" if high is not None else f">= {low}"
            raise ValueError(f"{where}: {name} has values in [{lo}, {hi}]; expected values in {bound}")
    return x


def bool_array(x, name, where):
    if isinstance(x, np.matrix):
        x = np.asarray(x).view(np.ndarray)
    x = np.asarray(x)
    if x.dtype != np.bool_:
        raise TypeError(f"{where}: {name} has dtype {x.dtype}; expected a boolean array "
                        "(True = keep / may attend)")
    return x


# ---------------------------------------------------------------------------------------
# Option validators: v(value, name, where, args) -> value  (args: the bound, converted arguments)
# ---------------------------------------------------------------------------------------

def real(v, name, where, args=None, *, low=None, high=None, low_open=False, high_open=False):
    """A finite real number, optionally in an interval; returned as a Python float."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{where}: {name} is {v!r}; expected a real number")
    v = float(v)
    if not np.isfinite(v):
        raise ValueError(f"{where}: {name} is {v}; expected a finite number")
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lb = "(" if low_open or low is None else "["
        hb = ")" if high_open or high is None else "]"
        lo, hi = ("-inf" if low is None else low), ("inf" if high is None else high)
        raise ValueError(f"{where}: {name} is {v}; expected a value in {lb}{lo}, {hi}{hb}")
    return v


def positive(v, name, where, args=None):
    """A real number > 0 (eps, beta, alpha, a temperature)."""
    return real(v, name, where, low=0.0, low_open=True)


def nonnegative(v, name, where, args=None):
    return real(v, name, where, low=0.0)


def fraction(v, name, where, args=None):
    """A real number in [0, 1) (a dropout probability, label smoothing)."""
    return real(v, name, where, low=0.0, high=1.0, high_open=True)


def probability(v, name, where, args=None):
    """A real number in [0, 1]."""
    return real(v, name, where, low=0.0, high=1.0)


def count(v, name, where, args=None):
    """A positive integer (n_heads, a window, a block size)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{where}: {name} is {v!r}; expected a positive integer")
    if v <= 0:
        raise ValueError(f"{where}: {name} is {v}; expected a positive integer")
    return int(v)


def flag(v, name, where, args=None):
    """True or False."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{where}: {name} is {v!r}; expected True or False")
    return bool(v)


def generator(v, name, where, args=None):
    """A ``numpy.random.Generator`` (the only source of randomness)."""
    if not isinstance(v, np.random.Generator):
        raise TypeError(f"{where}: {name} is {describe(v)}; expected a numpy.random.Generator "
                        "(np.random.default_rng(seed))")
    return v


def one_of(*options):
    """A validator accepting exactly the given values."""
    def check(v, name, where, args=None):
        if not any(v == o and type(v) is type(o) for o in options):
            raise ValueError(f"{where}: {name} is {v!r}; expected one of {', '.join(map(repr, options))}")
        return v
    check.__doc__ = f"one of {', '.join(map(repr, options))}"
    return check


def optional(validator):
    """``None``, or a value ``validator`` accepts."""
    def check(v, name, where, args=None):
        return None if v is None else validator(v, name, where, args)
    doc = (validator.__doc__ or validator.__name__).strip()
    check.__doc__ = f"None or {doc[:1].lower()}{doc[1:]}"
    return check


def axis_of(array_name):
    """An axis of the argument ``array_name`` (negative counts from the end), returned in
    ``[0, ndim)``; that axis must not be empty (a softmax over zero classes has no value)."""
    def check(v, name, where, args):
        x = args[array_name]
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{where}: {name} is {v!r}; expected an integer")
        if not -x.ndim <= v < x.ndim:
            raise ValueError(f"{where}: {name} is {v} but {array_name} has shape {x.shape} "
                             f"({x.ndim} axes); expected an axis in [{-x.ndim}, {x.ndim})")
        v = int(v) % x.ndim
        if x.shape[v] == 0:
            raise ValueError(f"{where}: {array_name} has shape {x.shape}, empty along {name} = {v}; "
                             "expected at least one element along that axis")
        return v
    check.__doc__ = f"an axis of {array_name}"
    return check


# ---------------------------------------------------------------------------------------
# Array specs
# ---------------------------------------------------------------------------------------

_SPEC = re.compile(r"^\s*(?P<name>\w+)\s*:\s*(?P<kind>float|int|bool|any)?\s*"
                   r"(?P<bcast>~)?\((?P<axes>[^)]*)\)\s*(?P<opt>\?)?\s*$")


class ArraySpec:
    """One parsed ``"name: kind (axes)?"`` spec."""
    __slots__ = ("name", "kind", "axes", "ellipsis", "broadcast", "optional", "text")

    def __init__(self, text):
        m = _SPEC.match(text)
        if not m:
            raise SyntaxError(f"bad array spec {text!r}; expected 'name: [float|int|bool|any] (axes)[?]'")
        self.text = text.strip()
        self.name = m["name"]
        self.kind = m["kind"] or "float"
        self.broadcast = bool(m["bcast"])
        self.optional = bool(m["opt"])
        axes = [a.strip() for a in m["axes"].split(",") if a.strip()]
        self.ellipsis = bool(axes) and axes[0] == "..."
        self.axes = axes[1:] if self.ellipsis else axes
        if "..." in self.axes:
            raise SyntaxError(f"bad array spec {text!r}: '...' may only come first")

    @property
    def shape_text(self):
        return _fmt_shape((["..."] if self.ellipsis else []) + self.axes)


def _convert(spec, x, where):
    if spec.kind == "float":
        return float_array(x, spec.name, where)
    if spec.kind == "int":
        return int_array(x, spec.name, where)
    if spec.kind == "bool":
        return bool_array(x, spec.name, where)
    return x


def _check_axes(spec, x, sizes, owner, where):
    """Check ``x``'s shape against ``spec``, binding symbols in ``sizes`` (symbol -> size)."""
    shape = x.shape
    n = len(spec.axes)
    if len(shape) < n or (not spec.ellipsis and len(shape) != n):
        expected = "at least " if spec.ellipsis else ""
        raise ValueError(f"{where}: {spec.name} has shape {shape}; expected {expected}{n} "
                         f"{'axis' if n == 1 else 'axes'} {spec.shape_text}")
    tail = shape[len(shape) - n:] if n else ()
    for axis, size in zip(spec.axes, tail):
        if axis.isdigit():
            if size != int(axis):
                raise ValueError(f"{where}: {spec.name} has shape {shape}; expected {spec.shape_text}")
        elif axis == "*":
            continue
        elif axis in sizes:
            if size != sizes[axis]:
                other = owner[axis]
                raise ValueError(f"{where}: {spec.name} has shape {shape} but {other} has shape "
                                 f"{sizes['@' + other]}; the axes {axis} must match "
                                 f"({spec.name} {spec.shape_text})")
        else:
            if size == 0:
                raise ValueError(f"{where}: {spec.name} has shape {shape}; expected {axis} >= 1 "
                                 f"({spec.shape_text}: an empty axis has nothing to compute over)")
            sizes[axis] = size
            owner[axis] = spec.name
    sizes["@" + spec.name] = shape
    return shape[:len(shape) - n]


# ---------------------------------------------------------------------------------------
# Broadcasting without enlarging (masks and biases of the scores, positions of x)
# ---------------------------------------------------------------------------------------

def broadcasts_to(shape, target):
    """True when an array of ``shape`` broadcasts to ``target`` without enlarging it: NumPy
    broadcasts the two shapes to ``target`` itself (so ``shape`` has at most as many axes,
    each 1 or the target's size)."""
    target = tuple(target)
    try:
        return np.broadcast_shapes(tuple(shape), target) == target
    except ValueError:
        return False


def check_broadcastable(x, target, name, where, text, to=""):
    """``x``, when it :func:`broadcasts_to` ``target``; otherwise a ValueError naming ``name``,
    its shape and the target (``to`` and ``text`` say what the target is: ``"the scores'
    shape "``, ``"(..., n_heads, n_q, n_k)"``)."""
    if not broadcasts_to(x.shape, target):
        raise ValueError(f"{where}: {name} has shape {x.shape}, which does not broadcast to "
                         f"{to}{target} {text}; expected a shape broadcastable to it")
    return x


def broadcastable_to(target, text, to="", doc=None):
    """A validator: None, or an array that broadcasts to ``target(args)`` without enlarging it,
    for a target the array specs cannot name (the scores of several heads, with cached keys).

    target: ``target(args) -> shape`` from the bound, checked arguments
    text, to: how messages name the target (see :func:`check_broadcastable`)
    doc: the validator's docstring (what the contract's lines say of the argument)
    """
    def check(v, name, where, args):
        return None if v is None else check_broadcastable(v, target(args), name, where, text, to)
    check.__doc__ = doc or f"None, or an array broadcastable to {text} without enlarging it"
    return check


def _check_broadcastable(spec, x, sizes, batch, where):
    """``x`` must broadcast to the target shape named by ``spec`` without enlarging it."""
    target = tuple(batch if spec.ellipsis else ()) + tuple(
        int(a) if a.isdigit() else sizes.get(a, 1) for a in spec.axes)
    check_broadcastable(x, target, spec.name, where, spec.shape_text)


class ContractSpec:
    """The parsed contract of one forward: its array specs and option validators."""

    def __init__(self, name, arrays, options):
        self.name = name
        self.arrays = [ArraySpec(a) for a in arrays]
        self.options = dict(options)

    def lines(self):
        """The contract as text lines (for skeletons and the reader's pages)."""
        out = [s.text for s in self.arrays]
        for k, val in self.options.items():
            first_paragraph = (val.__doc__ or val.__name__).strip().split("\n\n")[0]
            out.append(f"{k}: {' '.join(first_paragraph.split())}")
        return out


class OpCache(dict):
    """A forward's cache: a plain dict of what the backward needs, plus the tag the contract
    layer checks (``op``: the forward's name; ``out``: the output's shape and dtype;
    ``dtypes``: the dtype of each positional input, None for a non-float or absent one)."""
    __slots__ = ("op", "out", "dtypes")


def _out_meta(out):
    if isinstance(out, tuple):
        return tuple(_out_meta(o) for o in out)
    a = np.asarray(out)
    return (a.shape, a.dtype)


def _cast_out(out, dt):
    if isinstance(out, tuple):
        return tuple(_cast_out(o, dt) for o in out)
    if isinstance(out, np.ndarray) and out.dtype.kind == "f":
        return out.astype(dt, copy=False)
    if isinstance(out, (float, np.floating)):
        return dt.type(out)
    return out


def op(*arrays, **options):
    """Declare a forward's contract: array specs for its inputs, validators for its options.

    The wrapped function is called with the checked and converted arguments and must
    return ``(out, cache)`` with ``cache`` a dict; see the module docstring.
    """
    def decorate(fn):
        where = fn.__name__
        spec = ContractSpec(where, arrays, options)
        sig = inspect.signature(fn)
        positional = [p.name for p in sig.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        by_name = {s.name: s for s in spec.arrays}
        unknown = (set(by_name) | set(spec.options)) - set(sig.parameters)
        if unknown:
            raise SyntaxError(f"{where}: contract names {sorted(unknown)}, which are not parameters")

        @functools.wraps(fn)
        def forward(*a, **kw):
            try:
                bound = sig.bind(*a, **kw)
            except TypeError as exc:
                raise TypeError(f"{where}: {exc}") from None
            bound.apply_defaults()
            args = bound.arguments
            sizes, owner, batches = {}, {}, []
            later = []
            for s in spec.arrays:
                x = args[s.name]
                if x is None:
                    if s.optional:
                        continue
                    raise TypeError(f"{where}: {s.name} is None; expected {s.kind} array {s.shape_text}")
                x = _convert(s, x, where)
                if s.kind != "any":
                    if s.broadcast:
                        later.append((s, x))
                    else:
                        batch = _check_axes(s, x, sizes, owner, where)
                        if s.ellipsis and s.kind == "float":
                            batches.append((s.name, x.shape, batch))
                args[s.name] = x
            batch = ()
            if batches:
                try:
                    batch = np.broadcast_shapes(*(b for _, _, b in batches))
                except ValueError:
                    listed = ", ".join(f"{n} {shape}" for n, shape, _ in batches)
                    raise ValueError(f"{where}: the leading (batch) axes of {listed} do not "
                                     "broadcast against each other") from None
            for s, x in later:
                _check_broadcastable(s, x, sizes, batch, where)
            floats = [args[n] for n in positional
                      if isinstance(args.get(n), np.ndarray) and args[n].dtype in FLOAT_DTYPES
                      and n in by_name and by_name[n].kind == "float"]
            dt = np.result_type(*floats) if floats else np.dtype(np.float64)
            dtypes = tuple(args[n].dtype if n in by_name and by_name[n].kind == "float"
                           and args.get(n) is not None else None for n in positional)
            for s in spec.arrays:
                if s.kind == "float" and args.get(s.name) is not None:
                    args[s.name] = args[s.name].astype(dt, copy=False)
            for name, check in spec.options.items():
                args[name] = check(args[name], name, where, args)
            out, cache = fn(*bound.args, **bound.kwargs)
            out = _cast_out(out, dt)
            tagged = OpCache(cache)
            tagged.op, tagged.out, tagged.dtypes = where, _out_meta(out), dtypes
            return out, tagged

        forward.__contract__ = spec
        forward.__wrapped__ = fn
        return forward
    return decorate


def _check_dout(dout, meta, name, where):
    if not isinstance(meta[1], np.dtype):                               # several outputs
        if not isinstance(dout, (tuple, list)) or len(dout) != len(meta):
            raise TypeError(f"{where}: {name} is {describe(dout)}; expected a tuple of {len(meta)} "
                            "upstream gradients, one per output of the forward")
        return tuple(_check_dout(d, m, f"{name}[{i}]", where) for i, (d, m) in enumerate(zip(dout, meta)))
    shape, dtype = meta
    if dtype.kind != "f":
        return dout
    dout = float_array(dout, name, where)
    if dout.shape != shape:
        raise ValueError(f"{where}: {name} has shape {dout.shape}; expected the forward output's "
                         f"shape {shape}")
    return dout.astype(dtype, copy=False)


def _cast_grad(g, dt):
    if g is None or dt is None or not isinstance(g, np.ndarray):
        return g
    return g.astype(dt, copy=False)


def backward_of(forward):
    """Declare ``fn`` the backward of ``forward`` (decorated with :func:`op`): ``fn(dout, cache)``
    gets a checked ``dout`` and a cache from ``forward``; its gradients are cast to the dtypes
    of the inputs they belong to."""
    source = forward.__name__

    def decorate(fn):
        where = fn.__name__

        @functools.wraps(fn)
        def backward(dout, cache):
            if not isinstance(cache, OpCache) or cache.op != source:
                got = (f"the cache of {cache.op}" if isinstance(cache, OpCache) else describe(cache))
                raise TypeError(f"{where}: cache is {got}; expected the cache returned by {source}")
            dout = _check_dout(dout, cache.out, "dout", where)
            grads = fn(dout, cache)
            if isinstance(grads, tuple):
                return tuple(_cast_grad(g, dt) for g, dt in zip(grads, cache.dtypes))
            if isinstance(grads, dict):
                return grads
            return _cast_grad(grads, cache.dtypes[0] if cache.dtypes else None)

        backward.__wrapped__ = fn
        backward.forward = forward
        return backward
    return decorate
