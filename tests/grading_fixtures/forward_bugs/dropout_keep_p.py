# Forward bug: p is taken as the probability of keeping an entry (kept with probability p and
# scaled by 1/p); p is the probability of dropping one.


def dropout_forward(x, *, p, rng, train=True):
    if not train or p == 0:
        return x.copy(), None
    mask = (rng.random(x.shape) < p) / p               # should be < 1 - p, / (1 - p)
    return (x * mask).astype(x.dtype), mask


def dropout_backward(dout, cache):
    if cache is None:
        return dout.copy()
    return (dout * cache).astype(dout.dtype)
