# Planted (appended to correct.py, whose definition it replaces): see README.md.


def dropout_forward(x, *, p, rng, train=True):      # planted: no 1/(1-p)
    if not train or p == 0:
        return x.copy(), None
    keep = rng.random(x.shape) >= p
    return x * keep, keep.astype(x.dtype)
