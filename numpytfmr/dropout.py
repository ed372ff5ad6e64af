"""Inverted dropout (Srivastava et al. 2014), the usual regularizer of transformer sublayers.

The notes do not derive it; 003 §3.7 motivates label smoothing as the marginalized effect
of dropping labels, the same idea applied to the targets.

Randomness comes only from the ``rng`` passed in; the mask drawn is kept in the cache.
"""
from .contract import backward_of, flag, fraction, generator, op

__all__ = ["dropout_forward", "dropout_backward"]


def generator_when_dropping(p_name):
    """A validator for ``rng``: a ``numpy.random.Generator``, or None when nothing is dropped
    (``train`` False or the drop probability ``p_name`` 0; both validated before it)."""
    def check(v, name, where, args):
        if v is None and (not args["train"] or args[p_name] == 0.0):
            return None
        return generator(v, name, where)
    check.__doc__ = "a numpy.random.Generator (None allowed when nothing is dropped)"
    return check


@op("x: (...)", p=fraction, train=flag, rng=generator_when_dropping("p"))
def dropout_forward(x, *, p, rng, train=True):
    """Inverted dropout: zero each element with probability p, scale the survivors by 1/(1-p).

        out = x * m / (1 - p),   m_ij ~ Bernoulli(1 - p)

    so that `E[out] = x` and nothing needs rescaling at evaluation time. With ``train=False``
    or ``p == 0`` the op is the identity (no random numbers are drawn; rng may be None).
    The uniform draws are float64 whatever x's dtype, so a seed gives the same mask in
    float32 and float64.

    x: any shape   ->  out: same shape and dtype
    p: float in [0, 1)   rng: np.random.Generator   train: bool
    cache: {"mask": bool array of kept elements (None for the identity), "scale": 1/(1-p)}
    """
    if not train or p == 0:
        return x.copy(), {"mask": None, "scale": 1.0}      # identity (evaluation)
    keep = rng.random(x.shape) >= p                        # m_ij ~ Bernoulli(1 - p)
    scale = 1 / (1 - p)
    return x * keep * scale, {"mask": keep, "scale": scale}  # x m / (1 - p)


@backward_of(dropout_forward)
def dropout_backward(dout, cache):
    """Gradient of :func:`dropout_forward`: ``dx = dout * m / (1 - p)`` (the same mask)."""
    if cache["mask"] is None:
        return dout.copy()                                 # identity (a copy, never dout itself)
    return dout * cache["mask"] * cache["scale"]           # d out / d x = m / (1 - p)
