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

from .activations import log_softmax, sigmoid
from .contract import backward_of, float_array, int_array, one_of, op, positive, probability

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


# ---------------------------------------------------------------------------------------
# validators of the arguments these ops alone take

def token_targets(targets, name, where, args):
    """Integer token ids of shape ``logits.shape[:-1]`` (their range is checked with the mask)."""
    targets = int_array(targets, name, where, low=-np.inf)
    if targets.shape != args["logits"].shape[:-1]:
        raise ValueError(f"{where}: {name} has shape {targets.shape} but logits has shape "
                         f"{args['logits'].shape}; expected {name} of shape "
                         f"{args['logits'].shape[:-1]} (..., T)")
    return targets


def completion_mask(mask, name, where, args):
    """The completion mask as booleans (bool, or 0/1 numbers; True = token counted), of the
    targets' shape; the targets it counts must be token ids in ``[0, V)``."""
    targets, V = args["targets"], args["logits"].shape[-1]
    mask = np.asarray(mask)
    if mask.shape != targets.shape:
        raise ValueError(f"{where}: {name} has shape {mask.shape}; expected {targets.shape}, "
                         "the shape of targets")
    if mask.dtype != np.bool_:
        if mask.dtype.kind not in "iuf":
            raise TypeError(f"{where}: {name} has dtype {mask.dtype}; expected a boolean array "
                            "(or 0/1 numbers), True = completion token counted")
        bad = mask[(mask != 0) & (mask != 1)]
        if bad.size:
            raise ValueError(f"{where}: {name} holds the value {bad[0]}; expected only 0 and 1 "
                             "(True = completion token counted, False = prompt or padding)")
        mask = mask == 1
    counted = targets[mask]
    if counted.size and (counted.min() < 0 or counted.max() >= V):
        raise ValueError(f"{where}: targets at counted ({name}=True) positions have values in "
                         f"[{counted.min()}, {counted.max()}]; expected values in [0, {V})")
    return mask


def pairs(v, name, where, args):
    """One value per preference pair: at least one pair."""
    if v.size == 0:
        raise ValueError(f"{where}: {name} is empty; expected at least one pair")
    return v


def pairs_like(first):
    """A validator: one value per pair, the same shape as the argument ``first``."""
    def check(v, name, where, args):
        if v.shape != args[first].shape:
            raise ValueError(f"{where}: {name} has shape {v.shape} but {first} has shape "
                             f"{args[first].shape}; expected one value per pair, the same shape")
        return v
    check.__doc__ = f"one value per pair, the shape of {first}"
    return check


def label_smoothing_of_pairs(eps, name, where, args):
    """A number in [0, 1], or one per pair (an array of policy_chosen's shape); non-zero only
    for loss_type "sigmoid" (validated before it). An array is cast to the pairs' dtype."""
    pc = args["policy_chosen"]
    if isinstance(eps, (list, tuple, np.ndarray)):
        eps = float_array(eps, name, where)
        if eps.shape != pc.shape:
            raise ValueError(f"{where}: {name} has shape {eps.shape}; expected a number or one "
                             f"value per pair, shape {pc.shape}")
        if not np.all((eps >= 0) & (eps <= 1)):
            raise ValueError(f"{where}: {name} has values in [{eps.min()}, {eps.max()}]; "
                             "expected values in [0, 1]")
        eps = eps.astype(pc.dtype, copy=False)
    else:
        eps = probability(eps, name, where)
    if np.any(eps != 0) and args["loss_type"] != "sigmoid":
        raise ValueError(f"{where}: {name} is non-zero but loss_type is {args['loss_type']!r}; "
                         "label smoothing is defined for loss_type 'sigmoid' only (conservative "
                         "DPO); expected label_smoothing=0.0")
    return eps


# ---------------------------------------------------------------------------------------
# sequence log-probabilities

@op("logits: (..., T, V)", "targets: any (..., T)", "mask: any (..., T)",
    targets=token_targets, mask=completion_mask)
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
    y = np.where(mask, targets, 0)                           # masked positions read id 0
    logp = log_softmax(logits, axis=-1)                      # log pi(v | x, y_<t), every v
    logp_y = np.take_along_axis(logp, y[..., None], axis=-1)[..., 0]   # log pi(y_t | x, y_<t)
    out = (logp_y * mask).sum(-1)                            # sum over the completion's tokens
    with np.errstate(under="ignore"):
        probs = np.exp(logp)                                 # pi(v | x, y_<t), for the backward
    return out, {"probs": probs, "targets": y, "mask": mask}


@backward_of(sequence_logprobs_forward)
def sequence_logprobs_backward(dout, cache):
    """Gradient of :func:`sequence_logprobs_forward`.

        dlogits_t = dout * mask_t * (onehot(y_t) - softmax(z_t))

    dout: (...,)  ->  (dlogits (..., T, V), None, None)
    """
    probs, y, mask = cache["probs"], cache["targets"], cache["mask"]
    onehot = np.arange(probs.shape[-1]) == y[..., None]     # [v = y_t]
    w = dout[..., None] * mask                               # counted tokens get their sequence's dout
    return w[..., None] * (onehot - probs), None, None       # d log softmax(z)_y / dz_v = [v=y] - p_v


# ---------------------------------------------------------------------------------------
# Bradley-Terry

@op("r_chosen: (...)", "r_rejected: (...)", r_chosen=pairs, r_rejected=pairs_like("r_chosen"))
def bradley_terry_loss_forward(r_chosen, r_rejected):
    """Bradley-Terry reward-model loss (003 §9.1.2).

        P(y_c > y_r | x) = sigma(r_c - r_r),     loss = mean_i -log sigma(r_c,i - r_r,i)

    (the notes' ``P(i > j) = p_i / (p_i + p_j)`` with ``p = exp(r)``). Maximising the
    likelihood of the human preferences is minimising this loss.

    r_chosen, r_rejected: (...) one reward per pair, same shape -> loss: a scalar, input dtype.
    cache keys: "d" (r_c - r_r).
    """
    d = r_chosen - r_rejected                       # r_c - r_r
    return np.mean(-log_sigmoid(d)), {"d": d}       # mean -log sigma(r_c - r_r)


@backward_of(bradley_terry_loss_forward)
def bradley_terry_loss_backward(dout, cache):
    """Gradient of :func:`bradley_terry_loss_forward` -> ``(dr_chosen, dr_rejected)``.

        d(-log sigma(d))/dd = -sigma(-d),   averaged over the n pairs
    """
    d = cache["d"]
    dd = -sigmoid(-d) * dout / d.size               # d/dd [-log sigma(d)] = -sigma(-d); mean: 1/n
    return dd, -dd                                  # d = r_c - r_r


# ---------------------------------------------------------------------------------------
# DPO

@op("policy_chosen: (...)", "policy_rejected: (...)", "ref_chosen: (...)", "ref_rejected: (...)",
    policy_chosen=pairs, policy_rejected=pairs_like("policy_chosen"),
    ref_chosen=pairs_like("policy_chosen"), ref_rejected=pairs_like("policy_chosen"),
    beta=positive, loss_type=one_of(*DPO_LOSS_TYPES), label_smoothing=label_smoothing_of_pairs)
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
    ``eps`` in `[0, 0.5)`; any value in `[0, 1]` is accepted here. Hinge (SLiC) and IPO take no
    label smoothing: TRL ignores it for them with a warning, so a non-zero value is refused.

    policy_chosen, policy_rejected, ref_chosen, ref_rejected: (...) sequence log-probs, one
    per pair, same shape (e.g. from :func:`sequence_logprobs_forward`) -> loss: a scalar.
    The reference log-probs are constants: the backward returns None for them.

    cache keys: "chosen_rewards" (`r_c`), "rejected_rewards" (`r_r`), "margins" (`r_c - r_r`),
    "accuracy" (fraction of pairs with `r_c > r_r`), "z", "h", "beta", "eps", "loss_type",
    "n" (number of pairs). See :func:`dpo_metrics`.
    """
    eps = label_smoothing
    chosen_rewards = beta * (policy_chosen - ref_chosen)     # r_c = beta log(pi_theta/pi_ref)(y_c)
    rejected_rewards = beta * (policy_rejected - ref_rejected)   # r_r
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)   # difference of log-ratios
    z = beta * h                                             # z = r_c - r_r   (003 eq. 9.1)
    if loss_type == "sigmoid":
        losses = -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z)   # conservative DPO
    elif loss_type == "hinge":
        losses = np.maximum(0, 1 - z)                        # SLiC
    else:
        losses = (h - 1 / (2 * beta)) ** 2                   # IPO
    margins = chosen_rewards - rejected_rewards
    cache = {"chosen_rewards": chosen_rewards, "rejected_rewards": rejected_rewards,
             "margins": margins, "accuracy": float(np.mean(margins > 0)),
             "z": z, "h": h, "beta": beta, "eps": eps, "loss_type": loss_type, "n": z.size}
    return losses.mean(), cache                              # mean over pairs


@backward_of(dpo_loss_forward)
def dpo_loss_backward(dout, cache):
    """Gradient of :func:`dpo_loss_forward`.

        sigmoid: dh = beta (-(1 - eps) sigma(-z) + eps sigma(z))
        hinge:   dh = -beta [z < 1]
        ipo:     dh = 2 (h - 1/(2 beta))
        (each times dout / n), and h = pc - pr - (rc - rr)

    -> ``(d_policy_chosen, d_policy_rejected, None, None)`` (the reference is frozen).
    """
    z, h, beta, eps = cache["z"], cache["h"], cache["beta"], cache["eps"]
    g = dout / cache["n"]                                    # d mean / d loss_i
    if cache["loss_type"] == "sigmoid":
        dz = -(1 - eps) * sigmoid(-z) + eps * sigmoid(z)     # d/dz -log sigma(z) = -sigma(-z)
        dh = beta * dz * g                                   # dz/dh = beta
    elif cache["loss_type"] == "hinge":
        dh = -beta * (z < 1) * g                             # d/dz max(0, 1 - z) = -[z < 1]
    else:
        dh = 2 * (h - 1 / (2 * beta)) * g                    # d/dh (h - 1/(2 beta))^2
    return dh, -dh, None, None                               # h = pc - pr - (rc - rr)


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
