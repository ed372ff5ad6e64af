"""LoRA: low-rank adaptation of a frozen linear layer (000 §2.7).

The frozen weight ``W`` (d x k) gets a trainable low-rank update (000 §2.7.1-2.7.2)

    W' = W + Delta W,   Delta W = s A B,   A (d x r),   B (r x k),   r << min(d, k)

with the scaling ``s = alpha / r`` of the notes' "optional scaling" (000 §2.7.2), or
``s = alpha / sqrt(r)`` for rank-stabilised LoRA (rsLoRA, Kalajdzievski 2023, PEFT's
``use_rslora=True``). Row-vector convention, as everywhere in numpytfmr: ``y = x W``, so the
notes' ``h W' = h W + (alpha/r) h A B`` is read literally. (The notes' PyTorch listing stores
the transposes, ``A (r, d_in)`` and ``B (d_out, r)``, because ``nn.Linear`` computes ``x W^T``.)

Only ``A`` and ``B`` are trained; ``W`` and the bias ``b`` are frozen, so the backward returns
``None`` for them. ``B`` starts at zero, so the adapted layer starts as the base layer.
"""
import math

import numpy as np

from .contract import (FLOAT_DTYPES, backward_of, count, flag, float_array, fraction, generator,
                       one_of, op, positive)
from .dropout import dropout_backward, dropout_forward, generator_when_dropping

__all__ = [
    "lora_scale",
    "lora_linear_forward",
    "lora_linear_backward",
    "lora_init",
    "lora_merge",
    "lora_unmerge",
    "lora_parameter_count",
]


def lora_scale(alpha, r, *, rank_stabilized=False):
    """The LoRA scaling ``s``: ``alpha / r`` (000 §2.7.2), or ``alpha / sqrt(r)`` for rsLoRA.

    rsLoRA keeps the update's size independent of ``r`` as ``r`` grows, so a larger rank
    keeps learning instead of being damped by ``1/r``. Returns a Python float (so it never
    upcasts a float32 array).
    """
    alpha = positive(alpha, "alpha", "lora_scale")
    r = count(r, "r", "lora_scale")
    return alpha / math.sqrt(r) if rank_stabilized else alpha / r


@op("x: (..., d_in)", "W: (d_in, d_out)", "A: (d_in, r)", "B: (r, d_out)", "b: (d_out,)?",
    alpha=positive, rank_stabilized=flag, dropout=fraction, train=flag,
    rng=generator_when_dropping("dropout"))
def lora_linear_forward(x, W, A, B, b=None, *, alpha, rank_stabilized=False, dropout=0.0,
                        rng=None, train=True):
    """LoRA-adapted linear layer (000 §2.7.2, "Forward Pass Computation").

        y = x W + b + s (drop(x) A) B,    s = alpha / r   (alpha / sqrt(r) if rank_stabilized)

    The low-rank path is computed as ``(x A) B`` -- two thin matmuls, never the d x k product
    ``A B``. Dropout (inverted: kept entries scaled by ``1/(1-p)``) acts on the input of the
    LoRA branch only, as in PEFT's ``lora_dropout``; the frozen path always sees the plain ``x``.
    With ``B = 0`` the branch adds exact zeros, so the output equals ``x W + b`` bit for bit.

    x: (..., d_in)   W: (d_in, d_out) frozen   A: (d_in, r)   B: (r, d_out)
    b: (d_out,) frozen, or None   ->   y: (..., d_out)

    alpha: the LoRA alpha (> 0); rank_stabilized: use ``alpha / sqrt(r)``;
    dropout: drop probability p in [0, 1) of the LoRA branch's input; rng: a
    ``np.random.Generator``, required when ``dropout > 0`` and ``train``; train: False
    turns dropout off.

    cache keys: "W", "A", "B", "xd" (the dropped input of the branch), "u" (= xd A,
    (..., r)), "drop" (the cache of :func:`dropout_forward` on the branch: its "mask" is None
    without dropout), "scale" (s).
    """
    s = lora_scale(alpha, A.shape[1], rank_stabilized=rank_stabilized)   # s = alpha / r
    xd, drop = dropout_forward(x, p=dropout, rng=rng, train=train)   # drop(x), the branch's input
    u = xd @ A                                       # u = drop(x) A: x projected on r directions
    y = x @ W if b is None else x @ W + b            # frozen path  x W + b
    y = y + s * (u @ B)                              #   + s (x A) B   (B = 0 adds exact zeros)
    return y, {"W": W, "A": A, "B": B, "xd": xd, "u": u, "drop": drop, "scale": s}


@backward_of(lora_linear_forward)
def lora_linear_backward(dout, cache):
    """Gradient of :func:`lora_linear_forward`; the leading (batch) axes are summed for dA, dB.

        du = s dy B^T,   dB = s u^T dy,   dA = drop(x)^T du,   dx = dy W^T + drop'(du A^T)

    dout: (..., d_out)  ->  (dx (..., d_in), None, dA (d_in, r), dB (r, d_out), None);
    ``W`` and ``b`` are frozen, so their gradients are None.
    """
    W, A, B, s = cache["W"], cache["A"], cache["B"], cache["scale"]
    r = A.shape[1]
    # rows (N, d_out), (N, r), (N, d_in): the leading axes flattened for the weight gradients
    dy = dout.reshape(-1, B.shape[1])
    u, xd = cache["u"].reshape(-1, r), cache["xd"].reshape(-1, A.shape[0])
    du = s * (dout @ B.T)                            # y = s u B:  du = s dy B^T     (..., r)
    dB = s * (u.T @ dy)                              #             dB = s u^T dy
    dA = xd.T @ du.reshape(-1, r)                    # u = xd A:   dA = xd^T du
    dxd = du @ A.T                                   #             dxd = du A^T    (..., d_in)
    dx = dout @ W.T + dropout_backward(dxd, cache["drop"])  # frozen path dy W^T, plus the branch
    return dx, None, dA, dB, None


def lora_init(d_in, d_out, r, *, rng, init="kaiming_uniform", dtype=np.float64):
    """Initial LoRA factors ``(A, B)``: ``A`` random, ``B = 0``, so ``Delta W = 0`` (000 §2.7.2).

    A: (d_in, r), B: (r, d_out).

    init="kaiming_uniform" (default): ``A ~ U(-1/sqrt(d_in), 1/sqrt(d_in))``. This is PEFT's
        default (``init_lora_weights=True``), taken from Microsoft's reference implementation:
        ``kaiming_uniform_(lora_A, a=sqrt(5))`` on a weight with fan-in ``d_in``, whose bound is
        ``sqrt(2/(1+5)) * sqrt(3/d_in) = 1/sqrt(d_in)``; the notes' listing (000 §2.7.2, line 18)
        uses the same call.
    init="gaussian": ``A ~ N(0, (1/r)^2)``, PEFT's ``init_lora_weights="gaussian"`` (the
        diffusers default). The LoRA paper (Hu et al. 2021, §4.1) says only "a random Gaussian
        initialization for A and zero for B".

    Either way ``B = 0``: the gradient reaches ``B`` first (`dB = s (xA)^T dy` is non-zero),
    while ``dA = s x^T dy B^T`` is zero at the first step.
    """
    where = "lora_init"
    d_in, d_out, r = (count(v, n, where) for v, n in ((d_in, "d_in"), (d_out, "d_out"), (r, "r")))
    rng = generator(rng, "rng", where)
    one_of("kaiming_uniform", "gaussian")(init, "init", where)
    if np.dtype(dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{where}: dtype is {dtype!r}; expected np.float32 or np.float64")
    if init == "kaiming_uniform":
        bound = 1.0 / math.sqrt(d_in)
        A = rng.uniform(-bound, bound, size=(d_in, r))
    else:
        A = rng.normal(0.0, 1.0 / r, size=(d_in, r))
    B = np.zeros((r, d_out))
    return A.astype(dtype), B.astype(dtype)


def _factors(W, A, B, where, W_name="W"):
    """``W (d, k)``, ``A (d, r)``, ``B (r, k)`` as float arrays, checked; and ``r``."""
    W, A, B = (float_array(M, n, where) for M, n in ((W, W_name), (A, "A"), (B, "B")))
    for name, M in ((W_name, W), ("A", A), ("B", B)):
        if M.ndim != 2:
            raise ValueError(f"{where}: {name} has shape {M.shape}; expected a matrix (2 axes)")
    d, k = W.shape
    r = A.shape[1]
    if A.shape[0] != d or r < 1:
        raise ValueError(f"{where}: A has shape {A.shape} but {W_name} has shape {W.shape}; "
                         f"expected A of shape ({d}, r) with r >= 1 (A.shape[0] = d_in)")
    if B.shape != (r, k):
        raise ValueError(f"{where}: B has shape {B.shape} but A has shape {A.shape} and {W_name} "
                         f"has shape {W.shape}; expected B of shape ({r}, {k}) = (r, d_out)")
    return W, A, B, r


def lora_merge(W, A, B, *, alpha, rank_stabilized=False):
    """Fold the adapter into the weight: ``W' = W + s A B`` (000 §2.7.1, §2.7.2).

    After merging, ``x W' + b`` gives the adapted layer's output with no extra latency.
    W: (d_in, d_out), A: (d_in, r), B: (r, d_out) -> W': (d_in, d_out). ``W`` is not modified.
    """
    W, A, B, r = _factors(W, A, B, "lora_merge")
    s = lora_scale(positive(alpha, "alpha", "lora_merge"), r, rank_stabilized=rank_stabilized)
    return W + s * (A @ B)                           # W' = W + s A B


def lora_unmerge(W_merged, A, B, *, alpha, rank_stabilized=False):
    """Undo :func:`lora_merge`: ``W = W' - s A B`` (exact up to rounding).

    Lets one base weight serve several adapters: merge one, unmerge it, merge another.
    W_merged: (d_in, d_out), A: (d_in, r), B: (r, d_out) -> W: (d_in, d_out).
    """
    W_merged, A, B, r = _factors(W_merged, A, B, "lora_unmerge", W_name="W_merged")
    s = lora_scale(positive(alpha, "alpha", "lora_unmerge"), r, rank_stabilized=rank_stabilized)
    return W_merged - s * (A @ B)                    # W = W' - s A B


def lora_parameter_count(d_in, d_out, r):
    """Trainable parameters of LoRA vs. full fine-tuning of one d x k weight (000 §2.7.2).

        lora = d r + r k   (A and B),   full = d k,   fraction = lora / full

    Returns ``{"lora": int, "full": int, "fraction": float}``. E.g. d = k = 4096, r = 8:
    65,536 trainable parameters instead of 16,777,216, a fraction of 1/256.
    """
    where = "lora_parameter_count"
    d, k, r = (count(v, n, where) for v, n in ((d_in, "d_in"), (d_out, "d_out"), (r, "r")))
    lora = d * r + r * k
    full = d * k
    return {"lora": lora, "full": full, "fraction": lora / full}
