"""Registry entries for post-training: LoRA (000 §2.7) and preference losses (003 ch. 9)."""
import numpy as np

from . import Case, OpSpec
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
        Case(args((5,), 7, 4, 2, False), {"alpha": 2.0}, "x (5, 7), r 2, no bias"),
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


OPS = [
    OpSpec("lora_linear", lora_linear_forward, lora_linear_backward, _lora_cases,
           "000 §2.7.2"),
    OpSpec("sequence_logprobs", sequence_logprobs_forward, sequence_logprobs_backward,
           _seqlogp_cases, "003 eq. 9.1"),
    OpSpec("dpo_loss", dpo_loss_forward, dpo_loss_backward, _dpo_cases, "003 §9.2, eq. 9.1"),
    OpSpec("bradley_terry_loss", bradley_terry_loss_forward, bradley_terry_loss_backward,
           _bt_cases, "003 §9.1.2"),
    OpSpec("reward_head", reward_head_forward, reward_head_backward, _reward_head_cases,
           "003 §9.1.2"),
]
