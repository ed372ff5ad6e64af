"""Helpers shared by the model tests (test_blocks, test_gpt, test_encdec)."""
import numpy as np


def well_conditioned(params, rng):
    """The parameters redrawn at a well-conditioned point: O(1/sqrt(fan_in)) weights (the
    embedding tables by their width), gammas near 1, biases O(0.3).

    GPT-2's 0.02 initialisation makes attention nearly uniform and the finite differences
    of its scores tiny; at this point every finite difference is well above rounding noise.
    """
    out = {}
    for k, a in params.items():
        if k.endswith(".gamma"):
            out[k] = 1.0 + 0.3 * rng.standard_normal(a.shape)
        elif a.ndim == 1:
            out[k] = 0.3 * rng.standard_normal(a.shape)
        else:
            out[k] = rng.standard_normal(a.shape) / np.sqrt(a.shape[1] if k.endswith("wte") else a.shape[0])
    return out
