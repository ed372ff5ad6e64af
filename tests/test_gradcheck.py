"""Tests of the gradient checker (numpytfmr/gradcheck.py).

The ops here are written inside the tests on purpose: the checker is tested on its own,
with correct backwards that must pass and broken ones (negative controls) that must fail
with the right diagnosis.
"""
import numpy as np
import pytest

from numpytfmr.gradcheck import GradcheckResult, check_gradients, numerical_gradient, rel_error


def _rng(seed=0):
    return np.random.default_rng(seed)


def _structural(res, name):
    """(passed, message) of the structural check called ``name``."""
    found = [(ok, msg) for n, ok, msg in res.structural if n == name]
    assert len(found) == 1, f"no structural check {name!r} in {[n for n, _, _ in res.structural]}"
    return found[0]


def _diagnoses(res, position):
    return " | ".join(res.diagnoses.get(position, []))


# --- small ops written for the tests -------------------------------------------------------

def linear_forward(x, W, b):
    return x @ W + b, {"x": x, "W": W}


def linear_backward(dout, cache):
    x, W = cache["x"], cache["W"]
    x2 = x.reshape(-1, x.shape[-1])                  # (N, d_in): batch axes flattened
    d2 = dout.reshape(-1, dout.shape[-1])            # (N, d_out)
    return dout @ W.T, x2.T @ d2, d2.sum(axis=0)


def softmax_forward(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    A = e / e.sum(axis=-1, keepdims=True)
    return A, {"A": A}


def softmax_backward(dout, cache):
    A = cache["A"]
    return A * (dout - np.sum(dout * A, axis=-1, keepdims=True))   # softmax JVP


def relu_forward(x):
    return np.maximum(x, 0.0), {"x": x}


def relu_backward(dout, cache):
    return dout * (cache["x"] > 0)


def layernorm_forward(x):
    mu = x.mean(axis=-1, keepdims=True)
    sigma = np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)
    xhat = (x - mu) / sigma
    return xhat, {"xhat": xhat, "sigma": sigma}


def layernorm_backward(dout, cache):
    xhat, sigma = cache["xhat"], cache["sigma"]
    return (dout - dout.mean(-1, keepdims=True) - xhat * np.mean(dout * xhat, -1, keepdims=True)) / sigma


def scores_forward(Q, K):
    """S = Q K^T / sqrt(d_k), d_k = 64."""
    return Q @ K.T / np.sqrt(Q.shape[-1]), {"Q": Q, "K": K}


def scores_backward(dout, cache):
    Q, K = cache["Q"], cache["K"]
    scale = 1.0 / np.sqrt(Q.shape[-1])
    return dout @ K * scale, dout.T @ Q * scale


def _linear_inputs(seed=0, d_in=7, d_out=5):
    rng = _rng(seed)
    return (rng.standard_normal((2, 3, d_in)), rng.standard_normal((d_in, d_out)),
            rng.standard_normal(d_out))


# --- rel_error and numerical_gradient ------------------------------------------------------

def test_rel_error_hand_cases():
    assert rel_error(1.0, 1.0) == 0.0
    assert rel_error([1.0], [3.0]) == pytest.approx(0.5)                  # 2 / 4
    assert rel_error([1.0, 2.0], [1.0, 2.2]) == pytest.approx(0.2 / 4.2)  # the max over entries
    assert rel_error(0.0, 0.0) == 0.0
    assert rel_error(1e-9, 0.0) == pytest.approx(0.1)                     # floor 1e-8 in the denominator
    assert rel_error(-1.0, 1.0) == pytest.approx(1.0)
    assert rel_error(np.zeros(0), np.zeros(0)) == 0.0
    assert isinstance(rel_error(np.ones(3), np.ones(3)), float)


def test_numerical_gradient_matches_cos_and_leaves_x_alone():
    rng = _rng(1)
    x = rng.standard_normal((3, 4))
    x_before = x.copy()
    dout = rng.standard_normal((3, 4))
    seen = []

    def f(z):
        seen.append(z is x)
        return np.sin(z)

    for order, h, tol in ((2, 1e-6, 1e-7), (4, 1e-3, 1e-9)):
        num = numerical_gradient(f, x, dout, h=h, order=order)
        assert rel_error(num, np.cos(x) * dout) < tol
    assert np.array_equal(x, x_before)
    assert not any(seen)                                # f gets a copy, never the caller's array


def test_numerical_gradient_scalar_function_and_errors():
    x = np.array([0.5, -1.0, 2.0], dtype=np.float32)   # float32 input: worked on in float64
    num = numerical_gradient(lambda z: np.sum(z ** 3), x, h=1e-5)
    assert num.dtype == np.float64
    assert rel_error(num, 3 * x.astype(np.float64) ** 2) < 1e-8
    with pytest.raises(ValueError, match="dout is None"):
        numerical_gradient(np.sin, x)
    with pytest.raises(ValueError, match="order"):
        numerical_gradient(np.sin, x, np.ones(3), order=3)


# --- correct backwards pass ----------------------------------------------------------------

def test_correct_linear_passes_with_table():
    res = check_gradients(linear_forward, linear_backward, _linear_inputs(), names=("x", "W", "b"))
    assert isinstance(res, GradcheckResult)
    assert res.passed and bool(res)
    assert set(res.errors) == {0, 1, 2} and max(res.errors.values()) <= 1e-7, str(res)
    assert [row.verdict for row in res.rows] == ["PASS", "PASS", "PASS"]
    assert [row["name"] for row in res.rows] == ["x", "W", "b"]
    assert res.rows[1].shape == (7, 5) and res.rows[1].max_abs_error < 1e-9
    assert all(ok for _, ok, _ in res.structural)
    assert res.worst == {} and res.diagnoses == {}
    assert res.numeric[1].shape == (7, 5)


@pytest.mark.parametrize("seed", range(4))
def test_correct_softmax_and_layernorm_pass_tightly(seed):
    # O(1) inputs with a large common offset for LayerNorm: where plain central differences at
    # h = 1e-6 lose digits to rounding, the five-point stencil stays far below 1e-7.
    rng = _rng(seed)
    x = rng.standard_normal((2, 3, 7))
    res = check_gradients(softmax_forward, softmax_backward, (x,), seed=seed)
    assert res.passed and res.errors[0] <= 1e-7, str(res)
    res = check_gradients(layernorm_forward, layernorm_backward, (x + 3.0,), seed=seed)
    assert res.passed and res.errors[0] <= 1e-7, str(res)


def test_scalar_loss_gets_a_random_dout():
    seen = []

    def forward(x):
        return 0.5 * np.sum(x ** 2), {"x": x}     # a 0-d loss

    def backward(dout, cache):
        seen.append(np.asarray(dout).copy())
        return dout * cache["x"]

    res = check_gradients(forward, backward, (_rng().standard_normal(5),))
    assert res.passed, str(res)
    assert seen[0].shape == () and seen[0] != 1.0


def test_caller_arrays_unchanged_and_work_is_float64():
    rng = _rng(2)
    x32 = rng.standard_normal((3, 4)).astype(np.float32)
    ids = np.array([0, 2, 1])
    x_before, ids_before = x32.copy(), ids.copy()
    dtypes = []

    def forward(x, ids):
        dtypes.append(x.dtype)
        return x[ids] * 2.0, {"ids": ids, "shape": x.shape}

    def backward(dout, cache):
        dx = np.zeros(cache["shape"])
        np.add.at(dx, cache["ids"], 2.0 * dout)   # repeated ids would accumulate
        return dx, None

    res = check_gradients(forward, backward, (x32, ids))
    assert res.passed, str(res)
    assert set(dtypes) == {np.dtype(np.float64)}
    assert x32.dtype == np.float32 and np.array_equal(x32, x_before) and np.array_equal(ids, ids_before)
    assert [row.verdict for row in res.rows] == ["PASS", "NOT FLOAT"]
    assert list(res.errors) == [0]


def test_none_gradient_and_absent_input_are_not_failures():
    x, W, _ = _linear_inputs()

    def forward(x, W, b):                        # b optional: passed as None
        return x @ W + (0.0 if b is None else b), {"x": x, "W": W}

    def backward(dout, cache):                   # W frozen: no gradient
        return dout @ cache["W"].T, None, None

    res = check_gradients(forward, backward, (x, W, None), names=("x", "W", "b"))
    assert res.passed, str(res)
    assert [row.verdict for row in res.rows] == ["PASS", "NO GRADIENT", "NOT FLOAT"]
    assert list(res.errors) == [0]
    assert "NO GRADIENT" in str(res) and "NOT FLOAT" in str(res)


# --- negative controls: wrong gradients, each with its diagnosis ----------------------------

def test_factor_one_over_sqrt_d_is_named():
    rng = _rng(3)
    Q, K = rng.standard_normal((3, 64)), rng.standard_normal((2, 64))

    def backward(dout, cache):                  # the scale applied twice in dQ
        dQ, dK = scores_backward(dout, cache)
        return dQ / np.sqrt(64), dK

    assert check_gradients(scores_forward, scores_backward, (Q, K)).passed
    res = check_gradients(scores_forward, backward, (Q, K), names=("Q", "K"))
    assert not res.passed
    assert [row.verdict for row in res.rows] == ["FAIL", "PASS"]
    text = _diagnoses(res, 0)
    # the forward is recognised as scaled_dot_scores, whose contract names the axis d
    assert "analytic = 0.125 x numeric" in text and "1/sqrt(d)" in text and "d = 64" in text, text
    assert "scale factor" in text
    assert 1 not in res.diagnoses


def test_factor_two_and_flipped_sign():
    x = _linear_inputs()

    def doubled(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return dx, dW, 2 * db

    def flipped(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return -dx, dW, db

    res = check_gradients(linear_forward, doubled, x)
    assert not res.passed and "analytic = 2 x numeric" in _diagnoses(res, 2), str(res)
    res = check_gradients(linear_forward, flipped, x)
    assert not res.passed and "wrong sign" in _diagnoses(res, 0), str(res)
    assert res.worst[0] and all(e["analytic"] == pytest.approx(-e["numeric"]) for e in res.worst[0])


def test_transposed_weight_gradient():
    x, W, b = _linear_inputs(d_in=5, d_out=5)       # square W

    def backward(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return dx, dW.T, db

    res = check_gradients(linear_forward, backward, (x, W, b), names=("x", "W", "b"))
    assert not res.passed and res.rows[1].verdict == "FAIL"
    assert "transposed" in _diagnoses(res, 1), str(res)


def test_missing_identity_term():
    rng = _rng(4)
    x, W = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))

    def forward(x, W):                               # y = x * W + x  (a residual around x * W)
        return x * W + x, {"x": x, "W": W}

    def backward(dout, cache):                       # dx forgets the identity term "+ dout"
        return dout * cache["W"], dout * cache["x"]

    res = check_gradients(forward, backward, (x, W), names=("x", "W"))
    assert not res.passed and [row.verdict for row in res.rows] == ["FAIL", "PASS"]
    text = _diagnoses(res, 0)
    assert "numeric - analytic = dout" in text and "term is missing" in text, text
    assert "identity" in text


def test_all_zero_gradient():
    def backward(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return dx, np.zeros_like(dW), db

    res = check_gradients(linear_forward, backward, _linear_inputs())
    assert not res.passed and res.rows[1].verdict == "FAIL"
    assert "all zeros" in _diagnoses(res, 1), str(res)


def test_backward_ignoring_dout():
    def backward(dout, cache):                       # computed for dout = ones
        return np.ones_like(dout) @ cache["W"].T, None, None

    x, W, b = _linear_inputs()
    res = check_gradients(linear_forward, backward, (x, W, b))
    assert not res.passed
    assert not _structural(res, "backward(0) = 0")[0]
    assert not _structural(res, "backward linear in dout")[0]
    text = _diagnoses(res, 0)
    assert "does not scale with dout" in text and "ignores dout" in text, text
    assert "does not scale with dout" in str(res)


def test_missing_bias_gradient_and_nan_gradient():
    def no_db(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return dx, dW, np.zeros_like(db)

    res = check_gradients(linear_forward, no_db, _linear_inputs())
    assert "numeric - analytic = dout summed over the broadcast axes" in _diagnoses(res, 2), str(res)

    def nan_dx(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        dx = dx.copy()
        dx[0, 1, 2] = np.nan
        return dx, dW, db

    res = check_gradients(linear_forward, nan_dx, _linear_inputs())
    assert not res.passed and res.rows[0].verdict == "FAIL" and "NaN" in _diagnoses(res, 0)


@pytest.mark.parametrize("axis, index, tag", [(0, 3, "the last"), (1, 0, "the first")])
def test_error_confined_to_one_slice(axis, index, tag):
    x = _rng(5).standard_normal((4, 5))

    def backward(dout, cache):
        dx = softmax_backward(dout, cache).copy()
        slc = [slice(None), slice(None)]
        slc[axis] = index
        dx[tuple(slc)] *= 1.5                        # wrong in one row / one column only
        return dx

    res = check_gradients(softmax_forward, backward, (x,))
    assert not res.passed
    text = _diagnoses(res, 0)
    assert f"index {index} ({tag}) of axis {axis}" in text, text
    assert "analytic = 1.5 x numeric" in text
    assert all(e["index"][axis] == index for e in res.worst[0])


def test_relu_at_an_exact_kink():
    x = _rng(6).standard_normal((3, 4))
    x[np.abs(x) < 0.05] = 0.3                      # others well away from the kink
    x[0, 0] = x[2, 3] = 0.0                         # exactly at the kink
    res = check_gradients(relu_forward, relu_backward, (x,))
    assert res.passed, str(res)
    assert res.rows[0].verdict in ("INCONCLUSIVE", "PASS")
    assert {e["index"] for e in res.inconclusive.get(0, [])} <= {(0, 0), (2, 3)}
    assert res.errors[0] <= 1e-7

    # a wrong ReLU backward (passes dout through where x < 0) still fails away from the kink
    res = check_gradients(relu_forward, lambda dout, cache: dout.copy(), (x,))
    assert not res.passed and res.rows[0].verdict == "FAIL"
    assert all(x[e["index"]] < 0 for e in res.worst[0])
    assert "numeric 0" in _diagnoses(res, 0)


def test_relu_kink_in_directional_mode_is_not_a_failure():
    x = np.array([[0.0, 1.0, -0.5], [0.7, 0.0, -1.2]])
    res = check_gradients(relu_forward, relu_backward, (x,), mode="directional")
    assert res.passed, str(res)


def test_relu_outside_the_one_sided_range_fails_even_at_the_kink():
    x = np.array([0.0, 1.0, -1.0])
    def backward(dout, cache):                     # 5 at x = 0: outside the one-sided range [0, 1]
        return dout * ((cache["x"] > 0) + 5.0 * (cache["x"] == 0))

    res = check_gradients(relu_forward, backward, (x,))
    assert not res.passed and res.worst[0][0]["index"] == (0,)


# --- negative controls: structural ---------------------------------------------------------

def test_backward_modifying_cache_or_inputs_or_dout_is_caught():
    x = _rng(7).standard_normal((3, 5))
    x_before = x.copy()

    def modifies_cache(dout, cache):
        cache["A"] *= 1.0 + 1e-3                       # a derived array, not an input
        return softmax_backward(dout, {"A": cache["A"] / (1.0 + 1e-3)})

    res = check_gradients(softmax_forward, modifies_cache, (x,))
    ok, msg = _structural(res, "backward leaves cache unchanged")
    assert not res.passed and not ok and "cache['A']" in msg
    assert _structural(res, "backward leaves inputs unchanged")[0]

    def forward(x):
        return 2.0 * x, {"x": x}                       # the cache holds the input itself

    def modifies_input(dout, cache):
        cache["x"] += 1.0
        return 2.0 * dout

    res = check_gradients(forward, modifies_input, (x,))
    assert not _structural(res, "backward leaves inputs unchanged")[0]
    assert not _structural(res, "backward leaves cache unchanged")[0]
    assert not res.passed and np.array_equal(x, x_before)   # the caller's array is untouched

    def modifies_dout(dout, cache):
        dout *= 2.0
        return dout

    res = check_gradients(forward, modifies_dout, (x,))
    assert not res.passed and not _structural(res, "backward leaves dout unchanged")[0]


def test_nondeterministic_forward_is_caught_and_seeded_one_passes():
    x = _rng(8).standard_normal((4, 6))
    global_rng = np.random.default_rng(0)

    def dropout_forward(x, *, p, rng):
        keep = (rng.random(x.shape) >= p).astype(x.dtype)
        return x * keep / (1 - p), {"scale": keep / (1 - p)}

    def dropout_backward(dout, cache):
        return dout * cache["scale"]

    res = check_gradients(lambda x: dropout_forward(x, p=0.3, rng=global_rng), dropout_backward, (x,))
    assert not res.passed and not _structural(res, "forward deterministic")[0]
    assert res.rows[0].verdict == "INCONCLUSIVE"

    def seeded(x):                                 # what registry.bind does with an int rng
        return dropout_forward(x, p=0.3, rng=np.random.default_rng(123))

    res = check_gradients(seeded, dropout_backward, (x,))
    assert res.passed and res.errors[0] <= 1e-7, str(res)


def test_nondeterministic_backward_is_caught():
    noise = np.random.default_rng(0)
    x = _rng(9).standard_normal(4)
    res = check_gradients(relu_forward, lambda dout, cache: dout * (cache["x"] > 0) + 0 * noise.random(),
                          (np.abs(x) + 0.1,))
    assert res.passed                              # 0 * random: bitwise repeatable
    res = check_gradients(relu_forward, lambda dout, cache: dout * (1 + 1e-12 * noise.random()),
                          (np.abs(x) + 0.1,))
    assert not res.passed and not _structural(res, "backward deterministic")[0]


def test_wrong_shape_dtype_count_and_kind_are_failures():
    x, W, b = _linear_inputs()

    def wrong_shape(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return dx, dW.T, db

    res = check_gradients(linear_forward, wrong_shape, (x, W, b))
    assert not res.passed and not _structural(res, "gradient shapes")[0] and res.rows[1].verdict == "FAIL"
    assert "shape" in _diagnoses(res, 1)

    def float32_grad(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return dx, dW.astype(np.float32), db

    res = check_gradients(linear_forward, float32_grad, (x, W, b))
    assert not res.passed and not _structural(res, "gradient dtypes")[0] and res.rows[1].verdict == "FAIL"
    assert "float32" in _diagnoses(res, 1)
    assert "does not scale with dout" not in _diagnoses(res, 1)   # float32 rounding is not non-linearity

    res = check_gradients(linear_forward, lambda d, c: linear_backward(d, c)[:2], (x, W, b))
    ok, msg = _structural(res, "one gradient per input")
    assert not res.passed and not ok and "2 gradients for 3 inputs" in msg

    res = check_gradients(softmax_forward, lambda d, c: (softmax_backward(d, c),), (x,))
    assert not res.passed and "bare" in _structural(res, "one gradient per input")[1]

    ids = np.array([1, 0, 2])

    def gather_forward(table, ids):
        return table[ids], {"ids": ids, "n": table.shape[0]}

    def gather_backward(dout, cache):            # wrongly returns a gradient for the ids
        dtable = np.zeros((cache["n"], dout.shape[-1]))
        np.add.at(dtable, cache["ids"], dout)
        return dtable, np.zeros(cache["ids"].shape)

    res = check_gradients(gather_forward, gather_backward, (W, ids))
    assert not res.passed and not _structural(res, "no gradient for non-float inputs")[0]
    assert res.rows[0].verdict == "PASS" and res.rows[1].verdict == "NOT FLOAT"


def test_dout_is_random_reproducible_and_not_the_input_stream():
    x = np.random.default_rng(0).standard_normal((3, 4))    # inputs from the same seed as the check
    first = check_gradients(softmax_forward, softmax_backward, (x,), seed=0)
    again = check_gradients(softmax_forward, softmax_backward, (x,), seed=0)
    other = check_gradients(softmax_forward, softmax_backward, (x,), seed=1)
    assert np.array_equal(first.dout, again.dout) and not np.array_equal(first.dout, other.dout)
    assert not np.allclose(first.dout, 1.0) and not np.allclose(first.dout, x)
    assert np.array_equal(first.numeric[0], again.numeric[0])


# --- directional mode, options, report ------------------------------------------------------

def test_directional_mode_catches_wrong_gradients_and_tiny_bias():
    x, W, b = _linear_inputs(seed=10)
    res = check_gradients(linear_forward, linear_backward, (x, W, b), mode="directional")
    assert res.passed and max(res.errors.values()) <= 1e-7, str(res)
    assert res.numeric[0].shape == (8 + 4,)        # 8 directions + 4 coordinates

    def wrong_dW(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return dx, dW * 1.01, db

    res = check_gradients(linear_forward, wrong_dW, (x, W, b), mode="directional")
    assert not res.passed and res.rows[1].verdict == "FAIL"

    def wrong_bias(dout, cache):                  # only the last entry of the bias is wrong
        dx, dW, db = linear_backward(dout, cache)
        db = db.copy()
        db[-1] += 0.5
        return dx, dW, db

    res = check_gradients(linear_forward, wrong_bias, (x, W, b), mode="directional", n_directions=0)
    assert not res.passed and res.rows[2].verdict == "FAIL"
    assert res.worst[2][0]["index"] == (4,)


def test_unknown_mode_and_bad_arguments():
    x = _linear_inputs()
    with pytest.raises(ValueError, match="mode"):
        check_gradients(linear_forward, linear_backward, x, mode="sampled")
    with pytest.raises(ValueError, match="names"):
        check_gradients(linear_forward, linear_backward, x, names=("x", "W"))
    with pytest.raises(TypeError, match="tuple"):
        check_gradients(softmax_forward, softmax_backward, x[0])


def test_report_text_and_reproduce_line():
    def backward(dout, cache):
        dx, dW, db = linear_backward(dout, cache)
        return -dx, dW, db

    res = check_gradients(linear_forward, backward, _linear_inputs(), names=("x", "W", "b"), seed=7)
    text = str(res)
    assert res.seed == 7 and res.h == 1e-3 and res.mode == "full"
    assert res.reproduce == "check_gradients(forward, backward, inputs, seed=7, h=0.001, mode='full')"
    for piece in ("max abs err", "max rel err", "verdict", "(2, 3, 7)", "FAIL", "PASS", "seed 7",
                  "reproduce: " + res.reproduce, "wrong sign", "analytic", "numeric"):
        assert piece in text, piece
    assert text.splitlines()[0].startswith("gradient check FAILED")
    res = check_gradients(linear_forward, linear_backward, _linear_inputs(), mode="directional",
                          n_directions=3)
    assert "n_directions=3" in res.reproduce and "seed 0" in str(res)


def test_gradient_zero_in_exact_arithmetic_passes_with_no_spurious_error():
    """A shift added to every score of a softmax row cancels: d(shift) = 0 up to rounding.

    Rounding leaves about 1e-13 in the analytic gradient; that is neither a linearity failure
    nor a relative error of 1e-5 against rel_error's 1e-8 floor.
    """
    from numpytfmr import softmax_forward, softmax_backward

    def forward(s, c):
        return softmax_forward(s + c[:, None])   # c shifts every score of its row

    def backward(dout, cache):
        ds = softmax_backward(dout, cache)
        return ds, ds.sum(axis=-1)          # dc = sum_j dS_j = 0 in exact arithmetic

    rng = np.random.default_rng(0)
    s, c = rng.standard_normal((5, 7)) * 3.0, rng.standard_normal(5)
    res = check_gradients(forward, backward, (s, c), names=("s", "c"))
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-7, str(res)


# --- notebook 09: every exercise prints the hint its answer key gives ---------------------

_EXERCISE_HINTS = {
    1: ["analytic = 4 x numeric (4 = sqrt(d_k) = 1/scale, d_k = 16, scale = 0.25)",
        'known wrong backward "no scale"'],
    2: ["numeric - analytic = c_i * y along axis -1", 'known wrong backward "plain mean"'],
    3: ["c_i * xhat along axis -1", "- xhat * mean(dxhat * xhat)"],
    4: ["transposed: analytic equals numeric with the last two axes swapped"],
    5: ["numeric - analytic = dout"],
    6: ["wrong sign: analytic = -1 x numeric"],
    7: ["shape (3, 5) but the input has shape (5,)"],
    8: ["backward changed dout in place"],
    9: ["repeated ids must accumulate", "np.add.at"],
    10: ["it ignores dout"],
    11: ["forward deterministic", "fresh rng from a fixed seed"],
    12: ["c_i * y along axis -1", "- y * sum(dout * y)"],
    13: ["constant along axis -1 (d = 7) within each row", "`- mean(dxhat)`"],
    14: ["d/(d-1) = 7/6 x the right one", 'known wrong backward "unbiased variance"'],
    15: ["runs over axis -3 where it must run over axis -1"],
    16: ["your f'(x) is wrong", "x * phi(x) term"],
    17: ['softmax\'s known wrong backward "diagonal only"'],
    18: ['dpo_loss\'s known wrong backward "sigmoid(+margin)"'],
}


def test_notebook_09_exercises_print_the_hints_of_their_answer_key(monkeypatch):
    """Runs the notebook's code cells in order (without a kernel) and checks the output of
    each exercise against its answer: the hint must be unambiguous and the one the key gives."""
    import contextlib
    import io
    import json
    import re
    from pathlib import Path

    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    path = Path(__file__).resolve().parent.parent / "notebooks" / "09_gradcheck_exercises.ipynb"
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    namespace, outputs, exercise = {"__name__": "notebook09"}, {}, None
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            found = re.findall(r"^## Exercise (\d+)", source, flags=re.M)
            exercise = int(found[-1]) if found else (None if source.startswith("## ") else exercise)
            continue
        code = "\n".join(line for line in source.splitlines() if not line.startswith("%"))
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, str(path), "exec"), namespace)  # noqa: S102 -- our own notebook
        if exercise is not None:
            outputs[exercise] = outputs.get(exercise, "") + buffer.getvalue()
    assert sorted(outputs) == sorted(_EXERCISE_HINTS), sorted(outputs)
    for k, hints in _EXERCISE_HINTS.items():
        for hint in hints:
            assert hint in outputs[k], f"exercise {k}: {hint!r} not in\n{outputs[k]}"
        assert "no simple pattern fits" not in outputs[k], outputs[k]
    answers = "".join(cells[-1]["source"])
    assert "4 = \\sqrt{d_k}" in answers and "diagonal only" in answers and "sigmoid(+margin)" in answers
