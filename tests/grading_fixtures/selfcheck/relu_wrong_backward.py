# Planted (appended to correct.py, whose definition it replaces): see README.md.


def relu_backward(dout, cache):                     # planted: the mask inverted
    return dout * ~cache
