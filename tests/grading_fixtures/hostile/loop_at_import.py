# Hostile: an infinite loop while the module loads.
import numpy as np

while True:
    pass


def softmax_forward(x, *, axis=-1):
    return x, {}
