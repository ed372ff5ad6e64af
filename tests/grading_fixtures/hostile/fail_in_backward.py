# Hostile (appended to the correct submission): backwards that hang or end their process; the
# forwards are right.
import os as _os


def softmax_backward(dout, cache):
    while True:
        pass


def layernorm_backward(dout, cache):
    _os._exit(1)
