# Hostile (appended to the correct submission): exceptions that are not Exceptions.


class Escape(BaseException):
    pass


def softmax_forward(x, *, axis=-1):
    raise Escape("caught by nobody, hopefully")


def relu_forward(x):
    raise KeyboardInterrupt
