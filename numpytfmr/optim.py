"""Optimizers, gradient clipping and the learning-rate schedule, as plain functions.

Parameters and gradients are flat dicts ``{name: ndarray}`` with the same keys (the
dicts ``init_gpt`` returns and ``gpt_backward`` produces). Every step function returns
NEW arrays -- the inputs are never modified -- and a new optimizer state::

    state = adamw_init(params)
    for step in range(total_steps):
        grads = ...                                     # same keys as params
        grads, norm = clip_grad_norm(grads, 1.0)
        lr = lr_schedule(step, base_lr=3e-3, warmup_steps=100, total_steps=total_steps)
        params, state = adamw_step(params, grads, state, lr=lr, weight_decay=0.1,
                                   no_decay=decay_exempt_keys(params))

The optimizer state is itself a flat dict of arrays, so ``np.savez(path, **state)``
saves it and ``dict(np.load(path))`` restores it:

    ``"step"``            int64 scalar array, the number of updates taken so far
    ``"momentum/<key>"``  SGD momentum buffer of parameter ``<key>``
    ``"m/<key>"``         Adam first moment (running mean of g)
    ``"v/<key>"``         Adam second moment (running mean of g**2)

Buffers have the dtype of their parameter (float32 parameters keep float32 state).

The update rules are those of ``torch.optim.SGD``, ``torch.optim.Adam`` (Kingma & Ba,
2015, Algorithm 1, with L2 weight decay added to the gradient) and ``torch.optim.AdamW``
(Loshchilov & Hutter, 2019: decoupled weight decay); the tests check them against PyTorch.
The notes use Adam without deriving it (it is reference [1] of 000, 001 and 003, and the
DPO example of 003 §9.2 trains with ``optim.Adam``); the equations are given in each
docstring.
"""
import math
import numbers

import numpy as np

from .contract import float_array, real

__all__ = [
    "sgd_init", "sgd_step",
    "adam_init", "adam_step", "adamw_init", "adamw_step",
    "clip_grad_norm", "global_norm", "lr_schedule",
    "decay_exempt_keys", "state_step",
]

STEP_KEY = "step"


# ---------------------------------------------------------------------------
# shared checks
# ---------------------------------------------------------------------------

def _check_params(params, where):
    """``params`` must be a non-empty dict of float32/float64 arrays."""
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params is a {type(params).__name__}; expected a dict "
                        "{name: float array}")
    if not params:
        raise ValueError(f"{where}: params is an empty dict; expected at least one parameter")
    for k, p in params.items():
        if not isinstance(k, str):
            raise TypeError(f"{where}: params has a key {k!r} of type {type(k).__name__}; "
                            "expected string keys")
        if not isinstance(p, np.ndarray):
            raise TypeError(f"{where}: params[{k!r}] is a {type(p).__name__}; expected a float32 "
                            "or float64 ndarray")
        float_array(p, f"params[{k!r}]", where)


def _check_grads(params, grads, where):
    """``grads`` must have exactly the keys of ``params``, with matching shapes and dtypes."""
    if not isinstance(grads, dict):
        raise TypeError(f"{where}: grads is a {type(grads).__name__}; expected a dict with the "
                        "keys of params")
    missing = [k for k in params if k not in grads]
    extra = [k for k in grads if k not in params]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unexpected {extra}")
        raise ValueError(f"{where}: grads keys do not match params keys ({'; '.join(parts)})")
    for k, p in params.items():
        g = grads[k]
        if not isinstance(g, np.ndarray):
            raise TypeError(f"{where}: grads[{k!r}] is a {type(g).__name__}; expected an ndarray "
                            f"of shape {p.shape} and dtype {p.dtype}")
        if g.shape != p.shape:
            raise ValueError(f"{where}: grads[{k!r}] has shape {g.shape} but params[{k!r}] has "
                             f"shape {p.shape}; they must match")
        if g.dtype != p.dtype:
            raise TypeError(f"{where}: grads[{k!r}] has dtype {g.dtype} but params[{k!r}] has "
                            f"dtype {p.dtype}; they must match (no silent up- or down-casting)")


def _check_state(params, state, prefixes, where):
    """``state`` must hold ``"step"`` and one buffer per prefix and parameter."""
    if not isinstance(state, dict):
        raise TypeError(f"{where}: state is a {type(state).__name__}; expected the dict returned "
                        "by the matching *_init function")
    if STEP_KEY not in state:
        raise ValueError(f"{where}: state has no {STEP_KEY!r} entry; expected the dict returned by "
                         "the matching *_init function")
    state_step(state)  # validates the step entry
    for prefix in prefixes:
        for k, p in params.items():
            key = prefix + k
            if key not in state:
                raise ValueError(f"{where}: state has no {key!r} entry for params[{k!r}]; was it "
                                 "made by the matching *_init function for these params?")
            buf = state[key]
            if not isinstance(buf, np.ndarray) or buf.shape != p.shape or buf.dtype != p.dtype:
                got = (f"shape {buf.shape} and dtype {buf.dtype}" if isinstance(buf, np.ndarray)
                       else f"a {type(buf).__name__}")
                raise ValueError(f"{where}: state[{key!r}] has {got}; expected shape {p.shape} "
                                 f"and dtype {p.dtype} like params[{k!r}]")


def _no_decay_set(params, no_decay, where):
    """The set of parameter names exempt from weight decay.

    ``no_decay`` is ``None`` (decay everything), an iterable of names, or a predicate
    ``name -> bool``.
    """
    if no_decay is None:
        return frozenset()
    if callable(no_decay):
        return frozenset(k for k in params if no_decay(k))
    if isinstance(no_decay, str):
        raise TypeError(f"{where}: no_decay is the string {no_decay!r}; expected a collection "
                        "of parameter names or a predicate name -> bool")
    names = frozenset(no_decay)
    unknown = sorted(k for k in names if k not in params)
    if unknown:
        raise ValueError(f"{where}: no_decay names {unknown}, which are not keys of params")
    return names


def _lr(lr, where):
    return real(lr, "lr", where, low=0.0)


def _step_array(t):
    return np.array(t, dtype=np.int64)


def state_step(state):
    """The number of updates recorded in an optimizer ``state`` (an ``int``)."""
    where = "state_step"
    if not isinstance(state, dict) or STEP_KEY not in state:
        raise ValueError(f"{where}: state has no {STEP_KEY!r} entry; expected an optimizer state dict")
    s = np.asarray(state[STEP_KEY])
    if s.shape != () or s.dtype.kind not in "iu" or s < 0:
        raise ValueError(f"{where}: state[{STEP_KEY!r}] is {state[STEP_KEY]!r}; expected a "
                         "non-negative integer scalar array")
    return int(s)


def decay_exempt_keys(params):
    """Names of parameters with fewer than two axes (biases, LayerNorm gamma/beta).

    The usual rule for weight decay in transformers (GPT-2, nanoGPT): decay the weight
    matrices and embeddings, not the 1-D biases and norm gains. Pass the result as
    ``no_decay=`` to the step functions.
    """
    _check_params(params, "decay_exempt_keys")
    return frozenset(k for k, p in params.items() if p.ndim < 2)


# ---------------------------------------------------------------------------
# SGD
# ---------------------------------------------------------------------------

def sgd_init(params):
    """Initial SGD state: ``{"step": 0, "momentum/<k>": 0}`` for every parameter.

    params: dict name -> float array. Returns a flat dict of arrays (see the module doc).
    The momentum buffers are only read when ``sgd_step`` is called with ``momentum > 0``.
    """
    where = "sgd_init"
    _check_params(params, where)
    state = {STEP_KEY: _step_array(0)}
    for k, p in params.items():
        state["momentum/" + k] = np.zeros_like(p)
    return state


def sgd_step(params, grads, state, *, lr, momentum=0.0, nesterov=False, weight_decay=0.0,
             no_decay=None):
    """One step of stochastic gradient descent with momentum (as ``torch.optim.SGD``).

        g   = dL/dtheta + lambda * theta          (L2 weight decay, skipped for no_decay names)
        b   = mu * b + g                          (momentum buffer, b_0 = 0; only if mu > 0)
        g   = g + mu * b  if nesterov  else  b
        theta <- theta - eta * g

    with `eta` = ``lr``, `mu` = ``momentum``, `lambda` = ``weight_decay``.

    params, grads: dicts name -> array, same keys, shapes and dtypes.
    state: from ``sgd_init(params)`` or a previous step.
    Returns ``(new_params, new_state)``; nothing passed in is modified.
    """
    where = "sgd_step"
    _check_params(params, where)
    _check_grads(params, grads, where)
    lr = _lr(lr, where)
    momentum = real(momentum, "momentum", where, low=0.0, high=1.0, high_open=True)
    weight_decay = real(weight_decay, "weight_decay", where, low=0.0)
    if not isinstance(nesterov, (bool, np.bool_)):
        raise TypeError(f"{where}: nesterov is {nesterov!r}; expected True or False")
    if nesterov and momentum == 0.0:
        raise ValueError(f"{where}: nesterov=True needs momentum > 0; got momentum={momentum}")
    _check_state(params, state, ("momentum/",) if momentum > 0.0 else (), where)
    exempt = _no_decay_set(params, no_decay, where)

    new_params = {}
    # buffers not used at this momentum are carried over unchanged
    new_state = dict(state)
    new_state[STEP_KEY] = _step_array(state_step(state) + 1)
    for k, p in params.items():
        g = grads[k]
        if weight_decay and k not in exempt:
            g = g + weight_decay * p                      # gradient of (lambda/2) ||theta||^2
        if momentum > 0.0:
            b = momentum * state["momentum/" + k] + g     # b_t = mu b_{t-1} + g_t
            new_state["momentum/" + k] = b
            g = g + momentum * b if nesterov else b       # Nesterov looks one step ahead
        new_params[k] = p - lr * g
    return new_params, new_state


# ---------------------------------------------------------------------------
# Adam and AdamW
# ---------------------------------------------------------------------------

def adam_init(params):
    """Initial Adam/AdamW state: ``{"step": 0, "m/<k>": 0, "v/<k>": 0}`` for every parameter."""
    where = "adam_init"
    _check_params(params, where)
    state = {STEP_KEY: _step_array(0)}
    for k, p in params.items():
        state["m/" + k] = np.zeros_like(p)
        state["v/" + k] = np.zeros_like(p)
    return state


def adamw_init(params):
    """Initial AdamW state; the same as ``adam_init`` (AdamW keeps the same moments)."""
    return adam_init(params)


def _adam_common(params, grads, state, lr, beta1, beta2, eps, weight_decay, no_decay, decoupled,
                 where):
    _check_params(params, where)
    _check_grads(params, grads, where)
    lr = _lr(lr, where)
    beta1 = real(beta1, "beta1", where, low=0.0, high=1.0, high_open=True)
    beta2 = real(beta2, "beta2", where, low=0.0, high=1.0, high_open=True)
    eps = real(eps, "eps", where, low=0.0)
    weight_decay = real(weight_decay, "weight_decay", where, low=0.0)
    _check_state(params, state, ("m/", "v/"), where)
    exempt = _no_decay_set(params, no_decay, where)

    t = state_step(state) + 1
    new_params = {}
    new_state = {STEP_KEY: _step_array(t)}
    for k, p in params.items():
        g = grads[k]
        decay = weight_decay if k not in exempt else 0.0
        if decay and not decoupled:
            g = g + decay * p                             # Adam: L2 term joins the gradient
        if decay and decoupled:
            p = p * (1 - lr * decay)                      # AdamW: theta <- theta - eta lambda theta
        m = beta1 * state["m/" + k] + (1 - beta1) * g     # m_t = beta1 m_{t-1} + (1 - beta1) g
        v = beta2 * state["v/" + k] + (1 - beta2) * g**2  # v_t = beta2 v_{t-1} + (1 - beta2) g^2
        m_hat = m / (1 - beta1**t)                        # bias corrections (Python floats keep
        v_hat = v / (1 - beta2**t)                        #   float32 parameters float32)
        new_params[k] = p - lr * m_hat / (np.sqrt(v_hat) + eps)   # theta - eta m_hat/(sqrt v_hat + eps)
        new_state["m/" + k] = m
        new_state["v/" + k] = v
    return new_params, new_state


def adam_step(params, grads, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
              no_decay=None):
    """One Adam step (Kingma & Ba 2015, Alg. 1; as ``torch.optim.Adam``).

        g     = dL/dtheta + lambda * theta                  (L2 decay in the gradient)
        m_t   = beta1 m_{t-1} + (1 - beta1) g
        v_t   = beta2 v_{t-1} + (1 - beta2) g^2
        m_hat = m_t / (1 - beta1^t),   v_hat = v_t / (1 - beta2^t)
        theta <- theta - eta * m_hat / (sqrt(v_hat) + eps)

    With `m_0 = v_0 = 0` the first step moves every parameter by about ``eta * sign(g)``.
    ``no_decay``: parameter names (or a predicate) that get no weight decay.
    Returns ``(new_params, new_state)``; nothing passed in is modified.
    """
    return _adam_common(params, grads, state, lr, beta1, beta2, eps, weight_decay, no_decay,
                        False, "adam_step")


def adamw_step(params, grads, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
               no_decay=None):
    """One AdamW step: Adam with decoupled weight decay (Loshchilov & Hutter 2019; as
    ``torch.optim.AdamW``, whose default ``weight_decay`` is 0.01).

        theta <- theta - eta * lambda * theta              (decay first, not through m, v)
        then the Adam update of ``adam_step`` with the plain gradient.

    Unlike L2 decay in Adam, the decay here is not divided by `sqrt(v_hat)`, so every weight
    shrinks at the same relative rate.
    Returns ``(new_params, new_state)``; nothing passed in is modified.
    """
    return _adam_common(params, grads, state, lr, beta1, beta2, eps, weight_decay, no_decay,
                        True, "adamw_step")


# ---------------------------------------------------------------------------
# gradient clipping and the learning-rate schedule
# ---------------------------------------------------------------------------

def global_norm(arrays):
    """The L2 norm of all arrays of a dict taken together: ``sqrt(sum_k ||a_k||^2)``.

    Accumulated in float64 (float32 gradients cannot overflow the sum of squares);
    returns a Python float.
    """
    where = "global_norm"
    if not isinstance(arrays, dict):
        raise TypeError(f"{where}: arrays is a {type(arrays).__name__}; expected a dict of arrays")
    total = 0.0
    for k, a in arrays.items():
        a = float_array(a, f"arrays[{k!r}]", where)
        total += float(np.sum(np.square(a, dtype=np.float64)))
    if not math.isfinite(total):
        raise ValueError(f"{where}: the sum of squares is {total}; expected finite arrays")
    return math.sqrt(total)


def clip_grad_norm(grads, max_norm, *, eps=1e-6):
    """Rescale all gradients together so their global L2 norm is at most ``max_norm``.

        N = sqrt(sum_k ||g_k||^2),   g_k <- g_k * min(1, max_norm / (N + eps))

    as ``torch.nn.utils.clip_grad_norm_`` (same ``eps = 1e-6``), but returning new arrays.
    grads: dict name -> float array. Returns ``(clipped_grads, N)`` with ``N`` the norm
    BEFORE clipping, as a Python float. Gradients holding nan/inf raise ``ValueError``
    (a diverged step should stop training, not be scaled into the weights).
    """
    where = "clip_grad_norm"
    if not isinstance(grads, dict):
        raise TypeError(f"{where}: grads is a {type(grads).__name__}; expected a dict of arrays")
    max_norm = real(max_norm, "max_norm", where, low=0.0, low_open=True)
    for k, g in grads.items():
        g = float_array(g, f"grads[{k!r}]", where)
        if not np.all(np.isfinite(g)):
            raise ValueError(f"{where}: grads[{k!r}] holds non-finite values (nan or inf); "
                             "expected finite gradients")
    total = global_norm(grads)
    coef = min(1.0, max_norm / (total + eps))  # a Python float keeps each dtype
    return {k: g * coef for k, g in grads.items()}, total


def lr_schedule(step, *, base_lr, warmup_steps, total_steps, min_lr=0.0):
    """Linear warmup, then cosine decay to ``min_lr`` (the GPT-2/GPT-3/nanoGPT schedule).

        step < W:       lr = base_lr * (step + 1) / (W + 1)
        W <= step <= T: lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * (step - W) / (T - W))) / 2
        step > T:       lr = min_lr

    with ``W = warmup_steps`` and ``T = total_steps``. ``step`` counts updates from 0;
    the first update gets ``base_lr / (W + 1)`` (never 0), the peak ``base_lr`` is at
    ``step = W``, halfway through the decay it is ``(base_lr + min_lr) / 2``.
    Returns a Python float.
    """
    where = "lr_schedule"
    for name, v in (("step", step), ("warmup_steps", warmup_steps), ("total_steps", total_steps)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{where}: {name} is {v!r}; expected a non-negative integer")
        if v < 0:
            raise ValueError(f"{where}: {name} is {v}; expected a non-negative integer")
    if total_steps <= warmup_steps:
        raise ValueError(f"{where}: total_steps is {total_steps} but warmup_steps is "
                         f"{warmup_steps}; expected total_steps > warmup_steps")
    base_lr = real(base_lr, "base_lr", where, low=0.0)
    min_lr = real(min_lr, "min_lr", where, low=0.0, high=base_lr)
    if step < warmup_steps:
        return base_lr * (step + 1) / (warmup_steps + 1)
    if step > total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)  # 0 -> 1 over the decay
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
