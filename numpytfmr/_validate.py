"""Input checks shared by every op.

Each check raises a ``TypeError`` or ``ValueError`` whose message starts with the
function's name, names the argument, says what it got and what was expected
(SPEC.md, convention 6).
"""
import numbers

import numpy as np

FLOAT_DTYPES = (np.float32, np.float64)


def _describe(x):
    if isinstance(x, np.ndarray):
        return f"an array of dtype {x.dtype} and shape {x.shape}"
    return f"a {type(x).__name__}"


def float_array(x, name, where):
    """Return ``x`` as a float32/float64 ndarray, or raise naming ``name``.

    Lists and scalars of floats are accepted; integer, boolean, complex and object
    data are refused (a float op fed token ids is almost always a bug).
    """
    if isinstance(x, np.matrix):  # np.matrix changes the meaning of `*`
        x = np.asarray(x).view(np.ndarray)
    if not isinstance(x, np.ndarray):
        if isinstance(x, (bool, np.bool_)) or x is None:
            raise TypeError(f"{where}: {name} is {_describe(x)}; expected a floating-point array")
        try:
            x = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise TypeError(f"{where}: {name} could not be read as an array ({exc})") from None
        if x.dtype.kind in "iu":  # a Python float list holding ints only: still refuse
            raise TypeError(f"{where}: {name} has integer dtype {x.dtype}; expected a floating-point "
                            "array (float32 or float64)")
    if x.dtype.kind != "f" or x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{where}: {name} has dtype {x.dtype}; expected a floating-point array "
                        "(float32 or float64)")
    return x


def optional_float_array(x, name, where):
    return None if x is None else float_array(x, name, where)


def int_array(x, name, where, *, low=0, high=None):
    """Return ``x`` as an integer ndarray with ``low <= x < high`` (``high`` optional)."""
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


def seq2seq_targets(batch, where):
    """``batch["tgt_ids"]`` of a sequence-to-sequence training batch, checked: ``batch`` is a
    dict with "src_ids" and "tgt_ids", and tgt_ids is an int array (B, T+1), T+1 >= 2."""
    if not isinstance(batch, dict):
        raise TypeError(f"{where}: batch is a {type(batch).__name__}; expected a dict with "
                        "'src_ids', 'tgt_ids' and optionally 'src_mask', 'loss_mask'")
    for k in ("src_ids", "tgt_ids"):
        if k not in batch:
            raise ValueError(f"{where}: batch has keys {sorted(batch)}; expected a key {k!r}")
    tgt = int_array(batch["tgt_ids"], "batch['tgt_ids']", where)
    if tgt.ndim != 2 or tgt.shape[1] < 2:
        raise ValueError(f"{where}: batch['tgt_ids'] has shape {tgt.shape}; expected (B, T+1) "
                         "with T+1 >= 2 (a start token and at least one token to predict)")
    return tgt


def bool_mask(mask, name, where, target_shape):
    """Return ``mask`` as a boolean array broadcastable to ``target_shape``."""
    if isinstance(mask, np.matrix):
        mask = np.asarray(mask).view(np.ndarray)
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"{where}: {name} has dtype {mask.dtype}; expected a boolean array "
                        "(True = may attend)")
    try:
        np.broadcast_shapes(mask.shape, tuple(target_shape))
    except ValueError:
        raise ValueError(f"{where}: {name} has shape {mask.shape}, which does not broadcast to "
                         f"{tuple(target_shape)}") from None
    if len(mask.shape) > len(target_shape) or np.broadcast_shapes(mask.shape, tuple(target_shape)) != tuple(target_shape):
        raise ValueError(f"{where}: {name} has shape {mask.shape}, which would enlarge the result "
                         f"shape {tuple(target_shape)}; expected a shape broadcastable to it")
    return mask


def positive_int(v, name, where):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{where}: {name} is {v!r}; expected a positive integer")
    if v <= 0:
        raise ValueError(f"{where}: {name} is {v}; expected a positive integer")
    return int(v)


def number(v, name, where, *, low=None, high=None, low_open=False, high_open=False):
    """Return ``float(v)`` after checking it is a real number in the given interval."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{where}: {name} is {v!r}; expected a real number")
    v = float(v)
    if not np.isfinite(v):
        raise ValueError(f"{where}: {name} is {v}; expected a finite number")
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lb = "(" if low_open else "["
        hb = ")" if high_open else "]"
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ValueError(f"{where}: {name} is {v}; expected a value in {lb}{lo}, {hi}{hb}")
    return v


def choice(v, name, where, options):
    if v not in options:
        raise ValueError(f"{where}: {name} is {v!r}; expected one of {', '.join(map(repr, options))}")
    return v


def same_last_dim(a, b, name_a, name_b, where, what):
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"{where}: {name_b} has shape {b.shape} but {name_a} has shape {a.shape}; "
                         f"the last axes ({what}) must match")


def min_ndim(x, n, name, where, layout):
    if x.ndim < n:
        raise ValueError(f"{where}: {name} has shape {x.shape}; expected at least {n} axes {layout}")


def result_dtype(*arrays):
    """float32 when every float input is float32, float64 otherwise (SPEC convention 4)."""
    return np.result_type(*[a.dtype for a in arrays if a is not None])


def rng_arg(rng, where):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{where}: rng is {_describe(rng)}; expected a numpy.random.Generator "
                        "(np.random.default_rng(seed))")
    return rng


def axis_arg(axis, x, name, where):
    """Return ``axis`` as an int in ``[0, x.ndim)``; negative axes count from the end."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{where}: axis is {axis!r}; expected an integer")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{where}: axis is {axis} but {name} has shape {x.shape} ({x.ndim} axes); "
                         f"expected an axis in [{-x.ndim}, {x.ndim})")
    return int(axis) % x.ndim


def vector_arg(v, n, name, where, ref_name, ref_shape, what):
    """Return ``v`` (already a float array) after checking it has shape ``(n,)``.

    ``ref_name``/``ref_shape`` name the array ``n`` comes from, for the message, and
    ``what`` says which axis that is, e.g. ``"the last axis of x"``.
    """
    if v.shape != (n,):
        raise ValueError(f"{where}: {name} has shape {v.shape} but {ref_name} has shape "
                         f"{tuple(ref_shape)}; expected {name} of shape ({n},) ({what})")
    return v


def upstream(dout, name, where, shape, dtype, *, what="the forward output's"):
    """An upstream gradient: a float array of the forward output's ``shape``, cast to its dtype."""
    dout = float_array(dout, name, where)
    if dout.shape != tuple(shape):
        raise ValueError(f"{where}: {name} has shape {dout.shape}; expected {what} shape "
                         f"{tuple(shape)}")
    return dout.astype(dtype, copy=False)
