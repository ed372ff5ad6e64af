"""Positional encodings: sinusoidal PE, RoPE (+ PI, NTK, YaRN), ALiBi (003 ch. 7, 000 §2.3, 004)."""
import math

import numpy as np
import pytest

import numpytfmr
from numpytfmr.activations import softmax
from numpytfmr.gradcheck import check_gradients
from numpytfmr.positional import (alibi_bias, alibi_slopes, rope_backward, rope_forward,
                                  rope_frequencies, sinusoidal_encoding, yarn_attention_scale,
                                  yarn_correction_range)


def rot(theta):
    """The notes' 2x2 rotation R(theta) = [[cos, -sin], [sin, cos]] (003 §7.3)."""
    return np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])


def block_diag(blocks):
    n = 2 * len(blocks)
    M = np.zeros((n, n))
    for k, B in enumerate(blocks):
        M[2 * k:2 * k + 2, 2 * k:2 * k + 2] = B
    return M


def rope_matrix(position, alpha):
    """RoPE as the explicit block-diagonal matrix diag(R(p alpha_0), R(p alpha_1), ...) (003 §7.3)."""
    return block_diag([rot(position * a) for a in alpha])


def half_permutation(d):
    """perm with x_interleaved = x_half[perm]: plane k of "half" is (k, k + d/2)."""
    h = d // 2
    return np.stack([np.arange(h), np.arange(h) + h], axis=-1).reshape(-1)


# ---------------------------------------------------------------------------
# Sinusoidal encoding
# ---------------------------------------------------------------------------

def test_sinusoidal_matches_the_formula_elementwise():
    for d in (4, 6, 7, 10):
        pe = sinusoidal_encoding(9, d, base=50.0)
        for p in range(9):
            for j in range(d):
                i = j // 2
                angle = p / 50.0 ** (2 * i / d)
                expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
                assert pe[p, j] == pytest.approx(expected, abs=1e-15)


def test_sinusoidal_worked_example_003_7_2_1():
    """003 §7.2.1 / 000 §2.3.2: d_model = 4 at positions 0 and 1 (printed to 5-8 digits)."""
    pe = sinusoidal_encoding(2, 4)
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1], atol=0)
    np.testing.assert_allclose(pe[1], [0.84147, 0.54030, 0.00999983, 0.99995], atol=5e-6)
    assert pe[1, 2] == pytest.approx(0.00999983, abs=5e-9)


def test_erratum_000_2_3_2_cosine_uses_the_same_exponent_2i_as_its_sine():
    """000 §2.3.2 writes PE(pos, 2i+1) = cos(pos / 10000^((2i+1)/d)). Wrong: the cosine uses 2i.

    With 2i+1 the notes' own example would give PE(1, 3) = cos(10000^(-3/4)) = cos(0.001)
    = 0.9999995, not the printed 0.99995 = cos(0.01); and sin^2 + cos^2 of a pair would
    no longer be 1 (the pair would not sit on the unit circle of 003 §7.2.2).
    """
    pe4 = sinusoidal_encoding(2, 4)
    assert pe4[1, 3] == pytest.approx(math.cos(0.01), abs=1e-15)
    assert abs(pe4[1, 3] - 0.99995) < 5e-6
    wrong = math.cos(1 / 10000 ** (3 / 4))
    assert abs(wrong - 0.99995) > 4e-5
    pe = sinusoidal_encoding(50, 8)
    np.testing.assert_allclose(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, 1.0, atol=1e-14)


def sin_cos_shift(omega_k):
    """The 2x2 map [sin a, cos a] -> [sin(a + w k), cos(a + w k)]: [[cos, sin], [-sin, cos]]."""
    return np.array([[np.cos(omega_k), np.sin(omega_k)], [-np.sin(omega_k), np.cos(omega_k)]])


def test_sinusoidal_shift_by_k_is_a_block_diagonal_rotation_003_7_2_2():
    """PE(p + k) = R(k) PE(p) with R(k) = diag(R(omega_1 k), R(omega_2 k), ...) (003 §7.2.2)."""
    d, base = 8, 10000.0
    pe = sinusoidal_encoding(64, d, base=base)
    omega = base ** (-np.arange(0, d, 2) / d)
    for k in (0, 1, 2, 5, 17, 40):
        R = block_diag([sin_cos_shift(w * k) for w in omega])
        for p in range(0, 64 - k, 3):
            np.testing.assert_allclose(R @ pe[p], pe[p + k], atol=1e-12)
        # R(k) does not depend on p: one matrix maps every row at once
        np.testing.assert_allclose(pe[:64 - k] @ R.T, pe[k:], atol=1e-12)


def test_erratum_003_7_2_2_rotation_for_sin_cos_pairs_and_period_8_example():
    """003 §7.2.2 uses [[cos wk, -sin wk], [sin wk, cos wk]] on the pair [sin wp, cos wp].

    For that ordering the angle-addition identities give [[cos, sin], [-sin, cos]]
    (R(-wk) in the notes' convention). The notes' period-8 example (w = pi/4, p = 2,
    k = 3) therefore prints R [1, 0] = [-sqrt2/2, +sqrt2/2] and calls it
    [sin(5pi/4), cos(5pi/4)]; the true value is [-sqrt2/2, -sqrt2/2].
    """
    # base with base^(-2/4) = pi/4: columns 2, 3 of a d=4 encoding are (sin, cos)(pi p / 4)
    pe = sinusoidal_encoding(8, 4, base=(4 / np.pi) ** 2)[:, 2:4]
    np.testing.assert_allclose(pe[2], [1.0, 0.0], atol=1e-12)
    h = math.sqrt(2) / 2
    np.testing.assert_allclose(pe[5], [-h, -h], atol=1e-12)
    notes_R = rot(3 * np.pi / 4)
    np.testing.assert_allclose(notes_R @ pe[2], [-h, h], atol=1e-12)       # what the notes print
    assert not np.allclose(notes_R @ pe[2], pe[5], atol=1e-3)
    np.testing.assert_allclose(sin_cos_shift(3 * np.pi / 4) @ pe[2], pe[5], atol=1e-12)


def test_sinusoidal_odd_dtype_and_rope_connection():
    pe = sinusoidal_encoding(6, 5, dtype=np.float32)
    assert pe.dtype == np.float32 and pe.shape == (6, 5)
    # odd d: the last column is the sine of the unpaired frequency base^(-4/5)
    np.testing.assert_allclose(pe[:, 4], np.sin(np.arange(6) * 10000.0 ** (-4 / 5)), atol=1e-7)
    # RoPE connection (003 §7.2.2): rotating the unit vector (0, 1) of every plane by
    # theta = p * omega gives (-sin, cos) -- the sinusoidal pair up to the sign of the sine
    d, n = 8, 12
    e = np.tile([0.0, 1.0], d // 2)
    rotated, _ = rope_forward(np.tile(e, (n, 1)), positions=np.arange(n))
    signs = np.tile([-1.0, 1.0], d // 2)
    np.testing.assert_allclose(rotated * signs, sinusoidal_encoding(n, d), atol=1e-13)


def test_positions_break_the_permutation_equivariance_003_7_1():
    """003 §7.1: without positions two identical tokens get identical attention outputs."""
    rng = np.random.default_rng(0)
    d = 8
    emb = rng.standard_normal((5, d))
    X = emb[[0, 1, 2, 3, 1]]                                # "the dog chased another dog"
    Wq, Wk, Wv = (rng.standard_normal((d, d)) for _ in range(3))

    def attend(X):
        Q, K, V = X @ Wq, X @ Wk, X @ Wv
        return softmax(Q @ K.T / np.sqrt(d)) @ V

    out = attend(X)
    np.testing.assert_allclose(out[1], out[4], atol=1e-12)
    P = np.eye(5)[[4, 2, 0, 1, 3]]
    np.testing.assert_allclose(attend(P @ X), P @ out, atol=1e-12)   # equivariance
    out_pe = attend(X + sinusoidal_encoding(5, d))
    assert not np.allclose(out_pe[1], out_pe[4], atol=1e-3)


# ---------------------------------------------------------------------------
# RoPE forward / backward
# ---------------------------------------------------------------------------

# the registered cases (x (5, 8) in both layouts, ...) run in tests/test_registry.py
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("shape, positions", [
    ((2, 3, 7, 6), np.arange(7) + 4),
    ((2, 1, 3, 4), np.array([[[0.5, 1.5, 9.0]], [[2.0, 3.0, 4.0]]])),
])
def test_rope_gradients_match_finite_differences(layout, shape, positions):
    x = np.random.default_rng(1).standard_normal(shape)
    res = check_gradients(lambda x: rope_forward(x, positions=positions, layout=layout),
                          rope_backward, [x])
    assert res.passed and max(res.errors.values()) <= 1e-7, str(res)


def test_rope_matches_the_block_diagonal_matrix_of_the_notes():
    """x~_i = diag(R(i alpha_0), ..., R(i alpha_{d/2-1})) x_i, alpha_k = 10000^(-2k/d) (003 §7.3)."""
    rng = np.random.default_rng(2)
    d, n = 6, 7
    x = rng.standard_normal((n, d))
    alpha = 10000.0 ** (-2 * np.arange(d // 2) / d)
    np.testing.assert_allclose(rope_frequencies(d), alpha, rtol=1e-15)
    out, _ = rope_forward(x, positions=np.arange(n))
    for i in range(n):
        np.testing.assert_allclose(out[i], rope_matrix(i, alpha) @ x[i], atol=1e-14)


def test_rope_worked_example_the_dog_slept_004():
    """004 RoPE example: "the dog slept", d = 4, positions 1, 2, 3 (the example counts from 1)."""
    emb = np.array([[0.9, 0.1, 0.2, 0.8],
                    [0.5, 0.7, 0.3, 0.1],
                    [0.2, 0.1, 0.9, 0.7]])
    out, cache = rope_forward(emb, positions=np.array([1, 2, 3]))
    # printed cosines and sines, pairs (0,1) then (2,3)
    np.testing.assert_allclose(cache["cos"][:, 0], [0.540, -0.416, -0.990], atol=5e-4)
    np.testing.assert_allclose(cache["sin"][:, 0], [0.841, 0.909, 0.141], atol=5e-4)
    np.testing.assert_allclose(cache["cos"][:, 1], [0.99995, 0.99980, 0.99955], atol=5e-6)
    np.testing.assert_allclose(cache["sin"][:, 1], [0.01000, 0.02000, 0.03000], atol=5e-6)
    printed = np.array([[0.402, 0.811, 0.192, 0.802],
                        [-0.845, 0.163, 0.298, 0.106],
                        [-0.212, -0.071, 0.879, 0.727]])
    np.testing.assert_allclose(out, printed, atol=6e-4)


def test_erratum_004_rope_goes_on_queries_and_keys_not_on_the_embeddings():
    """004 ("Integration into Transformers") says Q, K, V are computed from rotated embeddings.

    Then q_i . k_j = x_i^T R_i^T W_q W_k^T R_j x_j, which depends on the absolute positions.
    RoPE rotates the projected queries and keys (003 §7.3, 001 §3.2), so that the score
    depends on j - i only: shifting every position by t leaves it unchanged.
    """
    rng = np.random.default_rng(3)
    n, d = 5, 8
    X = rng.standard_normal((n, d))
    Wq, Wk = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    pos = np.arange(n)

    def scores_rotate_qk(t):
        q, _ = rope_forward(X @ Wq, positions=pos + t)
        k, _ = rope_forward(X @ Wk, positions=pos + t)
        return q @ k.T

    def scores_rotate_embeddings(t):
        Xr, _ = rope_forward(X, positions=pos + t)
        return (Xr @ Wq) @ (Xr @ Wk).T

    np.testing.assert_allclose(scores_rotate_qk(0), scores_rotate_qk(37), rtol=1e-10, atol=1e-10)
    assert not np.allclose(scores_rotate_embeddings(0), scores_rotate_embeddings(37), atol=1e-3)


def test_rope_preserves_norms():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 9, 10))
    for layout in ("interleaved", "half"):
        out, _ = rope_forward(x, positions=np.arange(9) * 7, layout=layout)
        np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1),
                                   rtol=1e-13)
        # ... and plane by plane, since each plane is rotated on its own
        planes = (slice(0, None, 2), slice(1, None, 2)) if layout == "interleaved" else \
            (slice(0, 5), slice(5, 10))
        sq = lambda a: a[..., planes[0]] ** 2 + a[..., planes[1]] ** 2  # noqa: E731
        np.testing.assert_allclose(sq(out), sq(x), rtol=1e-12)


def test_rope_scores_depend_only_on_the_offset_003_7_3():
    """(R_i q) . (R_j k) = q^T M(i, j) k with M = diag(R((j - i) alpha_k)): a function of j - i."""
    rng = np.random.default_rng(5)
    d = 8
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    alpha = rope_frequencies(d)
    for layout in ("interleaved", "half"):
        def score(i, j):
            qi, _ = rope_forward(q[None], positions=[i], layout=layout)
            kj, _ = rope_forward(k[None], positions=[j], layout=layout)
            return float(qi[0] @ kj[0])

        for i, j in [(0, 0), (3, 7), (10, 2), (100, 103), (5, 5)]:
            for shift in (1, 13, 1000):
                assert score(i + shift, j + shift) == pytest.approx(score(i, j), rel=1e-9, abs=1e-12)
            if layout == "interleaved":
                M = rope_matrix(j - i, alpha)
                assert score(i, j) == pytest.approx(q @ M @ k, rel=1e-10, abs=1e-12)


def test_rope_half_layout_is_interleaved_after_permuting_dimensions():
    rng = np.random.default_rng(6)
    d = 10
    x = rng.standard_normal((2, 6, d))
    perm = half_permutation(d)
    inv = np.argsort(perm)
    pos = np.arange(6) + 3
    half, _ = rope_forward(x, positions=pos, layout="half")
    inter, _ = rope_forward(x[..., perm], positions=pos, layout="interleaved")
    np.testing.assert_allclose(half, inter[..., inv], atol=1e-14)
    assert not np.allclose(half, rope_forward(x, positions=pos)[0])


def test_rope_backward_is_the_inverse_rotation_and_positions_broadcast():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4, 6))
    pos = np.array([[[0, 1, 2, 3]], [[5, 6, 7, 8]]])             # (2, 1, 4): per sequence
    out, cache = rope_forward(x, positions=pos, layout="half")
    np.testing.assert_allclose(rope_backward(out, cache), x, atol=1e-14)   # R^T R = I
    # per-sequence positions equal running each sequence on its own
    for b in range(2):
        ob, _ = rope_forward(x[b], positions=pos[b, 0], layout="half")
        np.testing.assert_allclose(out[b], ob, atol=1e-15)


def test_rope_cached_step_equals_the_same_row_of_the_full_sequence():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 9, 8))
    full, _ = rope_forward(x, positions=np.arange(9))
    step, _ = rope_forward(x[:, 6:7], positions=np.array([6]))
    np.testing.assert_allclose(step, full[:, 6:7], atol=1e-15)


def test_rope_float32_preserved_and_accurate_at_large_positions():
    rng = np.random.default_rng(9)
    x64 = rng.standard_normal((4, 8))
    x32 = x64.astype(np.float32)
    pos = np.array([0, 1, 50_000, 200_000])
    out32, cache = rope_forward(x32, positions=pos)
    assert out32.dtype == np.float32
    dx = rope_backward(np.ones_like(out32), cache)
    assert dx.dtype == np.float32
    out64, _ = rope_forward(x64, positions=pos)
    np.testing.assert_allclose(out32, out64, atol=1e-5)
    f32, _ = rope_forward(x64, positions=pos, freqs=rope_frequencies(8).astype(np.float32))
    assert f32.dtype == np.float64


def test_rope_leaves_its_inputs_unchanged():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 6))
    pos = np.arange(3)
    x0, pos0 = x.copy(), pos.copy()
    out, cache = rope_forward(x, positions=pos)
    dout = rng.standard_normal(out.shape)
    d0 = dout.copy()
    cache0 = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in cache.items()}
    rope_backward(dout, cache)
    assert np.array_equal(x, x0) and np.array_equal(pos, pos0) and np.array_equal(dout, d0)
    for key, value in cache0.items():
        assert np.array_equal(cache[key], value)


def test_rope_backward_takes_only_a_rope_cache():
    x = np.ones((3, 4))
    with pytest.raises(TypeError, match="^rope_backward: cache is the cache of attention_forward; "
                                        "expected the cache returned by rope_forward"):
        rope_backward(x, numpytfmr.attention_forward(x, x, x)[1])
    with pytest.raises(TypeError, match="^rope_backward: cache is a dict"):
        rope_backward(x, dict(rope_forward(x, positions=np.arange(3))[1]))


@pytest.mark.torch
def test_rope_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    d, n = 8, 5
    x = rng.standard_normal((2, 3, n, d))
    pos = np.arange(n) + 2
    dout = rng.standard_normal(x.shape)
    alpha = torch.tensor(rope_frequencies(d), dtype=torch.float64)
    theta = torch.tensor(pos, dtype=torch.float64)[:, None] * alpha        # (n, d/2)
    for layout in ("interleaved", "half"):
        xt = torch.tensor(x, requires_grad=True)
        if layout == "interleaved":
            a, b = xt[..., 0::2], xt[..., 1::2]
        else:
            a, b = xt[..., :d // 2], xt[..., d // 2:]
        na = a * torch.cos(theta) - b * torch.sin(theta)
        nb = b * torch.cos(theta) + a * torch.sin(theta)
        if layout == "interleaved":
            yt = torch.stack([na, nb], dim=-1).reshape(xt.shape)
        else:
            yt = torch.cat([na, nb], dim=-1)
        yt.backward(torch.tensor(dout))
        out, cache = rope_forward(x, positions=pos, layout=layout)
        dx = rope_backward(dout, cache)
        np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-14)


# ---------------------------------------------------------------------------
# Frequencies: PI, NTK, YaRN
# ---------------------------------------------------------------------------

def test_position_interpolation_divides_every_angle_by_s_003_7_4():
    d, s = 8, 4.0
    alpha = rope_frequencies(d)
    pi = rope_frequencies(d, scaling={"type": "linear", "factor": s})
    np.testing.assert_allclose(pi, alpha / s, rtol=1e-15)
    # rotating position i with PI frequencies = rotating position i / s with the plain ones
    x = np.random.default_rng(12).standard_normal((9, d))
    pos = np.arange(9)
    a, _ = rope_forward(x, positions=pos, freqs=pi)
    b, _ = rope_forward(x, positions=pos / s)
    np.testing.assert_allclose(a, b, atol=1e-14)


def test_ntk_base_change_003_7_5():
    d, b, s = 16, 10000.0, 4.0
    ntk = rope_frequencies(d, base=b, scaling={"type": "ntk", "factor": s})
    b_prime = b * s ** (d / (d - 2))
    np.testing.assert_allclose(ntk, b_prime ** (-2 * np.arange(d // 2) / d), rtol=1e-14)
    np.testing.assert_allclose(ntk, rope_frequencies(d, base=b_prime), rtol=1e-14)
    alpha = rope_frequencies(d, base=b)
    ratio = alpha / ntk
    assert ratio[0] == 1.0                                  # highest frequency kept
    assert ratio[-1] == pytest.approx(s, rel=1e-12)         # lowest divided by exactly s
    assert np.all(np.diff(ratio) > 0)                       # more stretch for slower planes


def test_yarn_correction_dims_for_d128_published():
    """d = 128, base 1e4, s = 4, L = 4096, beta_fast 32, beta_slow 1: ramp over planes 20..46."""
    assert yarn_correction_range(128, base=1e4, original_max_positions=4096) == (20.0, 46.0)
    lo, hi = yarn_correction_range(128, base=1e4, original_max_positions=4096, truncate=False)
    assert 20 < lo < 21 and 45 < hi < 46
    # k(N) inverts r_k = L alpha_k / (2 pi) = N
    for k, n_rot in ((lo, 32.0), (hi, 1.0)):
        assert 4096 * 1e4 ** (-2 * k / 128) / (2 * np.pi) == pytest.approx(n_rot, rel=1e-12)


def test_yarn_keeps_fast_planes_and_interpolates_slow_ones_003_7_6_1():
    d, base, s, L = 128, 1e4, 4.0, 4096
    scaling = {"type": "yarn", "factor": s, "original_max_positions": L,
               "beta_fast": 32, "beta_slow": 1}
    yarn = rope_frequencies(d, base=base, scaling=scaling)
    alpha = rope_frequencies(d, base=base)
    turns = L * alpha / (2 * np.pi)                  # r_k, rotations within the window
    kept = turns > 32
    squeezed = turns < 1
    assert kept.sum() > 10 and squeezed.sum() > 10
    np.testing.assert_allclose(yarn[kept], alpha[kept], rtol=1e-15)
    np.testing.assert_allclose(yarn[squeezed], alpha[squeezed] / s, rtol=1e-14)
    np.testing.assert_allclose(yarn[:21], alpha[:21], rtol=1e-15)        # planes <= 20 kept
    np.testing.assert_allclose(yarn[46:], alpha[46:] / s, rtol=1e-14)    # planes >= 46 / s
    stretch = alpha / yarn                            # 1 -> s, monotone along the ramp
    assert np.all(np.diff(stretch) >= -1e-12)
    assert np.all(np.diff(stretch[20:47]) > 0)
    # linear in the plane index between the correction dims
    ramp = (1 - 1 / stretch) / (1 - 1 / s)            # solves 1/stretch = (1 - r) + r/s for r
    np.testing.assert_allclose(ramp[20:47], (np.arange(20, 47) - 20) / 26, atol=1e-12)
    # the same with the HF spelling of the keys
    hf = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L}
    np.testing.assert_allclose(rope_frequencies(d, base=base, scaling=hf), yarn, rtol=0)


def test_erratum_003_7_6_1_yarn_ramp_direction():
    """003 §7.6.1 blends alpha' = (1 - gamma) alpha + gamma alpha/s with gamma = 1 for r > beta,
    and says it "leaves low frequencies alone, scales high frequencies". Backwards: YaRN
    keeps the fast planes (many turns within L, gamma = 1) and interpolates the slow ones
    (fewer than one turn, gamma = 0): alpha' = (1 - gamma) alpha/s + gamma alpha.
    """
    d, s, L = 32, 8.0, 256
    alpha = rope_frequencies(d)
    yarn = rope_frequencies(d, scaling={"type": "yarn", "factor": s, "original_max_positions": L})
    r = L * alpha / (2 * np.pi)
    gamma = np.clip((r - 1) / (32 - 1), 0, 1)           # the notes' ramp, thresholds 1 and 32
    notes = (1 - gamma) * alpha + gamma * alpha / s
    assert yarn[0] == alpha[0] and notes[0] == pytest.approx(alpha[0] / s)     # fastest plane
    assert yarn[-1] == pytest.approx(alpha[-1] / s) and notes[-1] == alpha[-1]  # slowest plane
    corrected = (1 - gamma) * alpha / s + gamma * alpha
    np.testing.assert_allclose(yarn[r > 32], corrected[r > 32], rtol=1e-14)
    np.testing.assert_allclose(yarn[r < 1], corrected[r < 1], rtol=1e-14)


def test_scaling_with_factor_one_changes_nothing():
    alpha = rope_frequencies(12)
    for scaling in ({"type": "linear", "factor": 1.0}, {"type": "ntk", "factor": 1},
                    {"type": "yarn", "factor": 1.0, "original_max_positions": 64}):
        np.testing.assert_allclose(rope_frequencies(12, scaling=scaling), alpha, rtol=1e-15)


def test_yarn_attention_scale_published():
    assert yarn_attention_scale(4) == pytest.approx(1.1386294361, abs=1e-10)
    assert yarn_attention_scale(16) == pytest.approx(0.1 * math.log(16) + 1, rel=1e-15)
    assert yarn_attention_scale(1) == 1.0 and yarn_attention_scale(0.5) == 1.0


# ---------------------------------------------------------------------------
# ALiBi
# ---------------------------------------------------------------------------

def test_alibi_slopes_published_values():
    np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -k for k in range(1, 9)], rtol=1e-15)
    np.testing.assert_allclose(
        alibi_slopes(12),
        [2.0 ** -k for k in range(1, 9)] + [0.707107, 0.353553, 0.176777, 0.088388], atol=5e-7)
    # 6 heads by hand: 4 heads give 2^(-8(h+1)/4) = 2^-2, 2^-4, 2^-6, 2^-8; 8 heads give
    # 2^-1 ... 2^-8, of which every other one (the 1st, 3rd, ...) fills the last two heads
    np.testing.assert_allclose(alibi_slopes(6), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3],
                               rtol=1e-15)
    np.testing.assert_allclose(alibi_slopes(16), [2.0 ** (-k / 2) for k in range(1, 17)], rtol=1e-15)
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    np.testing.assert_allclose(alibi_slopes(3), [2 ** -4, 2 ** -8, 2 ** -2], rtol=1e-15)


def test_alibi_bias_causal_and_symmetric():
    m = alibi_slopes(4)
    b = alibi_bias(4, 5, 5)
    assert b.shape == (4, 5, 5) and b.dtype == np.float64
    i, j = np.meshgrid(np.arange(5), np.arange(5), indexing="ij")
    past = j <= i
    np.testing.assert_allclose(b[:, past], -(m[:, None] * (i - j)[past]), rtol=1e-15)
    assert np.all(b[:, ~past] == 0)                            # finite; the mask removes them
    sym = alibi_bias(4, 5, 5, causal=False)
    np.testing.assert_allclose(sym, -m[:, None, None] * np.abs(i - j), rtol=1e-15)
    np.testing.assert_allclose(sym, np.swapaxes(sym, 1, 2))
    assert alibi_bias(2, 3, 3, dtype=np.float32).dtype == np.float32


def test_alibi_cached_rows_align_with_the_full_sequence():
    full = alibi_bias(6, 7, 7)
    np.testing.assert_array_equal(alibi_bias(6, 1, 7), full[:, -1:])
    np.testing.assert_array_equal(alibi_bias(6, 3, 7), full[:, -3:])


def test_alibi_softmax_equals_the_reference_row_form():
    """The reference code adds m_h * j to every row; per row it differs from -m_h (i - j)
    by the constant -m_h i, so under the causal mask the attention weights are the same."""
    rng = np.random.default_rng(13)
    h, n = 4, 6
    logits = rng.standard_normal((h, n, n))
    causal = np.tril(np.ones((n, n), dtype=bool))
    neg = np.where(causal, 0.0, -np.inf)
    ours = softmax(logits + alibi_bias(h, n, n) + neg)
    reference = softmax(logits + alibi_slopes(h)[:, None, None] * np.arange(n) + neg)
    np.testing.assert_allclose(ours, reference, atol=1e-14)


def test_erratum_004_eq13_alibi_bias_vector():
    """004 eq. 13 writes the bias of query i over keys 1..n as [-i, ..., -1, 0, -1, ..., -n]:
    that has i + n + 1 entries. The bias -|i - j| over j = 1..n has n entries, from
    -(i - 1) to -(n - i) (and ALiBi scales it by a per-head slope m_h)."""
    n = 7
    m = alibi_slopes(1)[0]
    rows = alibi_bias(1, n, n, causal=False)[0] / m
    for i in range(1, n + 1):                                  # 1-based as in the notes
        row = rows[i - 1]
        assert row.shape == (n,)
        assert row[0] == -(i - 1) and row[-1] == -(n - i) and row[i - 1] == 0


# ---------------------------------------------------------------------------
# Learned absolute positions (004 eq. 12) go through the embedding lookup
# ---------------------------------------------------------------------------

def test_learned_positions_are_an_embedding_lookup_004_eq12():
    rng = np.random.default_rng(14)
    n, d, N = 5, 4, 9
    X = rng.standard_normal((2, n, d))
    P = rng.standard_normal((N, d))
    pos, cache = numpytfmr.embedding_forward(np.arange(n), P)
    np.testing.assert_array_equal(pos, P[:n])
    np.testing.assert_allclose(X + pos, X + P[None, :n])       # x~_i = x_i + P_i
    dout = rng.standard_normal((n, d))
    grads = numpytfmr.embedding_backward(dout, cache)
    dP = grads[-1] if isinstance(grads, tuple) else grads
    np.testing.assert_allclose(dP[:n], dout)
    assert np.all(dP[n:] == 0)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("call, exc, words", [
    (lambda: rope_forward(np.zeros((3, 5)), positions=np.arange(3)), ValueError, "even"),
    (lambda: rope_frequencies(7), ValueError, "even"),
    (lambda: rope_forward(np.zeros(6), positions=np.arange(1)), ValueError, "2 axes"),
    (lambda: rope_forward(np.zeros((3, 6), dtype=int), positions=np.arange(3)), TypeError, "x"),
    (lambda: rope_forward(np.zeros((3, 6)), positions=np.arange(4)), ValueError, "positions"),
    (lambda: rope_forward(np.zeros((2, 3, 6)), positions=np.zeros((4, 3))), ValueError, "positions"),
    (lambda: rope_forward(np.zeros((3, 6)), positions=np.zeros((2, 3))), ValueError, "positions"),
    (lambda: rope_forward(np.zeros((3, 6)), positions=np.array([0, 1, np.nan])), ValueError,
     "positions"),
    (lambda: rope_forward(np.zeros((3, 6)), positions=np.ones(3, dtype=bool)), TypeError,
     "positions"),
    (lambda: rope_forward(np.zeros((3, 6)), positions=2), ValueError, "positions"),
    (lambda: rope_forward(np.zeros((3, 6)), positions=np.arange(3), freqs=np.ones(4)),
     ValueError, "freqs"),
    (lambda: rope_forward(np.zeros((3, 6)), positions=np.arange(3), layout="neox"), ValueError,
     "layout"),
    (lambda: rope_backward(np.zeros((3, 4)), rope_forward(np.zeros((3, 6)),
                                                          positions=np.arange(3))[1]),
     ValueError, "dout"),
    (lambda: rope_frequencies(8, scaling={"type": "dynamic", "factor": 2}), ValueError, "type"),
    (lambda: rope_frequencies(8, scaling={"factor": 2}), ValueError, "type"),
    (lambda: rope_frequencies(8, scaling={"type": "linear"}), ValueError, "factor"),
    (lambda: rope_frequencies(8, scaling={"type": "linear", "factor": 0.5}), ValueError, "factor"),
    (lambda: rope_frequencies(8, scaling={"type": "ntk", "factor": 2, "beta_fast": 3}),
     ValueError, "beta_fast"),
    (lambda: rope_frequencies(2, scaling={"type": "ntk", "factor": 2}), ValueError, "d >= 4"),
    (lambda: rope_frequencies(8, scaling={"type": "yarn", "factor": 2}), ValueError,
     "original_max_positions"),
    (lambda: rope_frequencies(8, scaling={"type": "yarn", "factor": 2, "original_max_positions": 64,
                                          "beta_fast": 1, "beta_slow": 32}), ValueError, "beta_fast"),
    (lambda: rope_frequencies(8, scaling={"type": "yarn", "factor": 2,
                                          "original_max_positions": 64.5}), TypeError,
     "original_max_positions"),
    (lambda: rope_frequencies(8, scaling="linear"), TypeError, "scaling"),
    (lambda: rope_frequencies(8, base=-1.0), ValueError, "base"),
    (lambda: yarn_attention_scale(0), ValueError, "factor"),
    (lambda: sinusoidal_encoding(0, 4), ValueError, "n_positions"),
    (lambda: sinusoidal_encoding(4, 4.0), TypeError, "d_model"),
    (lambda: sinusoidal_encoding(4, 4, dtype=np.int64), TypeError, "dtype"),
    (lambda: alibi_slopes(0), ValueError, "n_heads"),
    (lambda: alibi_bias(4, 3, 3, causal="yes"), TypeError, "causal"),
])
def test_bad_input_is_refused_with_a_clear_message(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert words in msg
    name = msg.split(":")[0]
    assert name in {"rope_forward", "rope_backward", "rope_frequencies", "yarn_attention_scale",
                    "sinusoidal_encoding", "alibi_slopes", "alibi_bias"}


def test_erratum_003_7_6_2_yarn_temperature_sharpens_attention():
    """003 §7.6.2 says the YaRN temperature "mitigates over-sharp attention". With
    sqrt(1/t) = 0.1 ln s + 1 > 1 the logits are multiplied by 1/t > 1, so the softmax gets
    sharper (lower entropy): the temperature counters the flattening that many competing
    positions cause at extended lengths, not an over-sharpness."""
    from numpytfmr import softmax, yarn_attention_scale

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, 4096))
    mscale = yarn_attention_scale(8.0)
    inv_t = mscale ** 2                       # q and k are each multiplied by sqrt(1/t)
    assert inv_t > 1.0

    def entropy(p):
        return -np.sum(p * np.log(p), axis=-1)

    plain, scaled = entropy(softmax(logits)), entropy(softmax(inv_t * logits))
    assert np.all(scaled < plain)
