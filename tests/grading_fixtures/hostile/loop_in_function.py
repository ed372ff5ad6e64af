# Hostile (appended to the correct submission): relu_forward never returns.


def relu_forward(x):
    while True:
        pass
