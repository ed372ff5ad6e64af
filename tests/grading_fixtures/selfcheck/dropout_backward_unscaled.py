# Planted (appended to correct.py, whose definition it replaces): see README.md.


def dropout_backward(dout, cache):                  # planted: the mask without 1/(1-p)
    if cache is None:
        return dout.copy()
    return dout * (cache != 0)
