"""LoRA written from the skeleton's contract; the branch's dropout mask is drawn in transposed
order (``rng.random(reversed shape).T >= p``), another valid draw."""
import math

import numpy as np


def lora_linear_forward(x, W, A, B, b=None, *, alpha, rank_stabilized=False, dropout=0.0, rng=None,
                        train=True):
    r = A.shape[-1]
    s = alpha / (math.sqrt(r) if rank_stabilized else r)
    if train and dropout > 0:
        keep = rng.random(x.shape[::-1]).T >= dropout
        mask = keep.astype(x.dtype) / (1.0 - dropout)
    else:
        mask = np.ones_like(x)
    branch_in = x * mask
    h = np.einsum("...i,ir->...r", branch_in, A)
    y = np.einsum("...i,io->...o", x, W) + s * np.einsum("...r,ro->...o", h, B)
    if b is not None:
        y = y + b
    return y.astype(x.dtype), (x, W, A, B, s, mask, branch_in, h)


def lora_linear_backward(dout, cache):
    x, W, A, B, s, mask, branch_in, h = cache
    dh = s * np.einsum("...o,ro->...r", dout, B)
    r, d_in, d_out = h.shape[-1], x.shape[-1], dout.shape[-1]
    dB = s * (h.reshape(-1, r).T @ dout.reshape(-1, d_out))
    dA = branch_in.reshape(-1, d_in).T @ dh.reshape(-1, r)
    dx = np.einsum("...o,io->...i", dout, W) + mask * np.einsum("...r,ir->...i", dh, A)
    return dx.astype(dout.dtype), None, dA.astype(dout.dtype), dB.astype(dout.dtype), None
