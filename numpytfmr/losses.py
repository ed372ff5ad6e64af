"""Cross-entropy with label smoothing (003 §2.1.1-2.1.2, 003 §3.7).

The language-modelling loss is the mean negative log-probability of the target token
(003 eq. 2.2), computed from the logits through log-softmax so that logits of any size stay
finite. Label smoothing (003 §3.7) replaces the one-hot target by
``q'(k) = (1 - eps) [k = y] + eps / K``.
"""
import numbers

import numpy as np

from .activations import log_softmax
from .contract import backward_of, int_array, op, optional, probability

__all__ = ["cross_entropy_forward", "cross_entropy_backward"]


def integer(v, name, where, args=None):
    """An integer of any sign (an ignore_index such as -100)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{where}: {name} is {v!r}; expected None or an integer")
    return int(v)


def class_targets(targets, name, where, args):
    """Integer class ids of shape ``logits.shape[:-1]``, each in ``[0, K)`` unless it equals
    ``ignore_index`` (validated before it)."""
    logits, ignore_index = args["logits"], args["ignore_index"]
    targets = int_array(targets, name, where, low=-np.inf)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"{where}: {name} has shape {targets.shape} but logits has shape "
                         f"{logits.shape}; expected {name} of shape {logits.shape[:-1]} "
                         "(logits without its last, class axis)")
    K = logits.shape[-1]
    counted = targets if ignore_index is None else targets[targets != ignore_index]
    if counted.size and (counted.min() < 0 or counted.max() >= K):
        extra = "" if ignore_index is None else f" (or ignore_index = {ignore_index})"
        raise ValueError(f"{where}: {name} has values in [{counted.min()}, {counted.max()}]; "
                         f"expected class ids in [0, {K}){extra} for logits with K = {K} classes")
    return targets


@op("logits: (..., K)", "targets: any (...)",
    label_smoothing=probability, ignore_index=optional(integer), targets=class_targets)
def cross_entropy_forward(logits, targets, *, label_smoothing=0.0, ignore_index=None):
    """Mean cross-entropy of softmax(logits) and (smoothed) one-hot targets (003 eq. 2.2, §3.7).

        log p = log_softmax(z)                                  (over the last axis, K classes)
        q'(k) = (1 - eps) [k = y] + eps / K                     (003 §3.7, uniform u(k) = 1/K)
        l_i   = -sum_k q'(k) log p_i(k)
              = -(1 - eps) log p_i(y_i) - (eps / K) sum_k log p_i(k)
        loss  = (1/N) sum_{i not ignored} l_i,   N = number of positions not ignored

    With `eps = 0` this is `-(1/N) sum_i log p_i(y_i)`, whose exp is the perplexity (003 §2.1.1).
    Positions where ``targets == ignore_index`` (e.g. padding, ``-100``) count neither in the
    sum nor in N; when every position is ignored the loss is 0 and so is its gradient.

    logits: (..., K) float   targets: (...) int in [0, K) (or ignore_index)
    ->  loss: a scalar of the logits' dtype
    cache: {"logp": log_softmax(logits), "targets" (ignored ones set to 0), "valid": bool (...),
            "n_valid": N, "eps"}
    """
    eps, K = label_smoothing, logits.shape[-1]
    valid = targets != ignore_index                          # positions that count (all if None)
    y = np.where(valid, targets, 0)                          # ignored ids (-100) read class 0
    logp = log_softmax(logits, axis=-1)                      # log p_i(k)   (003 eq. 2.2)
    logp_y = np.take_along_axis(logp, y[..., None], axis=-1)[..., 0]   # log p_i(y_i)
    l = -(1 - eps) * logp_y - eps / K * logp.sum(-1)         # l_i = -sum_k q'(k) log p_i(k)
    N = int(valid.sum())
    loss = (l * valid).sum() / max(N, 1)                     # mean over the N counted (0 if none)
    return loss, {"logp": logp, "targets": y, "valid": valid, "n_valid": N, "eps": eps}


@backward_of(cross_entropy_forward)
def cross_entropy_backward(dout, cache):
    """Gradient of :func:`cross_entropy_forward`.

        dlogits_i = dout * (p_i - q'_i) / N   for positions not ignored, 0 for ignored ones

    (softmax followed by cross-entropy: `d l_i / d z_i = p_i - q'_i`, because `q'` sums to 1).
    Returns (dlogits, None): the integer targets take no gradient.
    """
    logp, y, valid, eps = cache["logp"], cache["targets"], cache["valid"], cache["eps"]
    K = logp.shape[-1]
    with np.errstate(under="ignore"):                        # exp(-huge) = 0: the exact answer
        p = np.exp(logp)                                     # p_i = softmax(z_i)
    q = (1 - eps) * (np.arange(K) == y[..., None]) + eps / K # q'_i(k) = (1-eps) [k = y_i] + eps/K
    w = dout * valid / max(cache["n_valid"], 1)              # d loss / d l_i: 1/N, 0 if ignored
    return (p - q) * w[..., None], None                      # d l_i / d z_i = p_i - q'_i
