"""The linear (affine) layer in row-vector form (004 eq. 17, 000 §2.1.1: ``Q = X W^Q``).

Tokens are rows, so a layer is ``y = x W + b`` with ``W`` of shape ``(d_in, d_out)``; the
notes' column form ``W h + b`` is the same map with ``W`` transposed.
"""
import numpy as np

from .contract import backward_of, op

__all__ = ["linear_forward", "linear_backward"]


@op("x: (..., d_in)", "W: (d_in, d_out)", "b: (d_out,)?")
def linear_forward(x, W, b=None):
    """Affine map of every row of x (004 eq. 17 in row form).

        y = x W + b

    x: (..., d_in)   W: (d_in, d_out)   b: (d_out,) or None   ->  y: (..., d_out)
    cache: {"x", "W", "has_b"}
    """
    y = x @ W                       # y = x W
    if b is not None:
        y = y + b                   #     + b   (broadcast over every row)
    return y, {"x": x, "W": W, "has_b": b is not None}


@backward_of(linear_forward)
def linear_backward(dout, cache):
    """Gradient of :func:`linear_forward`; the leading (batch) axes of x are summed for dW, db.

        dx = dout W^T,   dW = x^T dout  (summed over rows),   db = sum of dout over rows

    Returns (dx, dW, db), db None when the forward had no b.
    """
    x, W = cache["x"], cache["W"]
    dx = dout @ W.T                                          # dy/dx = W^T
    x2, dout2 = x.reshape(-1, W.shape[0]), dout.reshape(-1, W.shape[1])   # rows: (N, d_in), (N, d_out)
    dW = x2.T @ dout2                                        # dy/dW: sum_n x_n^T dout_n
    db = dout2.sum(axis=0) if cache["has_b"] else None       # dy/db = 1 for every row
    return dx, dW, db
