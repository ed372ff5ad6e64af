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

from . import _validate as v

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
    return _scale(alpha, v.positive_int(r, "r", "lora_scale"), rank_stabilized, "lora_scale")


def _scale(alpha, r, rank_stabilized, where):
    alpha = v.number(alpha, "alpha", where, low=0.0, low_open=True)
    return alpha / math.sqrt(r) if rank_stabilized else alpha / r


def _check_factors(W, A, B, where, W_name="W"):
    """Check ``W (d, k)``, ``A (d, r)``, ``B (r, k)``; return ``r``."""
    for name, M in ((W_name, W), ("A", A), ("B", B)):
        if M.ndim != 2:
            raise ValueError(f"{where}: {name} has shape {M.shape}; expected a matrix (2 axes)")
    d, k = W.shape
    if A.shape[0] != d:
        raise ValueError(f"{where}: A has shape {A.shape} but {W_name} has shape {W.shape}; "
                         f"expected A of shape ({d}, r) (A.shape[0] = d_in)")
    r = A.shape[1]
    if r < 1:
        raise ValueError(f"{where}: A has shape {A.shape}; expected a rank r = A.shape[1] >= 1")
    if B.shape != (r, k):
        raise ValueError(f"{where}: B has shape {B.shape} but A has shape {A.shape} and {W_name} "
                         f"has shape {W.shape}; expected B of shape ({r}, {k}) = (r, d_out)")
    return r


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

    cache keys: "x", "W", "A", "B", "xd" (the dropped input of the branch), "u" (= xd A,
    (..., r)), "mask" (kept/(1-p) as x.dtype, or None), "scale" (s), "has_bias".
    """
    where = "lora_linear_forward"
    x = v.float_array(x, "x", where)
    W = v.float_array(W, "W", where)
    A = v.float_array(A, "A", where)
    B = v.float_array(B, "B", where)
    b = v.optional_float_array(b, "b", where)
    v.min_ndim(x, 1, "x", where, "(..., d_in)")
    r = _check_factors(W, A, B, where)
    if x.shape[-1] != W.shape[0]:
        raise ValueError(f"{where}: x has shape {x.shape} but W has shape {W.shape}; "
                         f"the last axis of x must equal W.shape[0] = d_in = {W.shape[0]}")
    if b is not None and b.shape != (W.shape[1],):
        raise ValueError(f"{where}: b has shape {b.shape}; expected ({W.shape[1]},) = (d_out,)")
    s = _scale(alpha, r, rank_stabilized, where)
    p = v.number(dropout, "dropout", where, low=0.0, high=1.0, high_open=True)
    dtype = v.result_dtype(x, W, A, B, b)
    x, W, A, B = (M.astype(dtype, copy=False) for M in (x, W, A, B))

    # Frozen path, exactly as a plain linear layer computes it.
    y = x @ W
    if b is not None:
        y = y + b.astype(dtype, copy=False)

    # LoRA branch: inverted dropout on its input only.
    mask = None
    xd = x
    if train and p > 0.0:
        rng = v.rng_arg(rng, where)
        keep = rng.random(x.shape) >= p
        mask = keep.astype(dtype) * (1.0 / (1.0 - p))
        xd = x * mask
    u = xd @ A                           # (..., r): the input projected onto the r directions
    y = y + s * (u @ B)                  # (..., d_out): B = 0 adds exact zeros
    cache = {"x": x, "W": W, "A": A, "B": B, "xd": xd, "u": u, "mask": mask, "scale": s,
             "has_bias": b is not None}
    return y, cache


def lora_linear_backward(dout, cache):
    """Backward of :func:`lora_linear_forward`.

    dout: (..., d_out)  ->  (dx (..., d_in), None, dA (d_in, r), dB (r, d_out), None);
    ``W`` and ``b`` are frozen, so their gradients are None.
    """
    x, W, A, B = cache["x"], cache["W"], cache["A"], cache["B"]
    xd, u, mask, s = cache["xd"], cache["u"], cache["mask"], cache["scale"]
    dout = v.float_array(dout, "dout", "lora_linear_backward").astype(x.dtype, copy=False)
    expected = x.shape[:-1] + (W.shape[1],)
    if dout.shape != expected:
        raise ValueError(f"lora_linear_backward: dout has shape {dout.shape}; expected {expected}, "
                         "the shape of the forward's output")
    r = A.shape[1]
    # Flatten the leading batch axes so the weight gradients are single matmuls.
    dout2 = dout.reshape(-1, W.shape[1])              # (N, d_out)
    u2 = u.reshape(-1, r)                             # (N, r)
    xd2 = xd.reshape(-1, W.shape[0])                  # (N, d_in)

    dB = s * (u2.T @ dout2)                           # dB = s u^T dy        (y = s u B)
    du = s * (dout @ B.T)                             # du = s dy B^T        (..., r)
    dA = xd2.T @ du.reshape(-1, r)                    # dA = xd^T du         (u = xd A)
    dxd = du @ A.T                                    # dxd = du A^T         (..., d_in)
    if mask is not None:
        dxd = dxd * mask                              # dx = dxd * mask      (xd = x * mask)
    dx = dout @ W.T + dxd                             # frozen path dy W^T, plus the branch
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

    Either way ``B = 0``: the gradient reaches ``B`` first (dB = s (xA)^T dy is non-zero),
    while ``dA = s x^T dy B^T`` is zero at the first step.
    """
    where = "lora_init"
    d_in = v.positive_int(d_in, "d_in", where)
    d_out = v.positive_int(d_out, "d_out", where)
    r = v.positive_int(r, "r", where)
    rng = v.rng_arg(rng, where)
    v.choice(init, "init", where, ("kaiming_uniform", "gaussian"))
    if np.dtype(dtype) not in v.FLOAT_DTYPES:
        raise TypeError(f"{where}: dtype is {dtype!r}; expected np.float32 or np.float64")
    if init == "kaiming_uniform":
        bound = 1.0 / math.sqrt(d_in)
        A = rng.uniform(-bound, bound, size=(d_in, r))
    else:
        A = rng.normal(0.0, 1.0 / r, size=(d_in, r))
    B = np.zeros((r, d_out))
    return A.astype(dtype), B.astype(dtype)


def lora_merge(W, A, B, *, alpha, rank_stabilized=False):
    """Fold the adapter into the weight: ``W' = W + s A B`` (000 §2.7.1, §2.7.2).

    After merging, ``x W' + b`` gives the adapted layer's output with no extra latency.
    W: (d_in, d_out), A: (d_in, r), B: (r, d_out) -> W': (d_in, d_out). ``W`` is not modified.
    """
    where = "lora_merge"
    W, A, B = (v.float_array(M, n, where) for M, n in ((W, "W"), (A, "A"), (B, "B")))
    r = _check_factors(W, A, B, where)
    s = _scale(alpha, r, rank_stabilized, where)
    return W + s * (A @ B)


def lora_unmerge(W_merged, A, B, *, alpha, rank_stabilized=False):
    """Undo :func:`lora_merge`: ``W = W' - s A B`` (exact up to rounding).

    Lets one base weight serve several adapters: merge one, unmerge it, merge another.
    W_merged: (d_in, d_out), A: (d_in, r), B: (r, d_out) -> W: (d_in, d_out).
    """
    where = "lora_unmerge"
    W_merged, A, B = (v.float_array(M, n, where)
                      for M, n in ((W_merged, "W_merged"), (A, "A"), (B, "B")))
    r = _check_factors(W_merged, A, B, where, W_name="W_merged")
    s = _scale(alpha, r, rank_stabilized, where)
    return W_merged - s * (A @ B)


def lora_parameter_count(d_in, d_out, r):
    """Trainable parameters of LoRA vs. full fine-tuning of one d x k weight (000 §2.7.2).

        lora = d r + r k   (A and B),   full = d k,   fraction = lora / full

    Returns ``{"lora": int, "full": int, "fraction": float}``. E.g. d = k = 4096, r = 8:
    65,536 trainable parameters instead of 16,777,216, a fraction of 1/256.
    """
    where = "lora_parameter_count"
    d = v.positive_int(d_in, "d_in", where)
    k = v.positive_int(d_out, "d_out", where)
    r = v.positive_int(r, "r", where)
    lora = d * r + r * k
    full = d * k
    return {"lora": lora, "full": full, "fraction": lora / full}
