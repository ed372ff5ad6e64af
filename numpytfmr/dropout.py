"""Inverted dropout (Srivastava et al. 2014), the usual regularizer of transformer sublayers.

The notes do not derive it; 003 §3.7 motivates label smoothing as the marginalized effect
of dropping labels, the same idea applied to the targets.

Randomness comes only from the ``rng`` passed in; the mask drawn is kept in the cache.
"""
import numpy as np

from ._validate import float_array, number, rng_arg

__all__ = ["dropout_forward", "dropout_backward"]


def dropout_forward(x, *, p, rng, train=True):
    """Inverted dropout: zero each element with probability p, scale the survivors by 1/(1-p).

        out = x * m / (1 - p),   m_ij ~ Bernoulli(1 - p)

    so that E[out] = x and nothing needs rescaling at evaluation time. With ``train=False``
    or ``p == 0`` the op is the identity (no random numbers are drawn; rng may be None).

    x: any shape   ->  out: same shape and dtype
    p: float in [0, 1)   rng: np.random.Generator   train: bool
    cache: {"mask": bool array of kept elements (None for the identity), "scale": 1/(1-p), "dtype"}
    """
    where = "dropout_forward"
    x = float_array(x, "x", where)
    p = number(p, "p", where, low=0.0, high=1.0, high_open=True)
    if not isinstance(train, (bool, np.bool_)):
        raise TypeError(f"{where}: train is {train!r}; expected True or False")
    if not train or p == 0.0:
        if rng is not None:
            rng_arg(rng, where)
        return x.copy(), {"mask": None, "scale": 1.0, "dtype": x.dtype}
    rng = rng_arg(rng, where)
    # Uniform draws in float64 whatever x's dtype, so a seed gives the same mask in float32 and float64.
    keep = rng.random(x.shape) >= p  # P(keep) = 1 - p
    scale = 1.0 / (1.0 - p)
    out = np.where(keep, x * scale, 0).astype(x.dtype, copy=False)
    return out, {"mask": keep, "scale": scale, "dtype": x.dtype}


def dropout_backward(dout, cache):
    """Gradient of :func:`dropout_forward`: ``dx = dout * m / (1 - p)`` (the same mask)."""
    if cache["mask"] is None:
        return np.array(dout, dtype=cache["dtype"])  # identity; a copy, never dout itself
    dx = np.where(cache["mask"], dout * cache["scale"], 0)  # d out / d x = m / (1 - p)
    return dx.astype(cache["dtype"], copy=False)
