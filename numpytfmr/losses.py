"""Cross-entropy with label smoothing (003 §2.1.1-2.1.2, 003 §3.7).

The language-modelling loss is the mean negative log-probability of the target token
(003 eq. 2.2), computed from the logits through log-softmax so that logits of any size stay
finite. Label smoothing (003 §3.7) replaces the one-hot target by
``q'(k) = (1 - eps) [k = y] + eps / K``.
"""
import numbers

import numpy as np

from ._validate import float_array, int_array, number
from .activations import log_softmax

__all__ = ["cross_entropy_forward", "cross_entropy_backward"]


def cross_entropy_forward(logits, targets, *, label_smoothing=0.0, ignore_index=None):
    """Mean cross-entropy between softmax(logits) and (smoothed) one-hot targets (003 eq. 2.2, §3.7).

        log p = log_softmax(z)                                  (over the last axis, K classes)
        q'(k) = (1 - eps) [k = y] + eps / K                     (003 §3.7, uniform u(k) = 1/K)
        l_i   = -sum_k q'(k) log p_i(k)
              = -(1 - eps) log p_i(y_i) - (eps / K) sum_k log p_i(k)
        loss  = (1/N) sum_{i not ignored} l_i,   N = number of positions not ignored

    With eps = 0 this is -(1/N) sum_i log p_i(y_i), whose exp is the perplexity (003 §2.1.1).
    Positions where ``targets == ignore_index`` (e.g. padding, ``-100``) count neither in the
    sum nor in N; when every position is ignored the loss is 0 and so is its gradient.

    logits: (..., K) float   targets: (...) int in [0, K) (or ignore_index)
    ->  loss: 0-d array of the logits' dtype
    cache: {"logp": log_softmax(logits), "targets" (ignored ones set to 0), "valid": bool (...),
            "n_valid": N, "eps"}
    """
    where = "cross_entropy_forward"
    logits = float_array(logits, "logits", where)
    if logits.ndim == 0:
        raise ValueError(f"{where}: logits has shape (); expected shape (..., K) with the classes last")
    targets = int_array(targets, "targets", where, low=-np.inf)  # range checked below, past ignore_index
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"{where}: targets has shape {targets.shape} but logits has shape "
                         f"{logits.shape}; expected targets of shape {logits.shape[:-1]} "
                         "(logits without its last, class axis)")
    eps = number(label_smoothing, "label_smoothing", where, low=0.0, high=1.0)
    if ignore_index is not None and (isinstance(ignore_index, (bool, np.bool_))
                                     or not isinstance(ignore_index, numbers.Integral)):
        raise TypeError(f"{where}: ignore_index is {ignore_index!r}; expected None or an integer")
    K = logits.shape[-1]
    valid = np.ones(targets.shape, dtype=bool) if ignore_index is None else targets != ignore_index
    t_valid = targets[valid]
    if t_valid.size and (t_valid.min() < 0 or t_valid.max() >= K):
        extra = "" if ignore_index is None else f" (or ignore_index = {ignore_index})"
        raise ValueError(f"{where}: targets has values in [{t_valid.min()}, {t_valid.max()}]; "
                         f"expected class ids in [0, {K}){extra} for logits with K = {K} classes")
    n_valid = int(valid.sum())

    logp = log_softmax(logits, axis=-1)
    safe_t = np.where(valid, targets, 0)  # ignored positions may hold any id, e.g. -100
    logp_target = np.take_along_axis(logp, safe_t[..., None], axis=-1)[..., 0]
    per_position = -(1.0 - eps) * logp_target
    if eps > 0:  # the smoothing term (skipped at eps = 0: it would add exactly 0)
        per_position = per_position - (eps / K) * logp.sum(axis=-1)
    total = np.sum(np.where(valid, per_position, 0))
    loss = np.asarray(total / max(n_valid, 1), dtype=logits.dtype)
    cache = {"logp": logp, "targets": safe_t, "valid": valid, "n_valid": n_valid, "eps": eps}
    return loss, cache


def cross_entropy_backward(dout, cache):
    """Gradient of :func:`cross_entropy_forward`.

        dlogits_i = dout * (p_i - q'_i) / N   for positions not ignored, 0 for ignored ones

    (softmax followed by cross-entropy: d l_i / d z_i = p_i - q'_i, because q' sums to 1).
    Returns (dlogits, None): the integer targets take no gradient.
    """
    logp, valid, eps = cache["logp"], cache["valid"], cache["eps"]
    K = logp.shape[-1]
    with np.errstate(under="ignore"):  # exp of very negative log-probabilities is 0, exactly
        g = np.exp(logp)  # p
        if eps > 0:
            g -= eps / K  # p - eps/K: the uniform part of q'
        # subtract the one-hot part (1 - eps) [k = y] at each position's target
        t = cache["targets"][..., None]
        np.put_along_axis(g, t, np.take_along_axis(g, t, axis=-1) - (1.0 - eps), axis=-1)
        scale = np.asarray(dout, dtype=logp.dtype) / max(cache["n_valid"], 1)  # d loss / d l_i = 1/N
        g *= (scale * valid)[..., None]  # ignored positions get 0
    return g, None
