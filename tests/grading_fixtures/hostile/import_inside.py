# Hostile (appended to the correct submission): imports the reference, or torch, inside functions.


def softmax_forward(x, *, axis=-1):
    import numpytfmr
    return numpytfmr.softmax_forward(x, axis=axis)


def relu_forward(x):
    import torch
    return torch.relu(torch.from_numpy(x)).numpy(), {}
