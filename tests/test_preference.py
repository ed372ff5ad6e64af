"""Preference losses (003 ch. 9): sequence log-probs, Bradley-Terry, DPO and its variants."""
import math

import numpy as np
import pytest

from numpytfmr.gradcheck import rel_error
from numpytfmr.preference import (
    bradley_terry_loss_backward,
    bradley_terry_loss_forward,
    dpo_loss_backward,
    dpo_loss_forward,
    dpo_metrics,
    log_sigmoid,
    sequence_logprobs_backward,
    sequence_logprobs_forward,
)
from numpytfmr.registry import bind, posttraining

SPECS = {s.name: s for s in posttraining.OPS}
NAMES = ("sequence_logprobs", "dpo_loss", "bradley_terry_loss")
CASES = [(n, c) for n in NAMES
         for c in SPECS[n].make_cases(np.random.default_rng(0), np.float64)]


def fd_errors(forward, backward, args, *, h=1e-3, seed=0):
    """Max relative error of each returned gradient against finite differences.

    Five-point stencil, (8 (f(+h) - f(-h)) - (f(+2h) - f(-2h))) / 12h, on the scalar
    sum(out * dout) with a random dout; differences are taken first, so an output that
    does not depend on an entry (a masked position, a pair past the hinge) gives exactly zero.
    """
    args = [a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
            for a in args]
    out, cache = forward(*args)
    dout = np.random.default_rng(seed).standard_normal(np.shape(out))
    grads = backward(dout, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)
    errors = {}
    for i, g in enumerate(grads):
        if g is None:
            continue

        def f(j, c, i=i):
            a = list(args)
            a[i] = args[i].copy()
            a[i].flat[j] += c * h
            return np.sum(forward(*a)[0] * dout)

        num = np.zeros(args[i].shape)
        for j in range(args[i].size):
            num.flat[j] = (8 * (f(j, 1) - f(j, -1)) - (f(j, 2) - f(j, -2))) / (12 * h)
        assert g.shape == args[i].shape
        errors[i] = rel_error(g, num)
    return errors


def _label(case):
    return case[0] + ": " + case[1].label


# ---------------------------------------------------------------- registry cases

# (finite differences of every registered case: tests/test_registry.py)

@pytest.mark.parametrize("name_case", CASES, ids=_label)
def test_float32_in_float32_out(name_case):
    name, case = name_case
    spec = SPECS[name]
    args = tuple(a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float64
                 else a for a in case.args)
    kwargs = {k: (val.astype(np.float32) if isinstance(val, np.ndarray) else val)
              for k, val in case.kwargs.items()}
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out, cache = bind(spec.forward, kwargs)(*args)
        assert out.dtype == np.float32 and np.all(np.isfinite(out))
        grads = spec.backward(np.ones_like(out), cache)
    grads = grads if isinstance(grads, tuple) else (grads,)
    assert all(g.dtype == np.float32 and np.all(np.isfinite(g)) for g in grads if g is not None)


# ---------------------------------------------------------------- log_sigmoid

def test_log_sigmoid_values_and_extremes():
    x = np.linspace(-30, 30, 61)
    np.testing.assert_allclose(log_sigmoid(x), np.log(1 / (1 + np.exp(-x))), rtol=0, atol=1e-15)
    np.testing.assert_allclose(log_sigmoid(x), -np.logaddexp(0, -x), rtol=1e-14)   # tails too
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        big = log_sigmoid(np.array([1e4, -1e4, 800.0, -800.0]))
    assert big[0] == 0.0 and big[1] == -1e4 and big[2] == 0.0 and big[3] == -800.0
    assert log_sigmoid(np.float32(3.0)).dtype == np.float32
    assert log_sigmoid(0.0) == pytest.approx(-math.log(2), abs=1e-15)


# ---------------------------------------------------------------- sequence log-probs

def test_sequence_logprobs_by_hand():
    # one sequence, V = 2: logits [0, log 3] give p = [1/4, 3/4]; prompt position masked
    logits = np.array([[[5.0, -2.0], [0.0, math.log(3)], [0.0, math.log(3)]]])
    targets = np.array([[0, 1, 0]])
    mask = np.array([[False, True, True]])
    out, _ = sequence_logprobs_forward(logits, targets, mask)
    assert out.shape == (1,)
    assert out[0] == pytest.approx(math.log(3 / 4) + math.log(1 / 4), abs=1e-15)


def test_sequence_logprobs_matches_a_loop():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 3, 5, 7))
    targets = rng.integers(0, 7, size=(2, 3, 5))
    mask = rng.random((2, 3, 5)) < 0.6
    out, _ = sequence_logprobs_forward(logits, targets, mask)
    assert out.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            total = 0.0
            for t in range(5):
                if mask[i, j, t]:
                    z = logits[i, j, t]
                    total += z[targets[i, j, t]] - math.log(sum(math.exp(zk) for zk in z))
            assert out[i, j] == pytest.approx(total, abs=1e-12)


def test_sequence_logprobs_mask_forms_padding_ids_and_zero_gradient():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((2, 4, 5))
    targets = rng.integers(0, 5, size=(2, 4))
    mask = np.array([[0, 1, 1, 1], [0, 0, 1, 0]])
    a, cache = sequence_logprobs_forward(logits, targets, mask.astype(bool))
    b, _ = sequence_logprobs_forward(logits, targets, mask.astype(np.float32))
    padded = np.where(mask == 1, targets, -100)             # ids at masked positions ignored
    c, _ = sequence_logprobs_forward(logits, padded, mask)
    assert np.array_equal(a, b) and np.array_equal(a, c)
    dlogits = sequence_logprobs_backward(np.array([1.5, -0.7]), cache)[0]
    assert np.all(dlogits[mask == 0] == 0)                  # prompt and padding: no gradient
    # counted positions: dout * (onehot - softmax); each row sums to zero
    np.testing.assert_allclose(dlogits.sum(-1), 0, atol=1e-15)
    empty, _ = sequence_logprobs_forward(logits, targets, np.zeros((2, 4), bool))
    assert np.array_equal(empty, np.zeros(2))


def test_sequence_logprobs_large_logits_finite():
    logits = np.array([[[1e4, -1e4, 0.0], [-1e4, 1e4, 1e4]]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out, cache = sequence_logprobs_forward(logits, np.array([[1, 2]]), np.ones((1, 2), bool))
        d = sequence_logprobs_backward(np.ones(1), cache)[0]
    assert out[0] == pytest.approx(-2e4 - math.log(2), rel=1e-15)
    assert np.all(np.isfinite(d))


# ---------------------------------------------------------------- DPO

PC, PR, RC, RR = (np.array([v]) for v in (-10.0, -12.0, -11.0, -11.0))


def test_dpo_fixed_case():
    # beta 0.1: rewards beta (pc - rc) = +0.1, beta (pr - rr) = -0.1, z = 0.2
    loss, cache = dpo_loss_forward(PC, PR, RC, RR, beta=0.1)
    assert round(float(loss), 6) == 0.598139               # log(1 + e^-0.2)
    assert float(loss) == pytest.approx(math.log1p(math.exp(-0.2)), abs=1e-15)
    loss_ls, _ = dpo_loss_forward(PC, PR, RC, RR, beta=0.1, label_smoothing=0.1)
    assert round(float(loss_ls), 6) == 0.618139            # 0.9 * 0.598139 + 0.1 * 0.798139
    loss_h, _ = dpo_loss_forward(PC, PR, RC, RR, beta=0.1, loss_type="hinge")
    assert round(float(loss_h), 6) == 0.8
    loss_i, _ = dpo_loss_forward(PC, PR, RC, RR, beta=0.1, loss_type="ipo")
    assert float(loss_i) == pytest.approx((2 - 1 / 0.2) ** 2)   # (h - 1/(2 beta))^2 = 9
    assert round(float(cache["chosen_rewards"][0]), 6) == 0.1
    assert round(float(cache["rejected_rewards"][0]), 6) == -0.1
    assert round(float(cache["margins"][0]), 6) == 0.2
    m = dpo_metrics(cache)
    assert m["rewards/accuracies"] == 1.0
    assert round(m["rewards/margins"], 6) == 0.2
    assert loss.shape == () and loss.dtype == np.float64


def test_dpo_gradients_by_closed_form():
    # d loss / d pc = beta (-(1-eps) sigma(-z) + eps sigma(z)) / N,  d/d pr = minus that
    sig = lambda t: 1 / (1 + math.exp(-t))  # noqa: E731
    for eps in (0.0, 0.1):
        _, cache = dpo_loss_forward(PC, PR, RC, RR, beta=0.1, label_smoothing=eps)
        dpc, dpr, drc, drr = dpo_loss_backward(1.0, cache)
        expected = 0.1 * (-(1 - eps) * sig(-0.2) + eps * sig(0.2))
        assert dpc[0] == pytest.approx(expected, rel=1e-14)
        assert dpr[0] == pytest.approx(-expected, rel=1e-14)
        assert drc is None and drr is None
    _, cache = dpo_loss_forward(PC, PR, RC, RR, beta=0.1, loss_type="hinge")
    assert dpo_loss_backward(1.0, cache)[0][0] == pytest.approx(-0.1)
    _, cache = dpo_loss_forward(PC, PR, RC, RR, beta=0.1, loss_type="ipo")
    assert dpo_loss_backward(1.0, cache)[0][0] == pytest.approx(2 * (2 - 5))


@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dpo_margins_of_1e4_finite_with_exact_gradients(eps, dtype):
    pc = np.array([1e4, -1e4, 5e3, -5e3], dtype=dtype)
    zero = np.zeros(4, dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        loss, cache = dpo_loss_forward(pc, zero, zero, zero, beta=1.0, label_smoothing=eps)
        dpc, dpr, _, _ = dpo_loss_backward(1.0, cache)
    # z = +-1e4: sigma(-z) is 0 or 1 to working precision, log sigma(-z) = -|z| or 0
    expected_loss = ((1 - eps) * 0 + eps * 1e4 + (1 - eps) * 1e4 + eps * 0
                     + eps * 5e3 + (1 - eps) * 5e3) / 4
    assert float(loss) == pytest.approx(expected_loss, rel=1e-6)
    expected = np.array([eps, -(1 - eps), eps, -(1 - eps)]) / 4
    np.testing.assert_allclose(dpc, expected.astype(dtype), rtol=1e-6, atol=0)
    np.testing.assert_allclose(dpr, -expected.astype(dtype), rtol=1e-6, atol=0)
    assert dpc.dtype == dtype


def test_dpo_with_the_notes_per_pair_label():
    # 003 §9.2 listing: -mean(p log sigma(z) + (1-p) log sigma(-z)) is label_smoothing = 1 - p
    rng = np.random.default_rng(3)
    pc, pr, rc, rr = (-rng.uniform(5, 20, 8) for _ in range(4))
    p = rng.integers(0, 2, size=8).astype(float)
    beta = 1.0
    z = beta * ((pc - rc) - (pr - rr))
    naive = -np.mean(p * np.log(1 / (1 + np.exp(-z))) + (1 - p) * np.log(1 / (1 + np.exp(z))))
    loss, _ = dpo_loss_forward(pc, pr, rc, rr, beta=beta, label_smoothing=1 - p)
    assert float(loss) == pytest.approx(naive, rel=1e-12)


def test_dpo_swap_symmetry_and_bradley_terry_link():
    rng = np.random.default_rng(4)
    pc, pr, rc, rr = (-rng.uniform(5, 20, 6) for _ in range(4))
    # flipping the pair is the same as flipping the label: eps -> 1 - eps
    a, _ = dpo_loss_forward(pc, pr, rc, rr, beta=0.3, label_smoothing=0.2)
    b, _ = dpo_loss_forward(pr, pc, rr, rc, beta=0.3, label_smoothing=0.8)
    assert float(a) == pytest.approx(float(b), rel=1e-14)
    # DPO with eps = 0 is Bradley-Terry on the implicit rewards beta log(pi/pi_ref)
    dpo, _ = dpo_loss_forward(pc, pr, rc, rr, beta=0.3)
    bt, _ = bradley_terry_loss_forward(0.3 * (pc - rc), 0.3 * (pr - rr))
    assert float(dpo) == pytest.approx(float(bt), rel=1e-14)


def test_dpo_metrics_accuracy():
    pc = np.array([-1.0, -2.0, -3.0, -4.0])
    pr = np.array([-2.0, -1.0, -5.0, -4.0])
    ref = np.zeros(4)
    _, cache = dpo_loss_forward(pc, pr, ref, ref, beta=0.5)
    m = dpo_metrics(cache)
    assert m["rewards/accuracies"] == 0.5                  # pairs 0 and 2; a tie is not a win
    assert m["rewards/chosen"] == pytest.approx(0.5 * np.mean(pc))
    assert m["rewards/rejected"] == pytest.approx(0.5 * np.mean(pr))
    assert m["rewards/margins"] == pytest.approx(0.5 * np.mean(pc - pr))


def test_dpo_through_sequence_logprobs():
    # d loss / d logits of the policy, chained by hand, against finite differences
    rng = np.random.default_rng(5)
    Lc, Lr = rng.standard_normal((2, 2, 4, 5))
    tc, tr = rng.integers(0, 5, size=(2, 2, 4))
    mc = np.array([[0, 1, 1, 1], [0, 0, 1, 1]], bool)
    mr = np.array([[0, 1, 1, 0], [0, 0, 1, 1]], bool)
    refc, refr = np.array([-6.0, -5.0]), np.array([-7.0, -4.0])

    def forward(Lc, Lr):
        pc, cc = sequence_logprobs_forward(Lc, tc, mc)
        pr, cr = sequence_logprobs_forward(Lr, tr, mr)
        loss, cd = dpo_loss_forward(pc, pr, refc, refr, beta=0.5, label_smoothing=0.1)
        return loss, (cc, cr, cd)

    def backward(dout, caches):
        cc, cr, cd = caches
        dpc, dpr, _, _ = dpo_loss_backward(dout, cd)
        return (sequence_logprobs_backward(dpc, cc)[0], sequence_logprobs_backward(dpr, cr)[0])

    errors = fd_errors(forward, backward, [Lc, Lr])
    assert max(errors.values()) <= 1e-7, errors


@pytest.mark.parametrize("loss_type", ["hinge", "ipo"])
def test_label_smoothing_refused_for_hinge_and_ipo(loss_type):
    with pytest.raises(ValueError, match=r"^dpo_loss_forward: label_smoothing .* 'sigmoid' only"):
        dpo_loss_forward(PC, PR, RC, RR, label_smoothing=0.1, loss_type=loss_type)
    with pytest.raises(ValueError, match=r"^dpo_loss_forward: label_smoothing"):
        dpo_loss_forward(PC, PR, RC, RR, label_smoothing=np.array([0.1]), loss_type=loss_type)
    loss, _ = dpo_loss_forward(PC, PR, RC, RR, label_smoothing=0.0, loss_type=loss_type)
    assert np.isfinite(loss)


def test_hinge_is_zero_past_the_margin():
    pc = np.array([-10.0, -10.0])
    pr = np.array([-30.0, -10.5])                          # z = 2.0 and 0.05 with beta 0.1
    ref = np.full(2, -10.0)
    loss, cache = dpo_loss_forward(pc, pr, ref, ref, beta=0.1, loss_type="hinge")
    assert float(loss) == pytest.approx((0 + 0.95) / 2)
    dpc = dpo_loss_backward(1.0, cache)[0]
    assert dpc[0] == 0.0 and dpc[1] == pytest.approx(-0.1 / 2)


# ---------------------------------------------------------------- Bradley-Terry

def test_bradley_terry_by_hand():
    loss, _ = bradley_terry_loss_forward(np.array([0.0]), np.array([0.0]))
    assert float(loss) == pytest.approx(math.log(2), abs=1e-15)
    # the notes' P(i > j) = p_i / (p_i + p_j), with p = exp(r)
    rc, rr = 1.3, -0.4
    loss, cache = bradley_terry_loss_forward(np.array([rc]), np.array([rr]))
    assert math.exp(-float(loss)) == pytest.approx(math.exp(rc) / (math.exp(rc) + math.exp(rr)),
                                                   rel=1e-14)
    dc, dr = bradley_terry_loss_backward(1.0, cache)
    assert dc[0] == pytest.approx(-1 / (1 + math.exp(rc - rr)), rel=1e-14)   # -sigma(-(rc - rr))
    assert dr[0] == -dc[0]


def test_bradley_terry_extreme_gaps():
    rc = np.array([1e4, -1e4])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        loss, cache = bradley_terry_loss_forward(rc, np.zeros(2))
        dc, dr = bradley_terry_loss_backward(2.0, cache)
    assert float(loss) == 5e3
    assert dc[0] == 0.0 and dc[1] == -1.0 and np.array_equal(dr, -dc)


# ---------------------------------------------------------------- bad input and purity

def test_inputs_not_modified():
    rng = np.random.default_rng(6)
    arrays = [-rng.uniform(5, 20, 4) for _ in range(4)]
    saved = [a.copy() for a in arrays]
    loss, cache = dpo_loss_forward(*arrays, label_smoothing=0.1)
    dout = np.array(1.0)
    dpo_loss_backward(dout, cache)
    logits = rng.standard_normal((2, 3, 5))
    targets = rng.integers(0, 5, size=(2, 3))
    mask = np.ones((2, 3), bool)
    lsaved = (logits.copy(), targets.copy(), mask.copy())
    out, c = sequence_logprobs_forward(logits, targets, mask)
    d = np.ones(2)
    sequence_logprobs_backward(d, c)
    for a, s in zip(arrays + [logits, targets, mask], saved + list(lsaved)):
        assert np.array_equal(a, s)
    assert dout == 1.0 and np.all(d == 1)


BAD = [
    (lambda: dpo_loss_forward(PC, np.ones(2), RC, RR), ValueError,
     "dpo_loss_forward: policy_rejected has shape (2,)"),
    (lambda: dpo_loss_forward(PC, PR, RC, RR, beta=0.0), ValueError, "dpo_loss_forward: beta"),
    (lambda: dpo_loss_forward(PC, PR, RC, RR, loss_type="kto"), ValueError,
     "dpo_loss_forward: loss_type is 'kto'"),
    (lambda: dpo_loss_forward(PC, PR, RC, RR, label_smoothing=1.5), ValueError,
     "dpo_loss_forward: label_smoothing is 1.5"),
    (lambda: dpo_loss_forward(PC, PR, RC, RR, label_smoothing=np.ones(3) / 2), ValueError,
     "dpo_loss_forward: label_smoothing has shape (3,)"),
    (lambda: dpo_loss_forward(np.array([1]), PR, RC, RR), TypeError,
     "dpo_loss_forward: policy_chosen"),
    (lambda: dpo_loss_forward(*(np.zeros(0),) * 4), ValueError,
     "dpo_loss_forward: policy_chosen is empty"),
    (lambda: bradley_terry_loss_forward(np.ones(3), np.ones(2)), ValueError,
     "bradley_terry_loss_forward: the leading (batch) axes of r_chosen (3,), r_rejected (2,)"),
    (lambda: bradley_terry_loss_forward(np.ones(3), np.ones(1)), ValueError,
     "bradley_terry_loss_forward: r_rejected has shape (1,) but r_chosen has shape (3,)"),
    (lambda: bradley_terry_loss_forward(np.ones(0), np.ones(0)), ValueError,
     "bradley_terry_loss_forward: r_chosen is empty"),
    (lambda: sequence_logprobs_forward(np.ones((2, 3, 5)), np.zeros((2, 4), int),
                                       np.ones((2, 4), bool)), ValueError,
     "sequence_logprobs_forward: targets has shape (2, 4)"),
    (lambda: sequence_logprobs_forward(np.ones((2, 3, 5)), np.zeros((2, 3)),
                                       np.ones((2, 3), bool)), TypeError,
     "sequence_logprobs_forward: targets has dtype float64"),
    (lambda: sequence_logprobs_forward(np.ones((2, 3, 5)), np.full((2, 3), 5),
                                       np.ones((2, 3), bool)), ValueError,
     "sequence_logprobs_forward: targets at counted"),
    (lambda: sequence_logprobs_forward(np.ones((2, 3, 5)), np.zeros((2, 3), int),
                                       np.full((2, 3), 0.5)), ValueError,
     "sequence_logprobs_forward: mask holds the value 0.5"),
    (lambda: sequence_logprobs_forward(np.ones((2, 3, 5)), np.zeros((2, 3), int),
                                       np.ones((3,), bool)), ValueError,
     "sequence_logprobs_forward: mask has shape (3,)"),
    (lambda: sequence_logprobs_forward(np.ones(5), np.zeros((), int), True), ValueError,
     "sequence_logprobs_forward: logits has shape (5,)"),
    (lambda: dpo_loss_backward(np.ones(2), dpo_loss_forward(PC, PR, RC, RR)[1]), ValueError,
     "dpo_loss_backward: dout"),
]


@pytest.mark.parametrize("call, exc, start", BAD, ids=[b[2] for b in BAD])
def test_bad_input(call, exc, start):
    with pytest.raises(exc) as info:
        call()
    assert str(info.value).startswith(start), str(info.value)


# ---------------------------------------------------------------- the contract layer

@pytest.mark.parametrize("name", NAMES)
def test_backward_refuses_a_wrong_dout_and_a_foreign_cache(name):
    spec = SPECS[name]
    case = spec.make_cases(np.random.default_rng(0), np.float64)[0]
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    with pytest.raises(ValueError, match=rf"^{name}_backward: dout has shape \(5,\); expected "
                                         rf"the forward output's shape"):
        spec.backward(np.ones(5), cache)
    other = "bradley_terry_loss" if name != "bradley_terry_loss" else "dpo_loss"
    other_case = SPECS[other].make_cases(np.random.default_rng(0), np.float64)[0]
    _, foreign = bind(SPECS[other].forward, other_case.kwargs)(*other_case.args)
    with pytest.raises(TypeError, match=rf"^{name}_backward: cache is the cache of {other}_forward"):
        spec.backward(np.ones(np.shape(out)), foreign)


def test_float32_pairs_with_float64_reference_give_float64_and_gradients_keep_their_dtypes():
    pc, pr = (np.array([-3.0, -4.0], np.float32) for _ in range(2))
    rc, rr = np.array([-3.5, -4.5]), np.array([-3.5, -4.5])
    loss, cache = dpo_loss_forward(pc, pr, rc, rr, beta=0.5)
    assert np.asarray(loss).dtype == np.float64           # the common dtype of the inputs
    dpc, dpr, _, _ = dpo_loss_backward(1.0, cache)
    assert dpc.dtype == np.float32 and dpr.dtype == np.float32   # each input's own dtype
