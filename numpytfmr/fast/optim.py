"""Fast AdamW (Loshchilov & Hutter 2019), the update of ``numpytfmr.optim.adamw_step``.

    theta <- theta (1 - eta lambda)                                  decoupled decay
    m_t = beta1 m + (1 - beta1) g,   v_t = beta2 v + (1 - beta2) g^2
    theta <- theta - (eta / (1 - beta1^t)) m_t / (sqrt(v_t) / sqrt(1 - beta2^t) + eps)

:func:`adamw_step` returns new arrays like the reference (nothing passed in changes);
each new array is computed in place after it is allocated, so a step allocates the
three outputs and one temporary per parameter. :func:`adamw_step_` updates the
parameters and the moments in place (a training loop that owns them allocates nothing).
"""
import math
import numbers
import threading

import numpy as np

from ..contract import real
from . import parallel

__all__ = ["adamw_step", "adamw_step_", "clip_grad_norm_"]


def _checked(params, grads, state, lr, beta1, beta2, eps, weight_decay, no_decay, where):
    if not isinstance(params, dict) or not isinstance(grads, dict) or not isinstance(state, dict):
        raise TypeError(f"{where}: params, grads and state must be dicts of arrays")
    if set(grads) != set(params):
        missing = sorted(set(params) - set(grads))
        extra = sorted(set(grads) - set(params))
        raise ValueError(f"{where}: grads keys do not match params keys (missing {missing}; "
                         f"unexpected {extra})")
    for k, p in params.items():
        g = grads[k]
        for name, a in (("grads", g), ("state m", state.get("m/" + k)),
                        ("state v", state.get("v/" + k))):
            if not isinstance(a, np.ndarray) or a.shape != p.shape or a.dtype != p.dtype:
                raise ValueError(f"{where}: {name} of {k!r} is not an array of shape {p.shape} "
                                 f"and dtype {p.dtype} like params[{k!r}]")
    step = state.get("step")
    s = np.asarray(step)
    if step is None or s.shape != () or s.dtype.kind not in "iu" or s < 0:
        raise ValueError(f"{where}: state['step'] is {step!r}; expected a non-negative integer "
                         "scalar array (the dict of adamw_init)")
    for name, v, hi in (("lr", lr, None), ("beta1", beta1, 1.0), ("beta2", beta2, 1.0),
                        ("eps", eps, None), ("weight_decay", weight_decay, None)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) \
                or not math.isfinite(v) or v < 0 or (hi is not None and v >= hi):
            bound = "[0, 1)" if hi is not None else "[0, inf)"
            raise ValueError(f"{where}: {name} is {v!r}; expected a number in {bound}")
    if no_decay is None:
        exempt = frozenset()
    elif callable(no_decay):
        exempt = frozenset(k for k in params if no_decay(k))
    elif isinstance(no_decay, str):
        raise TypeError(f"{where}: no_decay is the string {no_decay!r}; expected a collection "
                        "of parameter names or a predicate name -> bool")
    else:
        exempt = frozenset(no_decay)
        unknown = sorted(k for k in exempt if k not in params)
        if unknown:
            raise ValueError(f"{where}: no_decay names {unknown}, which are not keys of params")
    return int(s) + 1, exempt


def _update(p, g, m, v, out, t, lr, beta1, beta2, eps, decay):
    """One parameter: writes theta, m_t, v_t into ``out`` = (p', m', v', tmp), which may be
    (p, m, v, tmp) for an update in place (every operation is elementwise).

    The step is eta m_hat / (sqrt(v_hat) + eps) = m_t / ((sqrt(v_t) + eps') / c) with
    c = eta sqrt(1 - beta2^t) / (1 - beta1^t) and eps' = eps sqrt(1 - beta2^t): the bias
    corrections and the learning rate fold into two scalars (one pass less)."""
    p2, m2, v2, tmp = out
    np.multiply(m, beta1, out=m2)
    np.multiply(g, 1.0 - beta1, out=tmp)
    m2 += tmp                                      # m_t = beta1 m + (1 - beta1) g
    np.multiply(v, beta2, out=v2)
    np.multiply(g, g, out=tmp)
    tmp *= 1.0 - beta2
    v2 += tmp                                      # v_t = beta2 v + (1 - beta2) g^2
    root = math.sqrt(1.0 - beta2 ** t)
    c = lr * root / (1.0 - beta1 ** t)
    if c == 0.0:                                   # lr = 0: no step, only the decay (none)
        tmp.fill(0.0)
    else:
        np.sqrt(v2, out=tmp)
        tmp += eps * root
        tmp *= 1.0 / c
        np.divide(m2, tmp, out=tmp)                # eta m_hat / (sqrt(v_hat) + eps)
    if decay:
        np.multiply(p, 1.0 - lr * decay, out=p2)   # theta (1 - eta lambda)
        p2 -= tmp
    else:
        np.subtract(p, tmp, out=p2)


_LOCAL = threading.local()


def _scratch(size, dtype):
    """This thread's scratch array of at least ``size`` elements of ``dtype`` (one per
    dtype), kept between steps (a new 1 MB array every step would cost its page faults
    every step)."""
    kept = _LOCAL.__dict__.setdefault("scratch", {})
    buf = kept.get(np.dtype(dtype))
    if buf is None or buf.size < size:
        buf = kept[np.dtype(dtype)] = np.empty(size, dtype)
    return buf


def _pieces(params, k):
    """The update's work in pieces for ``k`` workers: (key, rows) pairs, rows a slice of the
    parameter's first axis (None: the whole parameter), dealt out largest first to the
    least loaded worker. Every element is updated by one piece, with the same operations
    as in one pass: the split does not change a bit of the result."""
    total = sum(p.size for p in params.values())
    target = max(1, -(-total // (4 * k)))
    pieces = []
    for key, p in params.items():
        if p.ndim == 0 or p.size <= target or p.shape[0] < 2:
            pieces.append((p.size, key, None))
            continue
        row = p.size // p.shape[0]
        step = max(1, target // max(row, 1))
        for a in range(0, p.shape[0], step):
            b = min(a + step, p.shape[0])
            pieces.append(((b - a) * row, key, slice(a, b)))
    pieces.sort(key=lambda x: -x[0])
    loads, parts = [0] * k, [[] for _ in range(k)]
    for size, key, rows in pieces:
        w = loads.index(min(loads))
        loads[w] += size
        parts[w].append((key, rows))
    return [(part,) for part in parts if part]


def _update_all(params, grads, state, outs, t, lr, beta1, beta2, eps, weight_decay, exempt):
    """_update for every parameter, ``outs[key]`` = (p', m', v') or None (in place); the
    parameters in pieces on the workers when there are several and enough to do."""
    lr, beta1, beta2, eps, weight_decay = (float(v) for v in (lr, beta1, beta2, eps,
                                                              weight_decay))
    total = sum(p.size for p in params.values())
    k = parallel.workers() if total >= parallel.MIN_ELEMENTS else 1

    def update(part):
        dtype = np.result_type(*(params[key] for key, _ in part))
        tmp_buf = _scratch(max(params[key][rows if rows is not None else ...].size
                               for key, rows in part), dtype)
        for key, rows in part:
            sel = ... if rows is None else rows
            p, g = params[key][sel], grads[key][sel]
            m, v = state["m/" + key][sel], state["v/" + key][sel]
            tmp = (tmp_buf[:p.size].reshape(p.shape) if tmp_buf.dtype == p.dtype
                   else np.empty_like(p))
            out = (p, m, v) if outs[key] is None else tuple(o[sel] for o in outs[key])
            _update(p, g, m, v, out + (tmp,), t, lr, beta1, beta2, eps,
                    0.0 if key in exempt else weight_decay)
    if k <= 1:
        update([(key, None) for key in params])
    else:
        parallel.run(update, _pieces(params, k))


def adamw_step(params, grads, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
               no_decay=None):
    """One AdamW step, as ``numpytfmr.optim.adamw_step``: returns (new_params, new_state)."""
    t, exempt = _checked(params, grads, state, lr, beta1, beta2, eps, weight_decay, no_decay,
                         "fast.adamw_step")
    outs = {k: (np.empty_like(p), np.empty_like(p), np.empty_like(p)) for k, p in params.items()}
    _update_all(params, grads, state, outs, t, lr, beta1, beta2, eps, weight_decay, exempt)
    new_params, new_state = {}, {"step": np.array(t, dtype=np.int64)}
    for k in params:
        new_params[k], new_state["m/" + k], new_state["v/" + k] = outs[k]
    return new_params, new_state


def adamw_step_(params, grads, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
                no_decay=None):
    """The same step in place: ``params`` and ``state`` (its moments and step) are updated.

    Returns (params, state), the same dicts."""
    t, exempt = _checked(params, grads, state, lr, beta1, beta2, eps, weight_decay, no_decay,
                         "fast.adamw_step_")
    _update_all(params, grads, state, dict.fromkeys(params), t, lr, beta1, beta2, eps,
                weight_decay, exempt)
    state["step"] = np.array(t, dtype=np.int64)
    return params, state


# sum of squares in float64 over blocks of this many elements (a float64 copy of a block,
# not of the whole gradient)
NORM_BLOCK = 1 << 16


def clip_grad_norm_(grads, max_norm, *, eps=1e-6):
    """``numpytfmr.optim.clip_grad_norm`` in place: the gradients are scaled by
    min(1, max_norm / (N + eps)), N = sqrt(sum_k ||g_k||^2) accumulated in float64.

    Returns (grads, N), the same dict and N before clipping. Non-finite gradients raise
    the reference's ValueError, naming the first such gradient.
    """
    where = "fast.clip_grad_norm_"
    if not isinstance(grads, dict):
        raise TypeError(f"{where}: grads is a {type(grads).__name__}; expected a dict of arrays")
    max_norm = real(max_norm, "max_norm", where, low=0.0, low_open=True)
    blocks = []                          # (flat gradient, start): the terms of the sum, in order
    for k, g in grads.items():
        if not isinstance(g, np.ndarray) or g.dtype.kind != "f" or not g.flags.writeable:
            raise TypeError(f"{where}: grads[{k!r}] is not a writeable float array")
        flat = g.reshape(-1)
        blocks += [(flat, start) for start in range(0, flat.size, NORM_BLOCK)]
    sums = np.zeros(len(blocks))

    def squares(lo, hi):                 # each block's sum of squares, in float64
        if lo >= hi:
            return
        buf = _scratch(NORM_BLOCK, np.float64)
        for i in range(lo, hi):
            flat, start = blocks[i]
            part = buf[:min(NORM_BLOCK, flat.size - start)]
            np.copyto(part, flat[start:start + NORM_BLOCK])
            sums[i] = part @ part
    size = sum(g.size for g in grads.values())
    k = parallel.workers() if size >= parallel.MIN_ELEMENTS else 1
    parallel.run(squares, parallel.row_blocks(len(blocks), k, align=1))
    total = 0.0
    for s in sums.tolist():              # added in the same order whatever the workers
        total += s
    if not math.isfinite(total):
        bad = next(k for k, g in grads.items() if not np.all(np.isfinite(g)))
        raise ValueError(f"{where}: grads[{bad!r}] holds non-finite values (nan or inf); "
                         "expected finite gradients")
    norm = math.sqrt(total)
    coef = min(1.0, max_norm / (norm + eps))
    if coef < 1.0:
        def scale(part):
            for key, rows in part:
                grads[key][... if rows is None else rows] *= coef
        if k <= 1:
            scale([(key, None) for key in grads])
        else:
            parallel.run(scale, _pieces(grads, k))
    return grads, norm
