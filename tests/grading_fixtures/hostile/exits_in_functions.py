# Hostile (appended to the correct submission): functions that try to end the process.
import os
import sys


def softmax_forward(x, *, axis=-1):
    sys.exit(0)


def relu_forward(x):
    os._exit(0)


def relu_backward(dout, cache):
    sys.exit(3)
