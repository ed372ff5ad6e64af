# Planted (appended to correct.py, whose definition it replaces): see README.md.


def softmax_forward(x, *, axis=-1):                 # planted: x changed in place
    x -= x.max(axis=axis, keepdims=True)
    ex = np.exp(x)
    probs = ex / ex.sum(axis=axis, keepdims=True)
    return probs, (probs, axis)
