"""Preference optimisation: sequence log-probs, Bradley-Terry reward loss, DPO (003 ch. 9).

- :func:`sequence_logprobs_forward`: ``log pi(y | x)`` of a completion, the sum of its tokens'
  log-probabilities (the ``log pi_theta(y | x)`` of 003 eq. 9.1).
- :func:`bradley_terry_loss_forward`: the reward-model loss of 003 §9.1.2,
  ``-log P(y_c > y_r) = -log sigma(r_c - r_r)``.
- :func:`dpo_loss_forward`: DPO (003 §9.2, eq. 9.1) with the implicit reward
  ``r(x, y) = beta log(pi_theta(y|x) / pi_ref(y|x))``, its conservative (label-smoothed)
  form, and the hinge and IPO variants, defined as in TRL's ``DPOTrainer``.

Everything goes through :func:`log_sigmoid`, written so that it is finite, and its
gradient exact, for any finite margin (the notes' listing computes
``torch.log(torch.sigmoid(z))``, which is ``-inf`` once ``sigma(z)`` underflows).
"""
import numpy as np

from . import _validate as v
from .activations import log_softmax

__all__ = [
    "log_sigmoid",
    "sequence_logprobs_forward",
    "sequence_logprobs_backward",
    "bradley_terry_loss_forward",
    "bradley_terry_loss_backward",
    "dpo_loss_forward",
    "dpo_loss_backward",
    "dpo_metrics",
]

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo")


def log_sigmoid(x):
    """Plain stable ``log sigma(x) = -log(1 + exp(-x))``, finite for every finite ``x``.

        log sigma(x) = min(x, 0) - log(1 + exp(-|x|))

    (both branches of ``-log(1 + e^{-x})`` folded into one: ``exp`` only sees ``-|x| <= 0``,
    so it never overflows, and ``log1p`` keeps the tiny tail ``e^{-|x|}`` exact).
    """
    x = np.asarray(x)
    return np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))


def _sigmoid(x):
    """Stable ``sigma(x)`` with full relative precision in both tails.

        sigma(x) = 1 / (1 + e^{-x})  for x >= 0,     e^{x} / (1 + e^{x})  for x < 0
    """
    e = np.exp(-np.abs(x))          # in (0, 1]: never overflows
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def _as_bool_mask(mask, shape, where):
    """A completion mask as booleans: bool, or 0/1 numbers (True/1 = token counted)."""
    if isinstance(mask, np.matrix):
        mask = np.asarray(mask).view(np.ndarray)
    mask = np.asarray(mask)
    if mask.shape != tuple(shape):
        raise ValueError(f"{where}: mask has shape {mask.shape}; expected {tuple(shape)}, "
                         "the shape of targets")
    if mask.dtype == np.bool_:
        return mask
    if mask.dtype.kind not in "iuf":
        raise TypeError(f"{where}: mask has dtype {mask.dtype}; expected a boolean array "
                        "(or 0/1 numbers), True = completion token counted")
    if not np.all((mask == 0) | (mask == 1)):
        bad = mask[(mask != 0) & (mask != 1)].ravel()[0]
        raise ValueError(f"{where}: mask holds the value {bad}; expected only 0 and 1 "
                         "(True = completion token counted, False = prompt or padding)")
    return mask == 1


def sequence_logprobs_forward(logits, targets, mask):
    """Log-probability of each completion: ``log pi(y | x) = sum_t mask_t log softmax(z_t)[y_t]``.

    The ``log pi_theta(y|x)`` and ``log pi_ref(y|x)`` of DPO (003 eq. 9.1): the chain rule
    ``pi(y|x) = prod_t pi(y_t | x, y_<t)`` turned into a sum of logs, over the completion's
    tokens only (prompt and padding positions have ``mask = False``).

    logits: (..., T, V)   targets: (..., T) int ids   mask: (..., T) bool or 0/1
    -> logp: (...,)       (one number per sequence)

    Targets at masked-out positions are ignored and may hold any integer (e.g. the
    ``-100`` padding label); counted positions need ``0 <= target < V``.

    cache keys: "probs" (softmax(logits), (..., T, V)), "targets" (ids, masked positions
    set to 0), "mask" (bool, (..., T)).
    """
    where = "sequence_logprobs_forward"
    logits = v.float_array(logits, "logits", where)
    v.min_ndim(logits, 2, "logits", where, "(..., T, V)")
    targets = np.asarray(targets)
    if targets.dtype.kind not in "iu":
        raise TypeError(f"{where}: targets has dtype {targets.dtype}; expected an integer array "
                        "of token ids")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"{where}: targets has shape {targets.shape} but logits has shape "
                         f"{logits.shape}; expected targets of shape {logits.shape[:-1]} (..., T)")
    mask = _as_bool_mask(mask, targets.shape, where)
    V = logits.shape[-1]
    counted = targets[mask]
    if counted.size and (counted.min() < 0 or counted.max() >= V):
        raise ValueError(f"{where}: targets at counted (mask=True) positions have values in "
                         f"[{counted.min()}, {counted.max()}]; expected values in [0, {V})")
    t = np.where(mask, targets, 0)                       # safe ids: masked positions read id 0
    logp_all = log_softmax(logits, axis=-1)              # (..., T, V)
    picked = np.take_along_axis(logp_all, t[..., None], axis=-1)[..., 0]   # (..., T)
    logp = np.sum(np.where(mask, picked, 0.0).astype(logits.dtype, copy=False), axis=-1)
    cache = {"probs": np.exp(logp_all), "targets": t, "mask": mask}
    return logp, cache


def sequence_logprobs_backward(dout, cache):
    """Backward of :func:`sequence_logprobs_forward`.

    dout: (...,)  ->  (dlogits (..., T, V), None, None)
    """
    probs, t, mask = cache["probs"], cache["targets"], cache["mask"]
    dout = v.float_array(dout, "dout", "sequence_logprobs_backward").astype(probs.dtype, copy=False)
    if dout.shape != probs.shape[:-2]:
        raise ValueError(f"sequence_logprobs_backward: dout has shape {dout.shape}; expected "
                         f"{probs.shape[:-2]}, one value per sequence")
    # w_t = dout * mask_t: each counted position gets the sequence's upstream gradient.
    w = np.where(mask, dout[..., None], 0.0).astype(probs.dtype, copy=False)     # (..., T)
    onehot = (np.arange(probs.shape[-1]) == t[..., None]).astype(probs.dtype)    # (..., T, V)
    # d log softmax(z)[y] / dz_j = [j == y] - p_j
    dlogits = w[..., None] * (onehot - probs)
    return dlogits, None, None


def _same_shape(arrays, names, where):
    first, name0 = arrays[0], names[0]
    for a, n in zip(arrays[1:], names[1:]):
        if a.shape != first.shape:
            raise ValueError(f"{where}: {n} has shape {a.shape} but {name0} has shape "
                             f"{first.shape}; expected one value per pair, the same shape")
    if first.size == 0:
        raise ValueError(f"{where}: {name0} is empty; expected at least one pair")


def _scalar_dout(dout, dtype, where):
    dout = np.asarray(dout)
    if dout.shape != () or dout.dtype.kind not in "iuf":
        raise ValueError(f"{where}: dout is {v._describe(dout)}; expected a single number "
                         "(the loss is a scalar)")
    return dout.astype(dtype)


def bradley_terry_loss_forward(r_chosen, r_rejected):
    """Bradley-Terry reward-model loss (003 §9.1.2).

        P(y_c > y_r | x) = sigma(r_c - r_r),     loss = mean_i -log sigma(r_c,i - r_r,i)

    (the notes' ``P(i > j) = p_i / (p_i + p_j)`` with ``p = exp(r)``). Maximising the
    likelihood of the human preferences is minimising this loss.

    r_chosen, r_rejected: (...) one reward per pair, same shape -> loss: 0-d, input dtype.
    cache keys: "d" (r_c - r_r), "n" (number of pairs).
    """
    where = "bradley_terry_loss_forward"
    r_chosen = v.float_array(r_chosen, "r_chosen", where)
    r_rejected = v.float_array(r_rejected, "r_rejected", where)
    _same_shape((r_chosen, r_rejected), ("r_chosen", "r_rejected"), where)
    dtype = v.result_dtype(r_chosen, r_rejected)
    d = (r_chosen - r_rejected).astype(dtype, copy=False)
    loss = np.asarray(np.mean(-log_sigmoid(d)), dtype=dtype)
    return loss, {"d": d, "n": d.size}


def bradley_terry_loss_backward(dout, cache):
    """Backward of :func:`bradley_terry_loss_forward` -> ``(dr_chosen, dr_rejected)``."""
    d, n = cache["d"], cache["n"]
    dout = _scalar_dout(dout, d.dtype, "bradley_terry_loss_backward")
    # d(-log sigma(d))/dd = -sigma(-d);  the mean divides by n
    dd = -_sigmoid(-d) * (dout / n)
    return dd, -dd                                    # d = r_c - r_r


def dpo_loss_forward(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, beta=0.1,
                     label_smoothing=0.0, loss_type="sigmoid"):
    """DPO loss (003 §9.2, eq. 9.1) and its conservative, hinge and IPO forms.

    With the implicit rewards ``r_c = beta (pc - rc)``, ``r_r = beta (pr - rr)``
    (``pc = log pi_theta(y_c|x)``, ``rc = log pi_ref(y_c|x)``, ...; 003 §9.2):

        h = (pc - rc) - (pr - rr),     z = beta h = r_c - r_r
        "sigmoid": -(1 - eps) log sigma(z) - eps log sigma(-z)
        "hinge":   max(0, 1 - z)
        "ipo":     (h - 1/(2 beta))^2
        loss = mean over pairs

    ``eps = label_smoothing`` is the probability that a pair's label is flipped
    (conservative DPO); it is ``1 - p`` for the notes' preference label ``p``, and the notes'
    listing ``-[p log sigma(z) + (1-p) log sigma(-z)]`` is ``label_smoothing = 1 - p`` (pass
    an array, one value per pair, for per-pair labels). ``eps = 0`` is eq. 9.1. TRL uses
    ``eps`` in [0, 0.5); any value in [0, 1] is accepted here. Hinge (SLiC) and IPO take no
    label smoothing: TRL ignores it for them with a warning, so a non-zero value is refused.

    policy_chosen, policy_rejected, ref_chosen, ref_rejected: (...) sequence log-probs, one
    per pair, same shape (e.g. from :func:`sequence_logprobs_forward`) -> loss: 0-d.
    The reference log-probs are constants: the backward returns None for them.

    cache keys: "chosen_rewards" (r_c), "rejected_rewards" (r_r), "margins" (r_c - r_r),
    "accuracy" (fraction of pairs with r_c > r_r), "z", "h", "beta", "eps", "loss_type",
    "n" (number of pairs). See :func:`dpo_metrics`.
    """
    where = "dpo_loss_forward"
    names = ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")
    arrays = [v.float_array(a, n, where) for a, n in
              zip((policy_chosen, policy_rejected, ref_chosen, ref_rejected), names)]
    _same_shape(arrays, names, where)
    beta = v.number(beta, "beta", where, low=0.0, low_open=True)
    v.choice(loss_type, "loss_type", where, DPO_LOSS_TYPES)
    dtype = v.result_dtype(*arrays)
    pc, pr, rc, rr = (a.astype(dtype, copy=False) for a in arrays)
    eps = _label_smoothing(label_smoothing, pc.shape, dtype, loss_type, where)

    chosen_rewards = beta * (pc - rc)              # r_c = beta log(pi_theta / pi_ref)(y_c)
    rejected_rewards = beta * (pr - rr)            # r_r
    h = (pc - rc) - (pr - rr)                      # difference of log-ratios
    z = beta * h
    if loss_type == "sigmoid":
        losses = -(1.0 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z)
    elif loss_type == "hinge":
        losses = np.maximum(1.0 - z, 0.0)
    else:  # "ipo"
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    loss = np.asarray(np.mean(losses), dtype=dtype)
    margins = chosen_rewards - rejected_rewards
    cache = {"chosen_rewards": chosen_rewards, "rejected_rewards": rejected_rewards,
             "margins": margins, "accuracy": float(np.mean(chosen_rewards > rejected_rewards)),
             "z": z, "h": h, "beta": beta, "eps": eps, "loss_type": loss_type, "n": z.size}
    return loss, cache


def _label_smoothing(eps, shape, dtype, loss_type, where):
    """``label_smoothing`` as a float in [0, 1], or a float array of that shape."""
    if isinstance(eps, (list, tuple, np.ndarray)):
        eps = v.float_array(eps, "label_smoothing", where)
        if eps.shape != tuple(shape):
            raise ValueError(f"{where}: label_smoothing has shape {eps.shape}; expected a number "
                             f"or one value per pair, shape {tuple(shape)}")
        if not np.all((eps >= 0) & (eps <= 1)):
            raise ValueError(f"{where}: label_smoothing has values in [{eps.min()}, {eps.max()}]; "
                             "expected values in [0, 1]")
        nonzero = bool(np.any(eps != 0))
        eps = eps.astype(dtype, copy=False)
    else:
        eps = v.number(eps, "label_smoothing", where, low=0.0, high=1.0)
        nonzero = eps != 0.0
    if nonzero and loss_type != "sigmoid":
        raise ValueError(f"{where}: label_smoothing is non-zero but loss_type is {loss_type!r}; "
                         "label smoothing is defined for loss_type 'sigmoid' only (conservative "
                         "DPO); expected label_smoothing=0.0")
    return eps


def dpo_loss_backward(dout, cache):
    """Backward of :func:`dpo_loss_forward`.

    -> ``(d_policy_chosen, d_policy_rejected, None, None)`` (the reference is frozen).
    """
    z, h, beta, eps, n = cache["z"], cache["h"], cache["beta"], cache["eps"], cache["n"]
    dout = _scalar_dout(dout, z.dtype, "dpo_loss_backward")
    g = dout / n                                         # d mean / d loss_i
    if cache["loss_type"] == "sigmoid":
        # d/dz[-log sigma(z)] = -sigma(-z),  d/dz[-log sigma(-z)] = sigma(z);  dz/dh = beta
        dh = (-(1.0 - eps) * _sigmoid(-z) + eps * _sigmoid(z)) * (beta * g)
    elif cache["loss_type"] == "hinge":
        # d/dz max(0, 1 - z) = -1 where z < 1, else 0 (0 at the kink, as ReLU'(0) = 0)
        dh = np.where(z < 1.0, -beta, 0.0).astype(z.dtype, copy=False) * g
    else:  # "ipo"
        # d/dh (h - 1/(2 beta))^2 = 2 (h - 1/(2 beta))
        dh = 2.0 * (h - 1.0 / (2.0 * beta)) * g
    dh = dh.astype(z.dtype, copy=False)
    return dh, -dh, None, None                           # h = pc - pr - (rc - rr)


def dpo_metrics(cache):
    """The usual DPO training metrics from a :func:`dpo_loss_forward` cache, as floats.

    ``rewards/chosen`` and ``rewards/rejected`` (means of ``beta log(pi_theta/pi_ref)``),
    ``rewards/margins`` (mean ``r_c - r_r``), ``rewards/accuracies`` (fraction of pairs with
    ``r_c > r_r``) -- the names TRL logs.
    """
    return {
        "rewards/chosen": float(np.mean(cache["chosen_rewards"])),
        "rewards/rejected": float(np.mean(cache["rejected_rewards"])),
        "rewards/margins": float(np.mean(cache["margins"])),
        "rewards/accuracies": cache["accuracy"],
    }
