"""Dropout written from the skeleton's contract, with its own way to draw the mask: an entry
is kept when an Exp(1) draw exceeds -log(1 - p), which happens with probability 1 - p."""
import math

import numpy as np


def dropout_forward(x, *, p, rng, train=True):
    out = x.copy()
    if train and p > 0:
        dropped = rng.exponential(size=x.shape) <= -math.log1p(-p)
        out[dropped] = 0
        out[~dropped] /= (1 - p)
        return out, (dropped, 1 / (1 - p))
    return out, (np.zeros(x.shape, dtype=bool), 1.0)


def dropout_backward(dout, cache):
    dropped, factor = cache
    dx = dout * factor
    dx[dropped] = 0
    return dx.astype(dout.dtype)
