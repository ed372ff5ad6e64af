# Planted (appended to correct.py, whose definition it replaces): see README.md.


def dropout_backward(dout, cache):                  # planted: dout changed in place
    if cache is None:
        return dout.copy()
    dx = dout
    dx *= cache
    return dx
