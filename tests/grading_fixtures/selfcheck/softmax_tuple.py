# Planted (appended to correct.py, whose definition it replaces): see README.md.


def softmax_backward(dout, cache):                  # planted: a 1-tuple
    probs, axis = cache
    inner = (dout * probs).sum(axis=axis, keepdims=True)
    return (probs * (dout - inner),)
