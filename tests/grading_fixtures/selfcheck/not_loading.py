import numpy as np

def softmax_forward(x, *, axis=-1)
    return x
