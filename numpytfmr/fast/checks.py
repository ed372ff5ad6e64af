"""Entry checks of the fast path: done once per call, never inside the hot loops.

The messages follow the reference's: they name the function, the argument, what it got
and what was expected.
"""
import numbers

import numpy as np

from .. import transformer
from ..gpt import GPTConfig, gpt_param_shapes

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def check_config(config, where):
    if not isinstance(config, GPTConfig):
        raise TypeError(f"{where}: config is a {type(config).__name__}; expected a GPTConfig")
    return config


def check_params(params, config, where):
    """The reference's entry check of the parameters (``transformer.check_params``: every key
    of ``gpt_param_shapes(config)`` with its shape, no other key, one float dtype).

    Returns (params as a dict of ndarrays, dtype)."""
    shapes = gpt_param_shapes(config)
    dtype = transformer.check_params(params, shapes, where)
    return {k: np.asarray(params[k]) for k in shapes}, dtype


def check_ids(ids, name, vocab_size, where):
    """(B, T) integer ids in [0, vocab_size), T >= 1."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{where}: {name} has dtype {ids.dtype}; expected an integer array of ids")
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: {name} has shape {ids.shape}; expected (batch, T) with T >= 1")
    if ids.size:
        lo, hi = ids.min(), ids.max()
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{where}: {name} has values in [{lo}, {hi}]; expected values in "
                             f"[0, {vocab_size})")
    return ids


def check_rng(rng, where):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{where}: rng is {type(rng).__name__}; expected a "
                        "numpy.random.Generator (np.random.default_rng(seed))")
    return rng


def check_kv_cache(kv_cache, config, batch, dtype, where):
    """The per-layer {"k", "v"} list of an earlier call; returns (list, n_past)."""
    c = config
    if not isinstance(kv_cache, (list, tuple)) or len(kv_cache) != c.n_layers:
        got = f"a {type(kv_cache).__name__}" + (f" of length {len(kv_cache)}"
                                                if isinstance(kv_cache, (list, tuple)) else "")
        raise ValueError(f"{where}: kv_cache is {got}; expected a list of {c.n_layers} per-layer "
                         "caches (cache['kv_cache'] of an earlier call)")
    out, n_past = [], None
    for l, layer in enumerate(kv_cache):
        if not isinstance(layer, dict) or set(layer) != {"k", "v"}:
            raise TypeError(f"{where}: kv_cache[{l}] is a {type(layer).__name__}; expected a dict "
                            "with keys 'k' and 'v'")
        k, v = np.asarray(layer["k"]), np.asarray(layer["v"])
        if n_past is None:
            n_past = k.shape[-2] if k.ndim == 4 else -1
        want = (batch, c.n_kv_heads, n_past, c.d_head)
        for name, a in (("k", k), ("v", v)):
            if a.shape != want or a.dtype not in FLOATS:
                raise ValueError(f"{where}: kv_cache[{l}][{name!r}] has shape {a.shape} and dtype "
                                 f"{a.dtype}; expected a float array of shape (batch, n_kv_heads, "
                                 f"T_past, d_head) = {want}")
        out.append({"k": k.astype(dtype, copy=False), "v": v.astype(dtype, copy=False)})
    return out, n_past


def check_targets(targets, shape, vocab_size, ignore_index, where):
    """Integer targets of ``shape``, each in [0, vocab_size) or equal to ``ignore_index``.

    Returns (targets, valid or None when every position counts)."""
    targets = np.asarray(targets)
    if targets.dtype.kind not in "iu":
        raise TypeError(f"{where}: targets has dtype {targets.dtype}; expected integer class ids")
    if targets.shape != shape:
        raise ValueError(f"{where}: targets has shape {targets.shape}; expected {shape} (the "
                         "shape of ids)")
    if ignore_index is not None and (isinstance(ignore_index, (bool, np.bool_))
                                     or not isinstance(ignore_index, numbers.Integral)):
        raise TypeError(f"{where}: ignore_index is {ignore_index!r}; expected None or an integer")
    valid = None if ignore_index is None else targets != ignore_index
    t = targets if valid is None else targets[valid]
    if t.size and (t.min() < 0 or t.max() >= vocab_size):
        extra = "" if ignore_index is None else f" (or ignore_index = {ignore_index})"
        raise ValueError(f"{where}: targets has values in [{t.min()}, {t.max()}]; expected class "
                         f"ids in [0, {vocab_size}){extra}")
    if valid is not None and valid.all():
        valid = None
    return targets, valid


def real(v, name, where, *, low=None, high=None):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not np.isfinite(v):
        raise TypeError(f"{where}: {name} is {v!r}; expected a finite real number")
    v = float(v)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{where}: {name} is {v}; expected a value in [{low}, {high}]")
    return v


def check_grads_out(out, params, where):
    """None, or a dict of arrays to write the gradients into: one per parameter, each of its
    parameter's shape and dtype, writeable, sharing memory with no parameter and no other
    gradient (the backward writes them while it still reads the parameters)."""
    if out is None:
        return None
    if not isinstance(out, dict):
        raise TypeError(f"{where}: out is a {type(out).__name__}; expected None or a dict of "
                        "gradient arrays with the keys of params")
    if set(out) != set(params):
        missing, extra = sorted(set(params) - set(out)), sorted(set(out) - set(params))
        raise ValueError(f"{where}: out has the wrong keys (missing {missing}; unexpected "
                         f"{extra}); expected the keys of params")
    for k, p in params.items():
        g = out[k]
        if (not isinstance(g, np.ndarray) or g.shape != p.shape or g.dtype != p.dtype
                or not g.flags.writeable):
            got = (f"a {type(g).__name__}" if not isinstance(g, np.ndarray) else
                   f"an array of shape {g.shape} and dtype {g.dtype}"
                   + ("" if g.flags.writeable else ", read-only"))
            raise ValueError(f"{where}: out[{k!r}] is {got}; expected a writeable array of "
                             f"shape {p.shape} and dtype {p.dtype} like params[{k!r}]")
    # overlapping memory, in one sweep over the arrays' byte ranges sorted by start
    spans = sorted((*_byte_bounds(a), k, is_out) for is_out, d in ((False, params), (True, out))
                   for k, a in d.items() if a.size)
    end_all, (end_out, last_out) = 0, (0, None)
    for lo, hi, k, is_out in spans:
        if lo < (end_all if is_out else end_out):
            raise ValueError(f"{where}: out[{k if is_out else last_out!r}] shares memory with a "
                             "parameter or another gradient; expected arrays of their own (e.g. "
                             "the previous step's gradients)")
        end_all = max(end_all, hi)
        if is_out and hi > end_out:
            end_out, last_out = hi, k
    return out


def _byte_bounds(a):
    """(first byte, one past the last byte) of an array's memory."""
    lo = hi = a.ctypes.data
    if a.flags.c_contiguous:
        return lo, lo + a.nbytes
    for n, st in zip(a.shape, a.strides):
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + a.itemsize
