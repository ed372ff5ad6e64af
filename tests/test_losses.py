"""numpytfmr/losses.py: cross-entropy with label smoothing and ignore_index (003 §2.1, §3.7).
"""
import math

import numpy as np
import pytest

from numpytfmr import cross_entropy_backward, cross_entropy_forward


def test_cross_entropy_equals_minus_log_p_on_a_hand_case():
    logits = np.log(np.array([[1.0, 2.0, 3.0], [4.0, 1.0, 1.0]]))  # p = [1,2,3]/6 and [4,1,1]/6
    loss, cache = cross_entropy_forward(logits, np.array([2, 0]))
    assert loss.shape == () and loss.dtype == np.float64
    assert float(loss) == pytest.approx(-(math.log(3 / 6) + math.log(4 / 6)) / 2, rel=1e-15)
    dz, none = cross_entropy_backward(1.0, cache)
    assert none is None
    np.testing.assert_allclose(dz, (np.array([[1, 2, 3], [4, 1, 1]]) / 6 - np.eye(3)[[2, 0]]) / 2,
                               rtol=1e-14, atol=1e-16)


def test_cross_entropy_is_the_mean_negative_log_likelihood_and_log_perplexity():
    # 003 eq. 2.1 prints L_CE = -E[P_theta(w_i | w_<i)]; the log is missing. Eq. 2.2 and
    # PPL = exp(L_CE) hold only with it: L_CE = -E[log P_theta].
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((2, 5, 7))
    t = rng.integers(0, 7, size=(2, 5))
    loss, _ = cross_entropy_forward(logits, t)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    p_t = np.take_along_axis(p, t[..., None], -1)[..., 0]
    assert float(loss) == pytest.approx(-np.mean(np.log(p_t)), rel=1e-14)
    assert math.exp(float(loss)) == pytest.approx(np.prod(p_t) ** (-1 / p_t.size), rel=1e-12)
    assert float(loss) != pytest.approx(-np.mean(p_t), rel=1e-3)  # the formula as printed


def test_label_smoothing_targets_on_a_hand_case():
    # K = 4, eps = 0.2, target 1: q' = (1 - eps) one_hot + eps / K = [0.05, 0.85, 0.05, 0.05] (003 §3.7)
    logits = np.array([[0.3, -1.2, 2.0, 0.1]])
    loss, cache = cross_entropy_forward(logits, np.array([1]), label_smoothing=0.2)
    q = np.array([0.05, 0.85, 0.05, 0.05])
    logp = logits[0] - np.log(np.sum(np.exp(logits[0])))
    assert float(loss) == pytest.approx(-np.sum(q * logp), rel=1e-14)
    dz, _ = cross_entropy_backward(1.0, cache)
    np.testing.assert_allclose(np.exp(logp) - dz[0], q, rtol=1e-14)  # dz = p - q'
    assert q.sum() == pytest.approx(1.0)  # 003 §3.7.1: q' is a distribution
    # eps = 1: the target is ignored, q' is uniform
    loss1, _ = cross_entropy_forward(logits, np.array([1]), label_smoothing=1.0)
    loss1b, _ = cross_entropy_forward(logits, np.array([3]), label_smoothing=1.0)
    assert float(loss1) == pytest.approx(-np.mean(logp), rel=1e-14) and float(loss1) == float(loss1b)


def test_ignore_index_excludes_positions():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((2, 4, 5))
    t = rng.integers(0, 5, size=(2, 4))
    t_ign = t.copy()
    t_ign[0, 1] = t_ign[1, 3] = -1
    keep = t_ign != -1
    for eps in (0.0, 0.3):
        loss, cache = cross_entropy_forward(logits, t_ign, ignore_index=-1, label_smoothing=eps)
        ref, ref_cache = cross_entropy_forward(logits[keep], t[keep], label_smoothing=eps)
        assert float(loss) == pytest.approx(float(ref), rel=1e-14)  # mean over the 6 kept only
        dz, _ = cross_entropy_backward(1.0, cache)
        dref, _ = cross_entropy_backward(1.0, ref_cache)
        assert np.all(dz[~keep] == 0)
        np.testing.assert_allclose(dz[keep], dref, rtol=1e-14)
    # an ignore_index inside [0, K) ignores that class's positions
    loss, _ = cross_entropy_forward(logits, t, ignore_index=int(t[0, 0]))
    m = t != t[0, 0]
    assert float(loss) == pytest.approx(float(cross_entropy_forward(logits[m], t[m])[0]), rel=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cross_entropy_all_positions_ignored_gives_zero(dtype):
    logits = np.random.default_rng(5).standard_normal((2, 3, 5)).astype(dtype)
    with np.errstate(all="raise"):
        loss, cache = cross_entropy_forward(logits, np.full((2, 3), -100), ignore_index=-100,
                                            label_smoothing=0.1)
        dz, _ = cross_entropy_backward(np.asarray(1.0, dtype), cache)
    assert loss.dtype == dtype and float(loss) == 0.0
    assert dz.dtype == dtype and np.all(dz == 0)
