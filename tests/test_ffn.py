"""numpytfmr/ffn.py: the position-wise FFN, linear -> activation -> linear.
"""
import numpy as np

from numpytfmr import ffn_backward, ffn_forward, gelu_forward


def test_ffn_is_linear_activation_linear():
    rng = np.random.default_rng(13)
    x, W1, b1 = rng.standard_normal((2, 3, 7)), rng.standard_normal((7, 11)), rng.standard_normal(11)
    W2, b2 = rng.standard_normal((11, 7)), rng.standard_normal(7)
    h = x @ W1 + b1
    acts = {"relu": np.maximum(h, 0), "gelu": gelu_forward(h)[0],
            "gelu_tanh": gelu_forward(h, approximate="tanh")[0]}
    for name, a in acts.items():
        out, cache = ffn_forward(x, W1, b1, W2, b2, activation=name)
        np.testing.assert_allclose(out, a @ W2 + b2, rtol=1e-13)
        grads = ffn_backward(np.ones_like(out), cache)
        assert len(grads) == 5 and all(g.shape == v.shape for g, v in zip(grads, (x, W1, b1, W2, b2)))
    _, cache = ffn_forward(x, W1, None, W2, None)
    grads = ffn_backward(np.ones((2, 3, 7)), cache)
    assert grads[2] is None and grads[4] is None
