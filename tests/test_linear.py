"""numpytfmr/linear.py: x @ W + b, and its gradients summed over the batch axes.
"""
import numpy as np

from numpytfmr import linear_backward, linear_forward


def test_linear_hand_case_and_batch_axes_summed_in_dW():
    x = np.random.default_rng(10).standard_normal((2, 3, 4))
    W = np.random.default_rng(11).standard_normal((4, 5))
    b = np.arange(5.0)
    out, cache = linear_forward(x, W, b)
    loop = np.array([[[sum(x[i, j, k] * W[k, m] for k in range(4)) + b[m] for m in range(5)]
                      for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(out, loop, rtol=1e-13)
    dout = np.random.default_rng(12).standard_normal(out.shape)
    dx, dW, db = linear_backward(dout, cache)
    dW_loop = sum(np.outer(x[i, j], dout[i, j]) for i in range(2) for j in range(3))
    np.testing.assert_allclose(dW, dW_loop, rtol=1e-13)
    np.testing.assert_allclose(db, dout.sum((0, 1)), rtol=1e-13)
    np.testing.assert_allclose(dx, dout @ W.T, rtol=1e-13)
    assert linear_backward(dout, linear_forward(x, W)[1])[2] is None
