# Planted bug: relu_forward clips its input in place.


def relu_forward(x):
    pos = x > 0
    x[~pos] = 0
    return x, {"pos": pos}
