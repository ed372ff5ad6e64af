"""numpytfmr/dropout.py: inverted dropout: the mean kept, a fraction p dropped, eval mode.
"""
import numpy as np

from numpytfmr import dropout_backward, dropout_forward


def test_dropout_keeps_the_mean_and_drops_a_fraction_p():
    x = np.full((400, 500), 2.0)
    p = 0.3
    out, cache = dropout_forward(x, p=p, rng=np.random.default_rng(0))
    zeros = np.mean(out == 0)
    assert abs(zeros - p) < 0.005  # std of the fraction is sqrt(p(1-p)/2e5) = 0.001
    assert abs(out.mean() - 2.0) < 0.02  # inverted dropout: E[out] = x
    np.testing.assert_array_equal(out[out != 0], 2.0 / (1 - p))
    dx = dropout_backward(np.ones_like(x), cache)
    np.testing.assert_array_equal(dx == 0, out == 0)  # the same mask
    np.testing.assert_array_equal(dx[dx != 0], 1 / (1 - p))


def test_dropout_eval_mode_and_p_zero_are_identity():
    x = np.random.default_rng(1).standard_normal((3, 5))
    for kwargs in ({"p": 0.5, "train": False}, {"p": 0.0}):
        out, cache = dropout_forward(x, rng=np.random.default_rng(0), **kwargs)
        np.testing.assert_array_equal(out, x)
        assert out is not x
        dout = np.ones_like(x)
        np.testing.assert_array_equal(dropout_backward(dout, cache), dout)
    out, _ = dropout_forward(x, p=0.5, rng=None, train=False)
    np.testing.assert_array_equal(out, x)


def test_dropout_same_seed_same_mask_and_float32_same_mask():
    x = np.random.default_rng(2).standard_normal((4, 9))
    a, _ = dropout_forward(x, p=0.4, rng=np.random.default_rng(7))
    b, _ = dropout_forward(x, p=0.4, rng=np.random.default_rng(7))
    c, _ = dropout_forward(x, p=0.4, rng=np.random.default_rng(8))
    d, _ = dropout_forward(x.astype(np.float32), p=0.4, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a == 0, c == 0)
    np.testing.assert_array_equal(a == 0, d == 0)
    assert d.dtype == np.float32
