"""Helpers shared by the model tests (test_blocks, test_gpt, test_encdec) and the attention
tests (test_attention, test_mha, test_scoring)."""
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


def assert_attention_gradients(forward, kwargs, args, seed=0):
    """An attention op's backward (the registry's) against finite differences, to 1e-7
    (test_attention, test_mha, test_scoring)."""
    from numpytfmr.gradcheck import check_gradients
    from numpytfmr.registry import bind
    from numpytfmr.registry.attention import OPS
    backward = {spec.forward: spec.backward for spec in OPS}[forward]
    res = check_gradients(bind(forward, kwargs), backward, args, seed=seed)
    assert res.passed and max(res.errors.values()) <= 1e-7, str(res)


def mha_weights(rng, d_model, n_heads, n_kv_heads, d_head, *, biases=True, dtype=np.float64):
    """[Wq, Wk, Wv, Wo, bq, bk, bv, bo] of mha_forward, O(1/sqrt(fan_in)) (biases None
    without ``biases``)."""
    s = d_model ** -0.5
    W = [rng.standard_normal((d_model, n_heads * d_head)) * s,
         rng.standard_normal((d_model, n_kv_heads * d_head)) * s,
         rng.standard_normal((d_model, n_kv_heads * d_head)) * s,
         rng.standard_normal((n_heads * d_head, d_model)) * (n_heads * d_head) ** -0.5]
    b = ([rng.standard_normal(n) * 0.3 for n in (n_heads * d_head, n_kv_heads * d_head,
                                                 n_kv_heads * d_head, d_model)]
         if biases else [None] * 4)
    return [None if a is None else a.astype(dtype) for a in W + b]
