# Hostile: the module ends its own process while it loads.
import os

import numpy as np


def softmax_forward(x, *, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True), {}


os._exit(0)
