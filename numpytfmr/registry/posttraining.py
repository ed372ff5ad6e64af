"""Registry entries for post-training: LoRA (000 §2.7) and preference losses (003 ch. 9)."""
import copy

import numpy as np

from . import Case, Mistake, OpSpec, output_with, wrong
from ..activations import sigmoid
from ..lora import lora_linear_forward, lora_linear_backward
from ..posttrain import reward_head_backward, reward_head_forward
from ..preference import (
    bradley_terry_loss_backward,
    bradley_terry_loss_forward,
    dpo_loss_backward,
    dpo_loss_forward,
    sequence_logprobs_backward,
    sequence_logprobs_forward,
)


def _normal(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _lora_cases(rng, dtype):
    def args(lead, d_in, d_out, r, bias):
        x = _normal(rng, lead + (d_in,), dtype)
        W = _normal(rng, (d_in, d_out), dtype, 0.5)
        A = _normal(rng, (d_in, r), dtype, 0.5)
        B = _normal(rng, (r, d_out), dtype, 0.5)   # non-zero: at B = 0 any dA would pass
        b = _normal(rng, (d_out,), dtype) if bias else None
        return (x, W, A, B, b)

    return [
        Case(args((2, 3), 7, 5, 3, True), {"alpha": 6.0}, "x (2, 3, 7), r 3, bias"),
        Case(args((5,), 7, 4, 2, False), {"alpha": 3.0}, "x (5, 7), r 2, no bias"),
        Case(args((2, 2, 3), 5, 7, 4, True), {"alpha": 8.0, "rank_stabilized": True},
             "x (2, 2, 3, 5), r 4, rsLoRA"),
        Case(args((7,), 7, 3, 1, True), {"alpha": 1.0}, "x (7,), r 1, single vector"),
        Case(args((3, 3), 7, 5, 2, True), {"alpha": 4.0, "dropout": 0.3, "rng": 11},
             "x (3, 3, 7), dropout 0.3 on the branch"),
        Case(args((2, 3), 7, 5, 3, False), {"alpha": 4.0, "dropout": 0.3, "train": False},
             "dropout 0.3, train=False"),
    ]


def _seqlogp_cases(rng, dtype):
    cases = []
    # (2, 6, 7): prompt of 2 tokens, second sequence padded after 4 tokens (label -100)
    logits = _normal(rng, (2, 6, 7), dtype)
    targets = rng.integers(0, 7, size=(2, 6))
    mask = np.zeros((2, 6), dtype=bool)
    mask[0, 2:] = True
    mask[1, 2:4] = True
    targets[1, 4:] = -100
    cases.append(Case((logits, targets, mask), {}, "logits (2, 6, 7), prompt + padding masked"))
    # (3, 4, 11) with a 0/1 float mask, one sequence fully masked
    logits = _normal(rng, (3, 4, 11), dtype)
    targets = rng.integers(0, 11, size=(3, 4))
    mask = np.array([[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0]], dtype=dtype)
    cases.append(Case((logits, targets, mask), {}, "logits (3, 4, 11), 0/1 mask, empty row"))
    # leading batch axes (2, 2, 3, 5), everything counted
    logits = _normal(rng, (2, 2, 3, 5), dtype)
    targets = rng.integers(0, 5, size=(2, 2, 3))
    mask = np.ones((2, 2, 3), dtype=bool)
    cases.append(Case((logits, targets, mask), {}, "logits (2, 2, 3, 5), all counted"))
    # large logits: forward only
    logits = _normal(rng, (2, 3, 7), dtype, 1e4)
    targets = rng.integers(0, 7, size=(2, 3))
    mask = np.array([[True, True, False], [False, True, True]])
    cases.append(Case((logits, targets, mask), {}, "logits of size 1e4", check=False))
    return cases


def _logps(rng, shape, dtype):
    """Four arrays of sequence log-probs (about -5 to -30), chosen/rejected, policy/reference."""
    rc = -rng.uniform(5.0, 30.0, size=shape)
    rr = -rng.uniform(5.0, 30.0, size=shape)
    pc = rc + rng.uniform(-3.0, 3.0, size=shape)
    pr = rr + rng.uniform(-3.0, 3.0, size=shape)
    return pc, pr, rc, rr


def _dpo_cases(rng, dtype):
    cast = lambda t: tuple(a.astype(dtype) for a in t)  # noqa: E731
    cases = []
    for loss_type in ("sigmoid", "hinge", "ipo"):
        pc, pr, rc, rr = _logps(rng, (6,), dtype)
        if loss_type == "hinge":
            # keep z = beta h away from the kink at z = 1: h in +-[0.5, 8] or [12, 20] (beta 0.1)
            h = rng.choice([-1.0, 1.0], size=6) * rng.uniform(0.5, 8.0, size=6)
            h[:2] = rng.uniform(12.0, 20.0, size=2)
            pc = rc + (pr - rr) + h
        cases.append(Case(cast((pc, pr, rc, rr)), {"beta": 0.1, "loss_type": loss_type},
                          f"{loss_type}, 6 pairs, beta 0.1"))
    pc, pr, rc, rr = _logps(rng, (5,), dtype)
    cases.append(Case(cast((pc, pr, rc, rr)), {"beta": 0.5, "label_smoothing": 0.1},
                      "sigmoid, label smoothing 0.1, beta 0.5"))
    pc, pr, rc, rr = _logps(rng, (2, 3), dtype)
    cases.append(Case(cast((pc, pr, rc, rr)), {"beta": 0.3, "loss_type": "ipo"},
                      "ipo, pairs (2, 3), beta 0.3"))
    pc, pr, rc, rr = _logps(rng, (7,), dtype)
    p = rng.integers(0, 2, size=7)                   # the notes' per-pair label p
    cases.append(Case(cast((pc, pr, rc, rr)), {"beta": 1.0,
                                               "label_smoothing": (1.0 - p).astype(dtype)},
                      "sigmoid, per-pair label p (eps = 1 - p), beta 1"))
    big = np.array([1e4, -1e4, 3e3, -2e3, 0.5])
    zeros = np.zeros(5)
    cases.append(Case(cast((big, zeros, zeros, zeros)), {"beta": 1.0, "label_smoothing": 0.2},
                      "margins up to +-1e4", check=False))
    return cases


def _bt_cases(rng, dtype):
    return [
        Case((_normal(rng, (7,), dtype), _normal(rng, (7,), dtype)), {}, "7 pairs"),
        Case((_normal(rng, (2, 3), dtype, 2.0), _normal(rng, (2, 3), dtype, 2.0)), {},
             "pairs (2, 3)"),
        Case((_normal(rng, (1,), dtype), _normal(rng, (1,), dtype)), {}, "one pair"),
        Case((np.array([1e4, -1e4, 5.0], dtype=dtype), np.zeros(3, dtype=dtype)), {},
             "reward gaps of +-1e4", check=False),
    ]


def _reward_head_cases(rng, dtype):
    def arr(*shape):
        return rng.standard_normal(shape).astype(dtype)
    cases = []
    for lead, pooling in (((), "last"), ((3,), "mean"), ((2, 3), "last"), ((2, 3), "mean")):
        mask = rng.random(lead + (5,)) < 0.6
        mask[..., 0] = True                       # at least one token per sequence
        cases.append(Case((arr(*lead, 5, 7), arr(7), arr()), {"mask": mask, "pooling": pooling},
                          f"h {lead + (5, 7)}, {pooling}"))
    cases.append(Case((arr(4, 7), arr(7), None), {"pooling": "mean"}, "no bias, no mask"))
    return cases


# ---------------------------------------------------------------------------------------
# Known wrong backwards (the catalogue the gradient checker names)
# ---------------------------------------------------------------------------------------

_LORA_NAMES = ("x", "W", "A", "B", "b")


def _lora_scaled(factor):
    """lora_linear_backward with the branch's scale s multiplied by factor(cache)."""
    def backward(dout, cache):
        cache = copy.copy(cache)
        cache["scale"] = cache["scale"] * factor(cache)
        return lora_linear_backward(dout, cache)
    return backward


def _lora_variant(dout, c, bug):
    dx, _, dA, dB, _ = lora_linear_backward(dout, c)
    s = c["scale"]
    if bug == "dA without s":
        dA = dA / s
    elif bug == "dB without s":
        dB = dB / s
    elif bug == "dx without the branch":
        dx = dout @ c["W"].T
    elif bug == "branch without dropout":
        if c["drop"]["mask"] is None:
            raise ValueError("no dropout")
        dx = dout @ c["W"].T + (s * (dout @ c["B"].T)) @ c["A"].T
    return dx, None, dA, dB, None


def _lw(bug, text, of):
    return wrong(bug, text, lambda dout, c: _lora_variant(dout, c, bug), _LORA_NAMES, of)


_LORA = (
    _lw("dA without s", "y = x W + b + s (x A) B with s = alpha/r: dA = s x^T (dout B^T), the "
        "scale s is missing", ("A",))
    + _lw("dB without s", "y = x W + b + s (x A) B with s = alpha/r: dB = s (x A)^T dout, the "
          "scale s is missing", ("B",))
    + _lw("dx without the branch", "x feeds the frozen path and the LoRA branch: dx = dout W^T "
          "+ s (dout B^T) A^T", ("x",))
    + _lw("branch without dropout", "the branch sees dropout(x), so its part of dx goes through "
          "the same mask: dx = dout W^T + dropout_backward(s (dout B^T) A^T)", ("x",))
    + wrong("alpha instead of alpha/r", "the branch is scaled by alpha/r, not alpha: divide by the "
            "rank r = A.shape[1]", _lora_scaled(lambda c: c["A"].shape[1]), _LORA_NAMES,
            ("x", "A", "B"))
    + wrong("rank taken as d_in", "r is the rank A.shape[1], not the input size A.shape[0]: "
            "the branch's scale is alpha/r",
            _lora_scaled(lambda c: c["A"].shape[1] / c["A"].shape[0]), _LORA_NAMES,
            ("x", "A", "B")))


def _seqlogp_variant(dout, c, bug):
    probs, y, mask = c["probs"], c["targets"], c["mask"]
    if bug == "mask ignored" and c.get("inputs") is not None:
        # the targets the mask leaves out are read as they are (the cache keeps 0 there)
        raw = np.asarray(c["inputs"][1])
        y = np.where(raw >= 0, raw, y)
    onehot = np.arange(probs.shape[-1]) == y[..., None]
    w = dout[..., None] * mask
    if bug == "mask ignored":
        w = dout[..., None] * np.ones(mask.shape)
    elif bug == "mean over tokens":
        w = w / np.maximum(np.sum(mask, axis=-1, keepdims=True), 1)
    if bug == "no softmax":
        return w[..., None] * onehot, None, None
    return w[..., None] * (onehot - probs), None, None


def _sl(bug, text):
    return wrong(bug, text, lambda dout, c: _seqlogp_variant(dout, c, bug),
                 ("logits", "targets", "mask"), ("logits",))


_SEQUENCE_LOGPROBS = (
    _sl("mask ignored", "tokens the mask leaves out (the prompt, padding) take no part in the "
        "sum: multiply each token's gradient by its mask")
    + _sl("mean over tokens", "the sequence's log-probability is a sum over its tokens, not a "
          "mean: no division by the number of tokens")
    + _sl("no softmax", "d log softmax(z)_y / dz = onehot(y) - softmax(z): the - softmax(z) "
          "term is missing"))


def _dpo_variant(dout, c, bug):
    z, h, beta, eps = c["z"], c["h"], c["beta"], c["eps"]
    g = dout / c["n"]
    kind = c["loss_type"]
    if bug in ("sigmoid(+margin)", "smoothing left out") and kind != "sigmoid":
        raise ValueError("sigmoid loss only")
    if bug == "smoothing left out" and np.all(np.asarray(eps) == 0):
        raise ValueError("no label smoothing")
    if kind == "sigmoid":
        if bug == "sigmoid(+margin)":
            dz = -(1 - eps) * sigmoid(z) + eps * sigmoid(-z)
        elif bug == "smoothing left out":
            dz = -sigmoid(-z)
        else:
            dz = -(1 - eps) * sigmoid(-z) + eps * sigmoid(z)
        dh = beta * dz * g
    elif kind == "hinge":
        if bug == "hinge indicator reversed":
            dh = -beta * (z > 1) * g
        else:
            dh = -beta * (z < 1) * g
    else:
        if bug == "ipo target 1/beta":
            dh = 2 * (h - 1 / beta) * g
        else:
            dh = 2 * (h - 1 / (2 * beta)) * g
    return dh, -dh, None, None


_DPO_NAMES = ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")


def _dpo(bug, text, of=("policy_chosen", "policy_rejected")):
    return wrong(bug, text, lambda dout, c: _dpo_variant(dout, c, bug), _DPO_NAMES, of)


_DPO = (
    _dpo("sigmoid(+margin)", "d/dz -log sigma(z) = -sigma(-z): the sign inside the sigmoid is "
         "flipped (sigmoid(+margin) where sigmoid(-margin) belongs)")
    + _dpo("smoothing left out", "with label smoothing eps the loss is -(1 - eps) log sigma(z) "
           "- eps log sigma(-z), so dz = -(1 - eps) sigma(-z) + eps sigma(z)")
    + _dpo("hinge indicator reversed", "d/dz max(0, 1 - z) = -[z < 1]: the gradient flows "
           "where the margin is not yet met")
    + _dpo("ipo target 1/beta", "IPO regresses h to 1/(2 beta): dh = 2 (h - 1/(2 beta)) / n"))


def _bt_variant(dout, c, bug):
    d = c["d"]
    if bug == "sigmoid(+d)":
        dd = -sigmoid(d) * dout / d.size
    else:
        dd = -sigmoid(-d) * dout / d.size
    return dd, -dd


_BRADLEY_TERRY = wrong("sigmoid(+d)", "d/dd -log sigma(d) = -sigma(-d): the sign inside the "
                       "sigmoid is flipped (sigmoid(+d) where sigmoid(-d) belongs)",
                       lambda dout, c: _bt_variant(dout, c, "sigmoid(+d)"),
                       ("r_chosen", "r_rejected"), ("r_chosen", "r_rejected"))


def _reward_head_variant(dr, c, bug):
    dh, dw, db = reward_head_backward(dr, c)
    if bug == "pooling weights left out":
        dpooled = dr[..., None] * c["w_r"]
        dh = np.broadcast_to(dpooled[..., None, :], dh.shape).copy()
    return dh, dw, db


_REWARD_HEAD = (
    Mistake("pooling weights left out", "h",
            lambda dr, c: _reward_head_variant(dr, c, "pooling weights left out")[0],
            "pooled = sum_t a_t h_t, so dh_t = a_t dpooled: each token gets its pooling "
            "weight's share (0 for tokens the pooling leaves out)"),)


# The options a forward written independently of the package may compute (the recogniser of
# checking/recognise.py runs the op with each, the usual ones first)

def _lora_options(inputs, out):
    """The usual alphas (2r, r, ...), then dropout on the branch with a fixed seed."""
    r = np.shape(inputs[2])[-1] if len(inputs) > 2 and inputs[2] is not None else 1
    plain = [{"alpha": float(a)} for a in dict.fromkeys((2 * r, r, 1, 8, 16, 32))]
    dropped = [{"alpha": float(a), "dropout": p, "rng": seed} for a in (2 * r, r)
               for p in (0.1, 0.05, 0.2, 0.3, 0.5) for seed in (0, 1)]
    return plain + dropped


def _dpo_options(inputs, out):
    plain = [{"beta": beta, "loss_type": kind} for kind in ("sigmoid", "ipo", "hinge")
             for beta in (0.1, 0.5, 1.0)]
    return plain + [{"beta": beta, "label_smoothing": eps} for eps in (0.1, 0.05, 0.2)
                    for beta in (0.1, 0.5, 1.0)]


def _reward_head_options(inputs, out):
    return [{"pooling": "last"}, {"pooling": "mean"}]


# ---------------------------------------------------------------------------------------
# Named wrong forwards (OpSpec.slips) and grading-only cases (OpSpec.extra_cases)
# ---------------------------------------------------------------------------------------

def _lora_slips(forward, args, kwargs):
    ref = output_with(forward, kwargs)
    r = args[2].shape[1] if isinstance(args[2], np.ndarray) and args[2].ndim == 2 else 1
    alpha = kwargs.get("alpha")
    if alpha is None or r <= 1:
        return []
    if kwargs.get("rank_stabilized"):
        return [("the LoRA branch is scaled by alpha/r; with rank_stabilized=True the scale "
                 "is alpha/sqrt(r)", lambda: ref(*args, rank_stabilized=False))]
    return [("the LoRA branch is scaled by alpha instead of alpha/r (r = A.shape[1] = "
             f"{r}): the update is (alpha/r) (x A) B", lambda: ref(*args, alpha=alpha * r)),
            ("the LoRA branch is scaled by alpha/sqrt(r) (rsLoRA) instead of alpha/r",
             lambda: ref(*args, rank_stabilized=True)),
            ("the LoRA branch is not scaled: the update is (alpha/r) (x A) B",
             lambda: ref(*args, alpha=float(r)))]


def _lora_extra(rng, dtype):
    """A LoRA layer with dropout on enough rows for the statistics of the student's mask."""
    def m(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(dtype)
    return [Case((m(60, 5), m(5, 4, scale=0.5), m(5, 2, scale=0.5), m(2, 4, scale=0.5), m(4)),
                 {"alpha": 2.0, "dropout": 0.25, "rng": 7},
                 "x (60, 5), r 2, dropout 0.25: statistics of the mask")]


def _dpo_slips(forward, args, kwargs):
    ref = output_with(forward, kwargs)
    pc, pr, rc, rr = args[:4]
    out = [("the sign of the loss is flipped: DPO minimises -log sigma(z) (the loss is the "
            "negative log-likelihood of the preference), you return +log sigma(z)",
            lambda: -ref(*args)),
           ("chosen and rejected are swapped: z = beta ((pc - rc) - (pr - rr)) has the wrong "
            "sign", lambda: ref(pr, pc, rr, rc))]
    if kwargs.get("beta", 0.1) != 1.0:
        out.append(("beta is left out of z = beta ((pc - rc) - (pr - rr))",
                    lambda: ref(*args, beta=1.0)))
    return out


def _bradley_terry_slips(forward, args, kwargs):
    ref = output_with(forward, kwargs)
    return [("the sign of the loss is flipped: the loss is -log sigma(r_c - r_r)",
             lambda: -ref(*args))]

OPS = [
    OpSpec("lora_linear", lora_linear_forward, lora_linear_backward, _lora_cases,
           "000 §2.7.2", mistakes=_LORA, options=_lora_options, tune=(("alpha", 1e-3, 1e3),),
           slips=_lora_slips, extra_cases=_lora_extra, random="dropout",
           depends=(("dropout", ("rng", "train")),)),
    OpSpec("sequence_logprobs", sequence_logprobs_forward, sequence_logprobs_backward,
           _seqlogp_cases, "003 eq. 9.1", mistakes=_SEQUENCE_LOGPROBS),
    OpSpec("dpo_loss", dpo_loss_forward, dpo_loss_backward, _dpo_cases, "003 §9.2, eq. 9.1",
           mistakes=_DPO, options=_dpo_options, tune=(("beta", 1e-3, 1e2),), slips=_dpo_slips),
    OpSpec("bradley_terry_loss", bradley_terry_loss_forward, bradley_terry_loss_backward,
           _bt_cases, "003 §9.1.2", mistakes=_BRADLEY_TERRY, slips=_bradley_terry_slips),
    OpSpec("reward_head", reward_head_forward, reward_head_backward, _reward_head_cases,
           "003 §9.1.2", mistakes=_REWARD_HEAD,
           options=_reward_head_options),
]
