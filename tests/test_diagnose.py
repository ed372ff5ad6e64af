"""The gradient checker names the mistake (numpytfmr/checking/).

Part 1 tests the diagnosis engine on small forward/backward pairs written here. Part 2
plants realistic single mistakes in backward passes of this repository's own ops (the
reference forwards, with a bugged backward written below from the forward's cache) and
checks that each cause gets its own sentence and never the fallback; a second set are whole
backwards written as a student writes them, without the reference, each with one classic
mistake (on the registry's own cases, across every op family), which the op's catalogue of
known wrong backwards must name. A battery counts the specific diagnoses over all planted
bugs (>= 90 %) and checks that none names a wrong cause (a catalogue name other than the
bug's counts as wrong). Part 3 checks that correct backwards get no diagnosis over several seeds, and that
the autograder's feedback carries the same sentences.
"""
import copy
import functools
import math
from dataclasses import dataclass, field

import numpy as np
import pytest

import numpytfmr as nt
from numpytfmr.activations import normal_cdf, normal_pdf, sigmoid
from numpytfmr.checking.diagnose import NO_PATTERN
from numpytfmr.checking.evidence import Case, Diagnosis
from numpytfmr.checking.rowwise import invariant_axes
from numpytfmr.checking.terms import Terms, find_op, learn_terms
from numpytfmr.gradcheck import check_gradients
from numpytfmr.registry import bind

P = functools.partial


def _all(res):
    """Every diagnosis sentence of a result, one string."""
    return " | ".join(s for sentences in res.diagnoses.values() for s in sentences)


def _kinds(res):
    return {getattr(s, "kind", "other") for sentences in res.diagnoses.values() for s in sentences}


# =========================================================================================
# Part 1: the engine, on small ops written here
# =========================================================================================

def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    y = e / e.sum(-1, keepdims=True)
    return y, {"y": y}


def _layernorm(x, g):
    mu = x.mean(-1, keepdims=True)
    s = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    xh = (x - mu) / s
    return g * xh, {"xh": xh, "s": s, "g": g}


def test_terms_name_factors_in_the_cases_own_words():
    t = Terms([("scale", 0.5), ("d_k", 7), ("alpha", 6.0), ("r", 3)])
    assert t.name_factor(2.0).startswith("1/scale") and "scale = 0.5" in t.name_factor(2.0)
    assert t.name_factor(math.sqrt(7)).startswith("sqrt(d_k)")
    assert t.name_factor(1.0 / math.sqrt(7)).startswith("1/sqrt(d_k)")
    assert "alpha/r" in Terms([("alpha", 6.0), ("r", 3)]).name_factor(2.0)
    assert t.name_factor(1.2345) == ""                     # nothing fits: no name at all
    assert Terms().name_factor(6.0) == ""                  # no "6 = 6"
    shapes = Terms(shapes=[("the size of Q's last axis", 64)])
    assert shapes.name_factor(0.125) == "1/sqrt(64), 64 = the size of Q's last axis"


def test_terms_come_from_partial_bind_cache_contract_and_the_caller():
    Q = np.zeros((2, 3, 7))
    op, options = find_op(P(nt.attention_forward, scale=0.5))
    assert op is nt.attention_forward and options == {"scale": 0.5}
    op, options = find_op(bind(nt.attention_forward, {"scale": 0.25}))
    assert op is nt.attention_forward and options == {"scale": 0.25}
    terms = learn_terms(P(nt.attention_forward, scale=0.5), [Q, Q, Q], ["Q", "K", "V"])
    assert terms.name_factor(2.0).startswith("1/scale")
    assert terms.axis_name(0, 2, 7) == "d_k"
    terms = learn_terms(nt.cross_entropy_forward, [np.zeros((2, 3, 5)), np.zeros((2, 3), int)],
                        ["logits", "targets"], cache={"n_valid": 6})
    # N = n_valid here (no position ignored): both are named, neither guessed
    assert terms.name_factor(6.0) == "N = n_valid, N = 6 rows of logits (2 x 3)"
    assert learn_terms(nt.cross_entropy_forward, [np.zeros((2, 3, 5)), np.zeros((2, 3), int)],
                       ["logits", "targets"], cache={"n_valid": 4}).name_factor(1.5) == \
        "N/n_valid, N = 6 rows of logits (2 x 3), n_valid = 4"
    assert "6 = batch size" in str(check_gradients(
        lambda x: (x.mean(), {}), lambda d, c: d * np.ones(6), (np.arange(6.0),),
        terms={"batch size": 6}))
    with pytest.raises(TypeError, match="terms"):
        check_gradients(_softmax, lambda d, c: d, (np.ones((2, 3)),), terms=[6])


def test_invariant_axis_is_the_normalised_one():
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    for axis in (0, 1, 2):
        f = P(nt.softmax_forward, axis=axis)
        y = f(x)[0]
        case = Case(f, [x], 0, y, np.ones_like(y), ["x"], None)
        assert invariant_axes(case) == [(axis, "shift")]
    def f(x):
        return nt.rmsnorm_forward(x, None)

    case = Case(f, [x], 0, f(x)[0], np.ones_like(x), ["x"], None)
    assert invariant_axes(case) == [(2, "scale")]


def test_diagnoses_carry_a_kind_and_stay_strings():
    d = Diagnosis("a sentence", "row_term")
    assert d == "a sentence" and isinstance(d, str) and d.kind == "row_term"
    assert d.replace("a ", "the ") == "the sentence"


def test_row_term_engine_on_hand_written_pairs():
    x = np.random.default_rng(1).standard_normal((2, 3, 7))
    g = np.random.default_rng(2).standard_normal(7)

    def missing_y_term(dout, c):
        return c["y"] * dout

    res = check_gradients(_softmax, missing_y_term, (x,))
    # the forward written here is recognised as softmax: its catalogue names the mistake too
    assert not res.passed and _kinds(res) == {"row_term", "known_mistake"}
    assert 'softmax\'s known wrong backward "without the subtraction"' in _all(res)
    assert "c_i * y along axis -1 (d = 7)" in _all(res) and "is missing" in _all(res)

    def no_mean(dout, c):
        dxh = dout * c["g"]
        return (dxh - c["xh"] * (dxh * c["xh"]).mean(-1, keepdims=True)) / c["s"], \
            (dout * c["xh"]).reshape(-1, 7).sum(0)

    res = check_gradients(_layernorm, no_mean, (x, g), names=("x", "gamma"))
    assert "constant along axis -1 (d = 7) within each row" in _all(res)
    assert "`- mean(dxhat)`" in _all(res) and NO_PATTERN not in _all(res)


def test_elementwise_engine_says_where():
    x = np.linspace(-4, 4, 24).reshape(4, 6) + 0.01

    def forward(x):
        return np.tanh(x), {"x": x}

    def clipped(dout, c):                       # derivative right for |x| < 2, 0 beyond
        return dout * np.where(np.abs(c["x"]) < 2, 1 - np.tanh(c["x"]) ** 2, 0.0)

    res = check_gradients(forward, clipped, (x,))
    assert _kinds(res) == {"elementwise", "zeros"}, str(res)
    assert "your f'(x) is wrong for large |x|" in _all(res)

    def near_zero(dout, c):                     # wrong only for |x| < 1
        t = 1 - np.tanh(c["x"]) ** 2
        return dout * np.where(np.abs(c["x"]) < 1, 1.0, t)

    res = check_gradients(forward, near_zero, (x,))
    assert "wrong near 0" in _all(res), str(res)


def test_counterfactual_and_product_engines():
    rng = np.random.default_rng(3)
    x, W = rng.standard_normal((4, 5)), rng.standard_normal((5, 5))

    def forward(x, W):
        return np.tanh(x @ W), {"x": x, "W": W, "y": np.tanh(x @ W)}

    def uses_W(dout, c):                        # dx = (dout * (1 - y^2)) @ W  instead of W.T
        dz = dout * (1 - c["y"] ** 2)
        return dz @ c["W"], c["x"].T @ dz

    res = check_gradients(forward, uses_W, (x, W), names=("x", "W"))
    assert res.rows[1].verdict == "PASS" and _kinds(res) == {"transpose_product"}, str(res)
    assert "W transposed" in _all(res) or "W.T" in _all(res)


# =========================================================================================
# Part 2: planted bugs in the reference ops
# =========================================================================================

def _T(a):
    return np.swapaxes(a, -1, -2)


def _rows(a):
    return a.reshape(-1, a.shape[-1])


@dataclass
class Bug:
    name: str
    forward: object
    backward: object
    inputs: object                 # rng -> tuple of inputs
    expect: set                    # kinds that name the actual mistake
    allowed: set = field(default_factory=set)   # other kinds that are true but not the cause
    names: tuple = None
    known: set = field(default_factory=set)     # names of the op's catalogue that are this bug


def _normal(*shape, scale=1.0):
    return lambda rng: (scale * rng.standard_normal(shape),)


# --- linear ------------------------------------------------------------------------------

def _linear_in(rng):
    return rng.standard_normal((2, 3, 5)), rng.standard_normal((5, 5)), rng.standard_normal(5)


def _lin(dout, c, bug):
    x, W = c["x"], c["W"]
    dx, dW, db = dout @ W.T, _rows(x).T @ _rows(dout), _rows(dout).sum(0)
    if bug == "dx_W":
        dx = dout @ W                                   # W where W.T belongs
    elif bug == "dW_T":
        dW = _rows(dout).T @ _rows(x)                   # dW built transposed
    elif bug == "db_axis":
        db = dout.sum(0)                                # sums the first axis only
    elif bug == "dW_mean":
        dW = dW / _rows(x).shape[0]                     # a mean over rows, not a sum
    return dx, dW, db


# --- activations -----------------------------------------------------------------------

def _gelu_bug(dout, c, bug):
    x = c["x"]
    Phi, phi = normal_cdf(x), normal_pdf(x)
    if bug == "no_x_pdf":
        return dout * Phi                               # d(x Phi)/dx without x phi(x)
    if bug == "tanh_derivative":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (x + 0.044715 * x ** 3))
        return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * k * (1 + 3 * 0.044715 * x ** 2))
    if bug == "ignores_dout":
        return Phi + x * phi                            # the derivative alone, not times dout
    raise ValueError(bug)


def _silu_no_product_rule(dout, c):
    return dout * c["s"]                                # d(x s)/dx without x s (1 - s)


def _relu_passes_negative(dout, c):
    return dout * (c["x"] > -1.0)                       # threshold at -1 instead of 0


def _softmax_bug(dout, c, bug):
    y, axis = c["y"], c["axis"]
    if bug == "missing":
        return y * dout                                 # without - y * sum(dout * y)
    if bug == "mean":
        return y * (dout - dout.mean(axis, keepdims=True))   # plain mean instead of y-weighted sum
    if bug == "axis0":
        return y * (dout - (dout * y).sum(0, keepdims=True))
    if bug == "all_axes":
        return y * (dout - (dout * y).sum())
    if bug == "last_axis":
        return y * (dout - (dout * y).sum(-1, keepdims=True))   # ignores the axis option
    raise ValueError(bug)


def _log_softmax_bug(dout, c, bug):
    out, axis = c["out"], c["axis"]
    if bug == "missing":
        return dout.copy()                              # without - softmax * sum(dout)
    if bug == "axis0":
        return dout - np.exp(out) * dout.sum(0, keepdims=True)
    raise ValueError(bug)


# --- cross-entropy ---------------------------------------------------------------------

def _ce_in(rng, shape=(6, 5)):
    return rng.standard_normal(shape), rng.integers(0, shape[-1], shape[:-1])


def _ce_ignored_in(rng):
    t = rng.integers(0, 5, (2, 5))
    t[0, 1] = t[1, 3] = -100
    return rng.standard_normal((2, 5, 5)), t


def _ce(dout, c, bug):
    logp, y, valid, eps = c["logp"], c["targets"], c["valid"], c["eps"]
    K = logp.shape[-1]
    p = np.exp(logp)
    onehot = np.arange(K) == y[..., None]
    q = (1 - eps) * onehot + eps / K
    w = dout * valid / max(c["n_valid"], 1)
    if bug == "no_N":
        w = dout * valid
    elif bug == "no_softmax":
        p = 0.0 * p
    elif bug == "no_onehot":
        q = eps / K + 0.0 * q
    elif bug == "smoothing_ignored":
        q = onehot
    elif bug == "ignored_not_zeroed":
        w = dout / max(c["n_valid"], 1) + 0.0 * valid
    elif bug == "all_rows":
        w = dout * valid / valid.size
    return (p - q) * w[..., None], None


# --- norms -------------------------------------------------------------------------------

def _ln_in(rng):
    return rng.standard_normal((2, 3, 7)), rng.standard_normal(7), rng.standard_normal(7)


def _ln(dout, c, bug):
    xhat, sigma, gamma = c["xhat"], c["sigma"], c["gamma"]
    d = xhat.shape[-1]
    dgamma, dbeta = _rows(dout * xhat).sum(0), _rows(dout).sum(0)
    g = dout * gamma
    mean_term = g.mean(-1, keepdims=True)
    xhat_term = xhat * (g * xhat).mean(-1, keepdims=True)
    if bug == "no_mean":
        mean_term = 0.0
    elif bug == "no_xhat":
        xhat_term = 0.0
    elif bug == "no_terms":
        mean_term = xhat_term = 0.0
    elif bug == "unbiased":
        xhat_term = xhat * (g * xhat).sum(-1, keepdims=True) / (d - 1)
    elif bug == "mean_axis0":
        mean_term = g.mean(0, keepdims=True)
    elif bug == "xhat_sign":
        xhat_term = -xhat_term
    elif bug == "forgot_gamma":
        g = dout
        mean_term = g.mean(-1, keepdims=True)
        xhat_term = xhat * (g * xhat).mean(-1, keepdims=True)
    return (g - mean_term - xhat_term) / sigma, dgamma, dbeta


def _rms(dout, c, bug):
    xhat, rms, gamma = c["xhat"], c["rms"], c["gamma"]
    dgamma = _rows(dout * xhat).sum(0)
    g = dout * gamma
    if bug == "no_xhat":
        return g / rms, dgamma
    if bug == "forgot_gamma":
        return (dout - xhat * (dout * xhat).mean(-1, keepdims=True)) / rms, dgamma
    raise ValueError(bug)


# --- embedding ---------------------------------------------------------------------------

def _embedding_overwrite(dout, c):
    dtable = np.zeros(c["table_shape"])
    dtable[c["ids"]] += dout                            # a repeated id keeps only one row
    return None, dtable


# --- attention ---------------------------------------------------------------------------

def _att(dout, c, bug, mask=None):
    Q, K, V, A, s = c["Q"], c["K"], c["V"], c["weights"], c["scale"]
    dV = _T(A) @ dout
    dA = dout @ _T(V)
    dS = A * (dA - (dA * A).sum(-1, keepdims=True))
    dQ, dK = dS @ K * s, _T(dS) @ Q * s
    if bug == "dQ_no_scale":
        dQ = dS @ K
    elif bug == "dK_not_transposed":
        dK = dS @ Q * s
    elif bug == "dV_not_transposed":
        dV = A @ dout
    elif bug == "default_scale":
        dK = _T(dS) @ Q / math.sqrt(Q.shape[-1])        # 1/sqrt(d_k) where scale was given
    elif bug == "no_softmax_term":
        dS = A * dA
        dQ, dK = dS @ K * s, _T(dS) @ Q * s
    elif bug == "unmasked_P":
        # memory-efficient style: P recomputed from the scores and the row log-sum-exp,
        # but without the mask
        S = Q @ _T(K) * s
        Sm = np.where(mask, S, -np.inf)
        m = Sm.max(-1, keepdims=True)
        L = m + np.log(np.exp(Sm - m).sum(-1, keepdims=True))
        Pm = np.exp(S - L)
        D = (dout * (A @ V)).sum(-1, keepdims=True)
        dS = Pm * (dout @ _T(V) - D)
        dQ, dK, dV = dS @ K * s, _T(dS) @ Q * s, _T(Pm) @ dout
    return dQ, dK, dV


def _scores_dK_not_transposed(dS, c):
    Q, K, s = c["Q"], c["K"], c["scale"]
    return dS @ K * s, dS @ Q * s


# --- positions, post-training --------------------------------------------------------------

def _rope_forward_rotation(dout, c):
    """Rotates dout by +theta, like the forward, instead of -theta."""
    cos, sin = c["cos"], c["sin"]
    out = np.empty_like(dout)
    if c["layout"] == "interleaved":
        a, b = dout[..., 0::2], dout[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    else:
        h = dout.shape[-1] // 2
        a, b = dout[..., :h], dout[..., h:]
        out[..., :h], out[..., h:] = a * cos - b * sin, b * cos + a * sin
    return out


def _lora_in(rng):
    return (rng.standard_normal((2, 3, 7)), rng.standard_normal((7, 5)), rng.standard_normal((7, 3)),
            rng.standard_normal((3, 5)), rng.standard_normal(5))


def _lora(dout, c, bug):
    W, A, B, s = c["W"], c["A"], c["B"], c["scale"]
    dy, u, xd = _rows(dout), _rows(c["u"]), _rows(c["xd"])
    du = s * (dout @ B.T)
    dB = s * (u.T @ dy)
    dx = dout @ W.T + du @ A.T
    dA = xd.T @ _rows(du)
    if bug == "dA_no_scale":
        dA = dA / s
    elif bug == "alpha_not_over_r":
        dB = dB * A.shape[1]                            # alpha where alpha / r belongs
    elif bug == "dx_no_branch":
        dx = dout @ W.T
    return dx, None, dA, dB, None


def _bt_no_mean(dout, c):
    dd = -sigmoid(-c["d"]) * dout
    return dd, -dd


def _dpo_sign(dout, c):
    d_c, d_r, _, _ = nt.dpo_loss_backward(dout, c)
    return -d_c, -d_r, None, None


def _dpo_in(rng):
    return tuple(rng.standard_normal(6) for _ in range(4))


def _seqlogp_in(rng):
    mask = np.ones((2, 4), bool)
    mask[0, :2] = mask[1, 3] = False
    return rng.standard_normal((2, 4, 5)), rng.integers(0, 5, (2, 4)), mask


def _seqlogp_mask_ignored(dout, c):
    probs, y = c["probs"], c["targets"]
    onehot = np.arange(probs.shape[-1]) == y[..., None]
    return dout[..., None, None] * (onehot - probs), None, None


def _attention_in(shape_q, shape_k, shape_v):
    return lambda rng: (rng.standard_normal(shape_q), rng.standard_normal(shape_k),
                        rng.standard_normal(shape_v))


_CAUSAL = nt.causal_mask(4)
_QKV = ("Q", "K", "V")

BUGS = [
    Bug("linear: dx = dout @ W", nt.linear_forward, P(_lin, bug="dx_W"), _linear_in,
        {"transpose_product"}, names=("x", "W", "b")),
    Bug("linear: dW transposed", nt.linear_forward, P(_lin, bug="dW_T"), _linear_in,
        {"transpose"}, names=("x", "W", "b")),
    Bug("linear: db over the first axis only", nt.linear_forward, P(_lin, bug="db_axis"), _linear_in,
        {"shape"}, names=("x", "W", "b")),
    Bug("linear: dW a mean over rows", nt.linear_forward, P(_lin, bug="dW_mean"), _linear_in,
        {"factor"}, names=("x", "W", "b")),
    Bug("relu: threshold at -1", nt.relu_forward, _relu_passes_negative, _normal(4, 6),
        {"elementwise", "extra_nonzero"}),
    Bug("gelu: x * pdf(x) missing", nt.gelu_forward, P(_gelu_bug, bug="no_x_pdf"), _normal(4, 6),
        {"elementwise"}),
    Bug("gelu: tanh derivative for the exact form", nt.gelu_forward,
        P(_gelu_bug, bug="tanh_derivative"), _normal(4, 6, scale=2.0), {"elementwise"}),
    Bug("gelu: ignores dout", nt.gelu_forward, P(_gelu_bug, bug="ignores_dout"), _normal(4, 6),
        {"linearity"}),
    Bug("silu: product rule half missing", nt.silu_forward, _silu_no_product_rule, _normal(4, 6),
        {"elementwise"}),
    Bug("softmax: - y sum(dout y) missing", nt.softmax_forward, P(_softmax_bug, bug="missing"),
        _normal(2, 3, 7), {"row_term"}),
    Bug("softmax: plain mean instead of the y-weighted sum", nt.softmax_forward,
        P(_softmax_bug, bug="mean"), _normal(2, 3, 7), {"row_term"}),
    Bug("softmax: sum over axis 0", nt.softmax_forward, P(_softmax_bug, bug="axis0"),
        _normal(2, 3, 7), {"wrong_axis"}),
    Bug("softmax: sum over every axis", nt.softmax_forward, P(_softmax_bug, bug="all_axes"),
        _normal(2, 3, 7), {"all_axes"}),
    Bug("softmax: axis option ignored in backward", P(nt.softmax_forward, axis=0),
        P(_softmax_bug, bug="last_axis"), _normal(5, 7), {"wrong_axis"}),
    Bug("log_softmax: - softmax sum(dout) missing", nt.log_softmax_forward,
        P(_log_softmax_bug, bug="missing"), _normal(3, 6), {"row_term"}),
    Bug("log_softmax: sum over axis 0", nt.log_softmax_forward, P(_log_softmax_bug, bug="axis0"),
        _normal(3, 6), {"wrong_axis"}),
    Bug("cross_entropy: /N missing", nt.cross_entropy_forward, P(_ce, bug="no_N"), _ce_in,
        {"factor"}, names=("logits", "targets")),
    Bug("cross_entropy: softmax term missing", nt.cross_entropy_forward, P(_ce, bug="no_softmax"),
        _ce_in, {"row_term"}, {"zeros"}, names=("logits", "targets")),
    Bug("cross_entropy: one-hot term missing", nt.cross_entropy_forward, P(_ce, bug="no_onehot"),
        _ce_in, {"picked_entries"}, names=("logits", "targets")),
    Bug("cross_entropy: label smoothing ignored in backward",
        P(nt.cross_entropy_forward, label_smoothing=0.2), P(_ce, bug="smoothing_ignored"), _ce_in,
        {"smoothing"}, names=("logits", "targets")),
    Bug("cross_entropy: ignored positions not zeroed", P(nt.cross_entropy_forward, ignore_index=-100),
        P(_ce, bug="ignored_not_zeroed"), _ce_ignored_in, {"extra_nonzero"},
        names=("logits", "targets")),
    Bug("cross_entropy: divided by every position, ignored ones too",
        P(nt.cross_entropy_forward, ignore_index=-100), P(_ce, bug="all_rows"), _ce_ignored_in,
        {"factor"}, names=("logits", "targets")),
    Bug("layernorm: - mean(dxhat) missing", nt.layernorm_forward, P(_ln, bug="no_mean"), _ln_in,
        {"row_term"}, names=("x", "gamma", "beta")),
    Bug("layernorm: - xhat mean(dxhat xhat) missing", nt.layernorm_forward, P(_ln, bug="no_xhat"),
        _ln_in, {"row_term"}, names=("x", "gamma", "beta")),
    Bug("layernorm: both terms missing", nt.layernorm_forward, P(_ln, bug="no_terms"), _ln_in,
        {"row_term"}, names=("x", "gamma", "beta")),
    Bug("layernorm: 1/(d-1) in the xhat term", nt.layernorm_forward, P(_ln, bug="unbiased"),
        _ln_in, {"normaliser"}, names=("x", "gamma", "beta")),
    Bug("layernorm: mean over axis 0", nt.layernorm_forward, P(_ln, bug="mean_axis0"), _ln_in,
        {"wrong_axis"}, names=("x", "gamma", "beta")),
    Bug("layernorm: xhat term with the wrong sign", nt.layernorm_forward, P(_ln, bug="xhat_sign"),
        _ln_in, {"row_term"}, names=("x", "gamma", "beta")),
    Bug("layernorm: dxhat = dout (gamma forgotten)", nt.layernorm_forward,
        P(_ln, bug="forgot_gamma"), _ln_in, {"missing_factor"}, names=("x", "gamma", "beta")),
    Bug("rmsnorm: xhat term missing", nt.rmsnorm_forward, P(_rms, bug="no_xhat"),
        lambda rng: (rng.standard_normal((2, 3, 6)), rng.standard_normal(6)), {"row_term"},
        names=("x", "gamma")),
    Bug("rmsnorm: gamma forgotten", nt.rmsnorm_forward, P(_rms, bug="forgot_gamma"),
        lambda rng: (rng.standard_normal((2, 3, 6)), rng.standard_normal(6)), {"missing_factor"},
        names=("x", "gamma")),
    Bug("embedding: dtable[ids] += dout", nt.embedding_forward, _embedding_overwrite,
        lambda rng: (np.array([[1, 4, 2, 4], [0, 1, 6, 3]]), rng.standard_normal((7, 3))),
        {"repeated_ids"}, names=("ids", "table")),
    Bug("attention: dQ without the scale", nt.attention_forward, P(_att, bug="dQ_no_scale"),
        _attention_in((2, 3, 7), (2, 3, 7), (2, 3, 7)), {"factor"}, names=_QKV),
    Bug("attention: dK = dS @ Q", nt.attention_forward, P(_att, bug="dK_not_transposed"),
        _attention_in((2, 4, 5), (2, 4, 5), (2, 4, 5)), {"transpose_product"}, names=_QKV),
    Bug("attention: dV = A @ dout", nt.attention_forward, P(_att, bug="dV_not_transposed"),
        _attention_in((2, 4, 5), (2, 4, 5), (2, 4, 5)), {"transpose_product"}, names=_QKV),
    Bug("attention: dQ without scale=0.5", P(nt.attention_forward, scale=0.5), P(_att, bug="dQ_no_scale"),
        _attention_in((3, 7), (4, 7), (4, 7)), {"factor"}, names=_QKV),
    Bug("attention: 1/sqrt(d_k) where scale=0.5 was given", P(nt.attention_forward, scale=0.5),
        P(_att, bug="default_scale"), _attention_in((3, 7), (4, 7), (4, 7)), {"factor"}, names=_QKV),
    Bug("attention: softmax term missing in dS", nt.attention_forward,
        P(_att, bug="no_softmax_term"), _attention_in((2, 3, 7), (2, 3, 7), (2, 3, 7)),
        {"row_term"}, names=_QKV),
    Bug("attention: causal mask not applied to P in backward", P(nt.attention_forward, mask=_CAUSAL),
        P(_att, bug="unmasked_P", mask=_CAUSAL), _attention_in((2, 4, 5), (2, 4, 5), (2, 4, 5)),
        {"mask"}, names=_QKV),
    Bug("scaled_dot_scores: dK = dS @ Q", nt.scaled_dot_scores_forward, _scores_dK_not_transposed,
        lambda rng: (rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 4, 6))),
        {"transpose_product"}, names=("Q", "K")),
    Bug("rope: rotated by +theta", P(nt.rope_forward, positions=np.arange(5)), _rope_forward_rotation,
        _normal(2, 5, 8), {"rotation"}),
    Bug("rope: rotated by +theta (half layout, offset positions)",
        P(nt.rope_forward, positions=np.arange(11, 16), layout="half"), _rope_forward_rotation,
        _normal(3, 5, 6), {"rotation"}),
    Bug("lora: dA without the scale", P(nt.lora_linear_forward, alpha=6.0), P(_lora, bug="dA_no_scale"),
        _lora_in, {"factor"}, names=("x", "W", "A", "B", "b")),
    Bug("lora: alpha instead of alpha/r in dB", P(nt.lora_linear_forward, alpha=6.0),
        P(_lora, bug="alpha_not_over_r"), _lora_in, {"factor"}, names=("x", "W", "A", "B", "b")),
    Bug("lora: dx without the LoRA branch", P(nt.lora_linear_forward, alpha=6.0),
        P(_lora, bug="dx_no_branch"), _lora_in, {"missing_path"}, names=("x", "W", "A", "B", "b")),
    Bug("bradley_terry: mean forgotten", nt.bradley_terry_loss_forward, _bt_no_mean,
        lambda rng: (rng.standard_normal(6), rng.standard_normal(6)), {"factor"},
        names=("r_chosen", "r_rejected")),
    Bug("dpo: sign flipped", nt.dpo_loss_forward, _dpo_sign, _dpo_in, {"sign"},
        names=("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")),
    Bug("sequence_logprobs: mask ignored in backward", nt.sequence_logprobs_forward,
        _seqlogp_mask_ignored, _seqlogp_in, {"extra_nonzero"}, names=("logits", "targets", "mask")),
]

# --- student-style backwards, written from the forward's cache without the reference ------
# Each is a whole backward as a student writes it, with one classic mistake; the inputs are
# the registry's own cases.

def _case(op, index):
    """(forward, inputs maker, names) of a registered op's case (float64)."""
    from numpytfmr.registry import registry
    from numpytfmr.registry import input_names
    spec = registry()[op]
    case = spec.make_cases(np.random.default_rng(0), np.float64)[index]
    return bind(spec.forward, case.kwargs), (lambda rng: case.args), \
        tuple(input_names(spec.forward)[:len(case.args)])


# Kinds that describe the shape of a student's error truly, beside the catalogue's name
_SHAPES = {"normaliser", "row_term", "elementwise", "factor", "rotation", "mask",
           "transpose_product", "wrong_axis", "missing_factor", "missing_path", "zeros",
           "extra_nonzero", "sign"}


def _student(label, op, index, backward, known, expect=("known_mistake",), allowed=_SHAPES):
    forward, inputs, names = _case(op, index)
    return Bug(f"student {op}: {label}", forward, backward, inputs, set(expect), set(allowed),
               names, {known})


def _s_softmax_diagonal(dout, cache):
    y = cache["y"]
    return dout * y * (1 - y)                       # dy_i/dx_i = y_i (1 - y_i)


def _s_softmax_logsoftmax(dout, cache):
    y, axis = cache["y"], cache["axis"]
    return dout - y * np.sum(dout, axis=axis, keepdims=True)


def _s_log_softmax_diagonal(dout, cache):
    p = np.exp(cache["out"])
    return dout * (1 - p)


def _s_attention(bug):
    def backward(dout, cache):
        Q, K, V, A = cache["Q"], cache["K"], cache["V"], cache["weights"]
        s = 1 / np.sqrt(Q.shape[-1]) if cache["scale"] is None else cache["scale"]
        dV = np.swapaxes(A, -1, -2) @ dout
        dA = dout @ np.swapaxes(V, -1, -2)
        if bug == "no subtraction":
            dS = A * dA                                  # softmax backward
        else:
            dS = A * (1 - A) * dA                        # softmax derivative y (1 - y)
        dQ = s * dS @ K
        dK = s * np.swapaxes(dS, -1, -2) @ Q
        return dQ, dK, dV
    return backward


def _s_layernorm(bug):
    def backward(dout, cache):
        xhat, sigma, gamma = cache["xhat"], cache["sigma"], cache["gamma"]
        N = xhat.shape[-1]
        lead = tuple(range(xhat.ndim - 1))
        dgamma = np.sum(dout * xhat, axis=lead)
        dbeta = np.sum(dout, axis=lead)
        dxhat = dout * gamma
        xmu = xhat * sigma
        if bug == "unbiased":
            # the staged derivation, with the variance's normaliser from the statistics course
            dvar = np.sum(dxhat * xmu, axis=-1, keepdims=True) * -0.5 * sigma ** -3
            dmu = np.sum(-dxhat / sigma, axis=-1, keepdims=True)
            dx = dxhat / sigma + dvar * 2 * xmu / (N - 1) + dmu / N
        else:
            dx = (N * dxhat - np.sum(dxhat, axis=-1, keepdims=True)
                  - xhat * np.sum(dxhat * xhat, axis=-1, keepdims=True)) / N
            if bug != "no sigma":
                dx = dx / sigma
        if bug == "dgamma":
            dgamma = np.sum(dout, axis=lead)             # "gamma is a per-feature bias-like gain"
        return dx, dgamma, dbeta
    return backward


def _s_rmsnorm_centred(dout, cache):
    xhat, rms, gamma = cache["xhat"], cache["rms"], cache["gamma"]
    g = dout * gamma
    dx = (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) / rms
    return dx, (dout * xhat).reshape(-1, xhat.shape[-1]).sum(0)


def _s_gelu_tanh_chain(dout, cache):
    x = cache["x"]
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x ** 3))
    return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * c)   # du/dx: forgot the cubic


def _s_relu_output(dout, cache):
    return dout * np.maximum(cache["x"], 0)


def _s_silu_sigmoid_only(dout, cache):
    s = 1 / (1 + np.exp(-cache["x"]))
    return dout * s * (1 - s)


def _s_cross_entropy_logp(dout, cache):
    logp, y = cache["logp"], cache["targets"]
    grad = logp.copy()                                   # "the softmax output"
    np.put_along_axis(grad, y[..., None], np.take_along_axis(grad, y[..., None], -1) - 1, -1)
    return grad * dout / cache["n_valid"], None


def _s_dropout(bug):
    def backward(dout, cache):
        if bug == "not rescaled":
            return dout * cache["mask"]
        p = 1 - 1 / cache["scale"]
        return dout * cache["mask"] / p
    return backward


def _s_rope_identity(dout, cache):
    return dout.copy()                                   # "a rotation keeps lengths"


def _s_rope_layout(dout, cache):
    cos, sin = cache["cos"], cache["sin"]
    h = dout.shape[-1] // 2                              # halves, though the forward interleaves
    a, b = dout[..., :h], dout[..., h:]
    return np.concatenate([a * cos + b * sin, b * cos - a * sin], axis=-1)


def _s_lora_dB(dout, cache):
    W, A, B, s = cache["W"], cache["A"], cache["B"], cache["scale"]
    x = cache["xd"].reshape(-1, A.shape[0])
    dy = dout.reshape(-1, B.shape[1])
    u = x @ A
    dB = u.T @ dy                                        # forgot s
    dA = x.T @ (s * dy @ B.T)
    dx = dout @ W.T + s * (dout @ B.T) @ A.T
    return dx, None, dA, dB, None


def _s_dpo(bug):
    def backward(dout, cache):
        z, h, beta, n = cache["z"], cache["h"], cache["beta"], cache["n"]
        if cache["loss_type"] == "ipo":
            dh = 2 * (h - 1 / beta) * dout / n           # the IPO target taken as 1/beta
        elif bug == "smoothed":
            eps = cache["eps"]                           # -(1-eps) log s(z) - eps log s(-z)
            dz = -(1 - eps) / (1 + np.exp(-z)) + eps / (1 + np.exp(z))   # both signs flipped
            dh = beta * dz * dout / n
        else:
            dh = -beta / (1 + np.exp(-z)) * dout / n     # sigmoid(+z)
        return dh, -dh, None, None
    return backward


def _s_bt_plus(dout, cache):
    d = cache["d"]
    g = -1 / (1 + np.exp(-d)) * dout / d.size
    return g, -g


def _s_seqlogp_mean(dout, cache):
    probs, y, mask = cache["probs"], cache["targets"], cache["mask"]
    onehot = np.eye(probs.shape[-1])[np.where(y < 0, 0, y)]
    count = np.maximum(mask.sum(-1, keepdims=True), 1)
    return (dout[..., None] * mask / count)[..., None] * (onehot - probs), None, None


def _s_flash(bug):
    def backward(dout, cache):
        Q, K, V, O, L = cache["Q"], cache["K"], cache["V"], cache["out"], cache["lse"]
        s, mask = cache["scale"], cache["mask"]
        S = Q @ np.swapaxes(K, -1, -2) * s
        if bug == "D left out" and mask is not None:
            S = np.where(mask, S, -np.inf)
        P = np.exp(S - L)                                # the weights from the log-sum-exp
        dV = np.swapaxes(P, -1, -2) @ dout
        dP = dout @ np.swapaxes(V, -1, -2)
        D = 0.0 if bug == "D left out" else np.sum(dout * O, axis=-1, keepdims=True)
        dS = P * (dP - D)
        return dS @ K * s, np.swapaxes(dS, -1, -2) @ Q * s, dV
    return backward


def _s_linear_attention(bug):
    def backward(dout, cache):
        Q, K, V = cache["Q"], cache["K"], cache["V"]
        fQ, fK = cache["phi_Q"], cache["phi_K"]
        S, z, den, out = cache["S"], cache["z"], cache["den"], cache["out"]
        dnum = dout / den
        dden = 0.0 if bug == "constant den" else -np.sum(dout * out, -1, keepdims=True) / den
        dfQ = dnum @ np.swapaxes(S, -1, -2) + dden * z
        dS = np.swapaxes(fQ, -1, -2) @ dnum
        dz = np.sum(dden * fQ, axis=-2, keepdims=True)
        dfK = V @ np.swapaxes(dS, -1, -2) + dz
        dV = fK @ dS
        if bug == "no phi'":
            return dfQ, dfK, dV
        return dfQ * np.where(Q > 0, 1, np.exp(Q)), dfK * np.where(K > 0, 1, np.exp(K)), dV
    return backward


def _s_gru_no_direct(dh, cache):
    e, hp, We, Wh = cache["e"], cache["h_prev"], cache["W_e"], cache["W_h"]
    c, Wc, R, Z, Rh, ht = cache["c"], cache["W_c"], cache["R"], cache["Z"], cache["Rh"], cache["h_tilde"]
    d = hp.shape[-1]
    dht = dh * (1 - Z)
    dZ = dh * (hp - ht)
    dPh = dht * (1 - ht ** 2)
    dPz = dZ * Z * (1 - Z)
    dRh = dPh @ Wh[:, 2 * d:].T
    dPr = dRh * hp * R * (1 - R)
    dP = np.concatenate([dPr, dPz, dPh], -1)
    dhp = dRh * R + np.concatenate([dPr, dPz], -1) @ Wh[:, :2 * d].T   # forgot dh * Z
    flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
    dWh = np.concatenate([flat(hp).T @ flat(np.concatenate([dPr, dPz], -1)), flat(Rh).T @ flat(dPh)], -1)
    db = flat(dP).sum(0) if cache["has_b"] else None
    return (dP @ We.T, dhp, flat(e).T @ flat(dP), dWh, db,
            None if c is None else dP @ Wc.T, None if c is None else flat(c).T @ flat(dP))


def _s_additive_scores(dS, cache):
    Q, K, Wq, Wk, w, T = (cache[k] for k in ("Q", "K", "Wq", "Wk", "w", "T"))
    dP = dS[..., None] * w * (1 - T)                     # tanh' = 1 - tanh
    dHq, dHk = dP.sum(-2), dP.sum(-3)
    dw = np.sum(dS[..., None] * T, axis=tuple(range(T.ndim - 1)))
    return dHq @ Wq.T, dHk @ Wk.T, Q.T @ dHq, K.T @ dHk, dw


def _s_bilinear_M(dS, cache):
    Q, K, M = cache["Q"], cache["K"], cache["M"]
    dQ = dS @ K @ M.T
    dK = np.swapaxes(dS, -1, -2) @ Q                     # forgot M
    dM = np.sum(np.swapaxes(Q, -1, -2) @ dS @ K, axis=0)
    return dQ, dK, dM


def _s_neg_sq_dist(dS, cache):
    diff = cache["diff"]                                 # q_t - k_s
    dQ = -2 * np.sum(dS[..., None] * diff, axis=-2)      # d(-||q - k||^2)/dq = -2 (q - k)
    dK = 2 * np.sum(dS[..., None] * diff, axis=-3)
    return dQ, dK


def _s_dot_scores(dS, cache):
    return dS @ cache["K"], dS @ cache["Q"]              # dK like dQ


def _s_scaled_dot(dS, cache):
    s = cache["scale"]
    return dS @ cache["K"] / s, np.swapaxes(dS, -1, -2) @ cache["Q"] / s


def _s_reward_head(dr, cache):
    pooled, a, w = cache["pooled"], cache["weights"], cache["w_r"]
    dpooled = dr[..., None] * w
    dh = np.repeat(dpooled[..., None, :], a.shape[-1], axis=-2)   # every token gets dpooled
    dw = pooled.reshape(-1, w.size).T @ dr.reshape(-1)
    db = None if cache["b_shape"] is None else np.full(cache["b_shape"], dr.sum())
    return dh, dw, db


def _s_ffn_no_activation(dout, cache):
    l1, l2 = cache["lin1"], cache["lin2"]
    x, W1, a, W2 = l1["x"], l1["W"], l2["x"], l2["W"]
    rows = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    dW2, db2 = rows(a).T @ rows(dout), rows(dout).sum(0)
    dh = dout @ W2.T                                     # "ReLU passes the gradient"
    return dh @ W1.T, rows(x).T @ rows(dh), rows(dh).sum(0), dW2, db2


def _s_swiglu_gate_only(dout, cache):
    x, Wg = cache["gate"]["x"], cache["gate"]["W"]
    Wu, Wd = cache["up"]["W"], cache["down"]["W"]
    a, u, g = cache["a"], cache["u"], cache["act"]["x"]
    rows = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    hdown = a * u
    dW_down = rows(hdown).T @ rows(dout)
    dh = dout @ Wd.T
    s = 1 / (1 + np.exp(-g))
    dg = dh * u * (s + g * s * (1 - s))
    du = dh * a
    dx = dg @ Wg.T                                       # x only through the gate
    return dx, rows(x).T @ rows(dg), rows(x).T @ rows(du), dW_down


def _s_additive_attention(dout, cache):
    A, V, sc = cache["weights"], cache["V"], cache["scores"]
    Q, K, Wq, Wk, w, T = (sc[k] for k in ("Q", "K", "Wq", "Wk", "w", "T"))
    dV = np.swapaxes(A, -1, -2) @ dout
    da = A * (dout @ np.swapaxes(V, -1, -2))             # softmax backward
    dP = da[..., None] * w * (1 - T ** 2)
    dHq, dHk = dP.sum(-2), dP.sum(-3)
    lead = tuple(range(T.ndim - 1))
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    return (dHq @ Wq.T, dHk @ Wk.T, dV, flat(Q).T @ flat(dHq), flat(K).T @ flat(dHk),
            np.sum(da[..., None] * T, axis=lead))


def _s_mha(bug):
    from numpytfmr.attention import attention_backward
    from numpytfmr.linear import linear_backward
    from numpytfmr.mha import merge_heads, repeat_kv_backward, split_heads

    def backward(dout, cache):
        dconcat, dWo, dbo = linear_backward(dout, cache["o"])
        attn = copy.copy(cache["attn"])
        if bug == "scale":
            attn["scale"] = 1.0                           # "the scores' scale is a constant"
        group = cache["n_heads"] // cache["n_kv_heads"]
        dQ, dK, dV = attention_backward(split_heads(dconcat, cache["n_heads"]), attn)
        dK, dV = repeat_kv_backward(dK, group), repeat_kv_backward(dV, group)
        dx_q, dWq, dbq = linear_backward(merge_heads(dQ), cache["q"])
        dx_k, dWk, dbk = linear_backward(merge_heads(dK), cache["k"])
        dx_v, dWv, dbv = linear_backward(merge_heads(dV), cache["v"])
        dx_kv = dx_k if bug == "keys only" else dx_k + dx_v
        return dx_q, dx_kv, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo
    return backward


STUDENT_BUGS = [
    _student("diagonal only, y * (1 - y) * dout", "softmax", 0, _s_softmax_diagonal, "diagonal only"),
    _student("log-softmax's backward", "softmax", 0, _s_softmax_logsoftmax, "log-softmax's backward"),
    _student("diagonal only", "log_softmax", 0, _s_log_softmax_diagonal, "diagonal only"),
    _student("softmax backward without its subtraction", "attention", 0,
             _s_attention("no subtraction"), "without the subtraction"),
    _student("softmax backward without its subtraction, causal", "attention", 1,
             _s_attention("no subtraction"), "without the subtraction"),
    _student("softmax derivative y (1 - y)", "attention", 6, _s_attention("diagonal"),
             "diagonal only"),
    _student("staged derivation with the unbiased variance", "layernorm", 0,
             _s_layernorm("unbiased"), "unbiased variance"),
    _student("not divided by sigma", "layernorm", 0, _s_layernorm("no sigma"),
             "not divided by sigma"),
    _student("dgamma = sum(dout)", "layernorm", 0, _s_layernorm("dgamma"), "dgamma = sum(dout)"),
    _student("LayerNorm's mean term", "rmsnorm", 0, _s_rmsnorm_centred, "LayerNorm's mean term"),
    _student("tanh form, du/dx without the cubic term", "gelu", 4, _s_gelu_tanh_chain,
             "chain rule without du/dx's cubic term"),
    _student("multiplied by the output", "relu", 0, _s_relu_output, "times the output"),
    _student("sigmoid's derivative only", "silu", 0, _s_silu_sigmoid_only,
             "sigmoid's derivative only"),
    _student("log-probabilities for probabilities", "cross_entropy", 0, _s_cross_entropy_logp,
             "log-probabilities for probabilities"),
    _student("not rescaled", "dropout", 0, _s_dropout("not rescaled"), "not rescaled"),
    _student("divided by p", "dropout", 0, _s_dropout("p"), "divided by p"),
    _student("not rotated back", "rope", 0, _s_rope_identity, "not rotated back"),
    _student("halves for interleaved pairs", "rope", 0, _s_rope_layout, "pairs of the other layout"),
    _student("dB without the scale", "lora_linear", 0, _s_lora_dB, "dB without s"),
    _student("sigmoid(+margin)", "dpo_loss", 0, _s_dpo("sigmoid"), "sigmoid(+margin)"),
    _student("sigmoid(+margin), label smoothing 0.1", "dpo_loss", 3, _s_dpo("smoothed"),
             "sigmoid(+margin)"),
    _student("IPO target 1/beta", "dpo_loss", 2, _s_dpo("ipo"), "ipo target 1/beta"),
    _student("sigmoid(+d)", "bradley_terry_loss", 0, _s_bt_plus, "sigmoid(+d)"),
    _student("mean over tokens", "sequence_logprobs", 0, _s_seqlogp_mean, "mean over tokens"),
    _student("D left out", "flash_attention", 2, _s_flash("D left out"), "D left out"),
    _student("P recomputed without the mask", "flash_attention", 2, _s_flash("unmasked"),
             "P recomputed without the mask"),
    _student("denominator held constant", "linear_attention", 0,
             _s_linear_attention("constant den"), "denominator held constant"),
    _student("phi' left out", "linear_attention", 0, _s_linear_attention("no phi'"), "phi' left out"),
    _student("no direct path to h_prev", "gru_cell", 0, _s_gru_no_direct, "no direct path"),
    _student("tanh' = 1 - T", "additive_scores", 0, _s_additive_scores, "tanh derivative as 1 - T"),
    _student("M left out of dK", "bilinear_scores", 3, _s_bilinear_M, "M left out of dK"),
    _student("the 2 of the square kept", "neg_sq_dist_scores", 0, _s_neg_sq_dist,
             "the 2 of the square kept"),
    _student("dK = dS @ Q", "dot_scores", 4, _s_dot_scores, "dK not transposed"),
    _student("divided by the scale", "scaled_dot_scores", 0, _s_scaled_dot, "divided by the scale"),
    _student("pooling weights left out", "reward_head", 1, _s_reward_head,
             "pooling weights left out"),
    _student("ReLU derivative left out", "ffn", 0, _s_ffn_no_activation,
             "activation derivative left out"),
    _student("x through the gate only", "swiglu_ffn", 0, _s_swiglu_gate_only,
             "x through the gate only"),
    _student("softmax backward without its subtraction", "additive_attention", 0,
             _s_additive_attention, "without the subtraction"),
    _student("x_kv through the keys only", "mha", 1, _s_mha("keys only"),
             "x_kv through the keys only"),
    _student("attention scale left out", "mha", 1, _s_mha("scale"), "attention scale left out"),
]
BUGS += STUDENT_BUGS


# The planted bugs that are also entries of their op's catalogue of known wrong backwards
# (numpytfmr/registry/): the name the checker must give them.
_KNOWN = {
    "linear: dx = dout @ W": "W not transposed in dx",
    "linear: dW a mean over rows": "mean over the rows",
    "gelu: x * pdf(x) missing": "product rule without the x term",
    "gelu: tanh derivative for the exact form": "tanh derivative for the exact GELU",
    "silu: product rule half missing": "product rule without the x term",
    "softmax: - y sum(dout y) missing": "without the subtraction",
    "softmax: plain mean instead of the y-weighted sum": "plain mean",
    "log_softmax: - softmax sum(dout) missing": "without the subtraction",
    "cross_entropy: /N missing": "sum instead of mean",
    "cross_entropy: label smoothing ignored in backward": "label smoothing left out",
    "cross_entropy: ignored positions not zeroed": "ignored positions not zeroed",
    "cross_entropy: divided by every position, ignored ones too": "divided by every position",
    "layernorm: - mean(dxhat) missing": "without the mean term",
    "layernorm: - xhat mean(dxhat xhat) missing": "without the xhat term",
    "layernorm: both terms missing": "dxhat / sigma only",
    "layernorm: 1/(d-1) in the xhat term": "unbiased variance",
    "layernorm: dxhat = dout (gamma forgotten)": "gamma forgotten",
    "rmsnorm: xhat term missing": "without the xhat term",
    "rmsnorm: gamma forgotten": "gamma forgotten",
    "embedding: dtable[ids] += dout": "dtable[ids] += dout",
    "attention: dQ without the scale": "no scale",
    "attention: dK = dS @ Q": "dK not transposed",
    "attention: dV = A @ dout": "dV not transposed",
    "attention: dQ without scale=0.5": "no scale",
    "attention: softmax term missing in dS": "without the subtraction",
    "scaled_dot_scores: dK = dS @ Q": "dK not transposed",
    "rope: rotated by +theta": "rotated by +theta",
    "rope: rotated by +theta (half layout, offset positions)": "rotated by +theta",
    "lora: dA without the scale": "dA without s",
    "lora: alpha instead of alpha/r in dB": "alpha instead of alpha/r",
    "lora: dx without the LoRA branch": "dx without the branch",
    "sequence_logprobs: mask ignored in backward": "mask ignored",
}
for _bug in BUGS:
    if _bug.name in _KNOWN:
        _bug.known = {_KNOWN[_bug.name]}

# Kinds that describe where or what without claiming a cause (and the fallback "no simple
# pattern fits", which counts as a miss): never a wrong cause.
_NEUTRAL = {"slice", "partial_factor", "none"}


@functools.lru_cache(maxsize=None)
def _check(name, seed=0):
    bug = next(b for b in BUGS if b.name == name)
    inputs = bug.inputs(np.random.default_rng(seed))
    return check_gradients(bug.forward, bug.backward, inputs, names=bug.names, seed=seed)


def _kind(s, bug):
    """The kind of a sentence; a known mistake of the catalogue counts as the expected
    cause when it is one of the bug's names, and as a wrong cause otherwise."""
    kind = getattr(s, "kind", "other")
    if kind == "known_mistake":
        return next(iter(bug.expect)) if s.mistake in bug.known else f"known: {s.mistake}"
    return kind


def _verdict(bug, res):
    """(hit, wrong): every failing input names an expected cause / some sentence names a
    cause that is not this bug's."""
    kinds = {p: {_kind(s, bug) for s in sentences} for p, sentences in res.diagnoses.items()}
    failing = [row.position for row in res.rows if row.verdict == "FAIL"]
    hit = bool(failing) and all(kinds.get(p, set()) & bug.expect for p in failing)
    wrong = set().union(*kinds.values()) - bug.expect - bug.allowed - _NEUTRAL if kinds else set()
    return hit, wrong


# One planted bug per diagnosis class, with the words its sentence must contain.
CLASSES = [
    ("missing mean term (constant along the row)", "layernorm: - mean(dxhat) missing",
     ["constant along axis -1 (d = 7) within each row", "`- mean(dxhat)`", "is missing"]),
    ("row scalar times the output y", "softmax: - y sum(dout y) missing",
     ["c_i * y along axis -1 (d = 7)", "- y * sum(dout * y)", "is missing"]),
    ("row scalar times softmax(x) (log-softmax)", "log_softmax: - softmax sum(dout) missing",
     ["c_i * softmax(x) along axis -1", "- softmax(x) * sum(dout)"]),
    ("row scalar times xhat", "layernorm: - xhat mean(dxhat xhat) missing",
     ["c_i * xhat along axis -1 (d = 7)", "- xhat * mean(dxhat * xhat)", "is missing"]),
    ("row scalar times x (RMSNorm)", "rmsnorm: xhat term missing",
     ["c_i * x along axis -1 (d = 6)", "RMSNorm"]),
    ("cross-entropy softmax term", "cross_entropy: softmax term missing",
     ["c_i * softmax(x) along axis -1 (K = 5)", "cross-entropy"]),
    ("cross-entropy one-hot term", "cross_entropy: one-hot term missing",
     ["only the entries picked by targets are wrong", "onehot(targets)"]),
    ("label smoothing", "cross_entropy: label smoothing ignored in backward",
     ["onehot(targets) along axis -1", "smoothing is missing or wrong"]),
    ("sum over the wrong axis", "softmax: sum over axis 0",
     ["runs over axis -3 where it must run over axis -1 (d = 7)"]),
    ("the softmax's axis option ignored", "softmax: axis option ignored in backward",
     ["runs over axis -1 where it must run over axis -2"]),
    ("summed over every axis", "softmax: sum over every axis",
     ["summed over every axis", "axis=-1, keepdims=True"]),
    ("variance normaliser", "layernorm: 1/(d-1) in the xhat term",
     ["d/(d-1) = 7/6 x the right one", "d - 1 = 6 instead of d = 7"]),
    ("a term with the wrong sign", "layernorm: xhat term with the wrong sign", ["has the wrong sign"]),
    ("elementwise derivative: x pdf(x) missing", "gelu: x * pdf(x) missing",
     ["elementwise op", "your f'(x) is wrong"]),
    ("elementwise derivative: tanh form for the exact GELU", "gelu: tanh derivative for the exact form",
     ["your f'(x) is wrong"]),
    ("transpose inside a product: dx = dout @ W", "linear: dx = dout @ W",
     ["transposed factor in a product", "W in place of W.T"]),
    ("transpose inside a product: dK = dS @ Q", "attention: dK = dS @ Q",
     ["dK = X @ Q where the right gradient is X.T @ Q"]),
    ("repeated ids", "embedding: dtable[ids] += dout",
     ["repeated ids must accumulate", "np.add.at", "rows 1, 4"]),
    ("positions a mask removes", "attention: causal mask not applied to P in backward",
     ["confined to positions a mask touches", "keys hidden from some query"]),
    ("rotation in the wrong direction", "rope: rotated by +theta",
     ["rotation in the wrong direction", "vanishes at position 0"]),
    ("a factor left out (gamma)", "layernorm: dxhat = dout (gamma forgotten)",
     ["with gamma = 1", "dxhat = dout * gamma"]),
    ("a path left out", "lora: dx without the LoRA branch", ["= 0: the term of dx that goes through"]),
    ("factor named 1/scale", "attention: dQ without scale=0.5",
     ["analytic = 2 x numeric (2 = 1/scale, scale = 0.5)"]),
    ("factor named 1/(scale*sqrt(d_k))", "attention: 1/sqrt(d_k) where scale=0.5 was given",
     ["1/(scale*sqrt(d_k))"]),
    ("factor named N", "cross_entropy: /N missing",
     ["analytic = 6 x numeric (6 = N = n_valid, N = 6 rows of logits)"]),
    ("factor named sqrt(d_k)", "attention: dQ without the scale", ["sqrt(d_k)", "d_k = 7"]),
    ("factor named r (alpha/r)", "lora: alpha instead of alpha/r in dB", ["(3 = r"]),
]


@pytest.mark.parametrize("label, bug, words", CLASSES, ids=[c[0] for c in CLASSES])
def test_each_diagnosis_class_names_its_mistake(label, bug, words):
    res = _check(bug)
    text = _all(res)
    assert not res.passed
    for w in words:
        assert w in text, f"{label}: {w!r} not in\n{res}"
    assert NO_PATTERN not in text, str(res)
    hit, wrong = _verdict(next(b for b in BUGS if b.name == bug), res)
    assert hit and not wrong, (wrong, str(res))


def test_battery_of_planted_bugs():
    hits, misses, wrong_causes = 0, [], []
    for bug in BUGS:
        res = _check(bug.name)
        assert not res.passed, f"{bug.name}: the planted bug was not caught\n{res}"
        hit, wrong = _verdict(bug, res)
        hits += hit
        if not hit:
            misses.append(bug.name)
        if wrong:
            wrong_causes.append((bug.name, sorted(wrong), _all(res)))
    rate = hits / len(BUGS)
    assert not wrong_causes, wrong_causes
    assert rate >= 0.9, f"{hits}/{len(BUGS)} named; missed: {misses}"


# The mistakes issue 28 lists, each written by a student (not from the reference backward):
# every one must be named by the catalogue's sentence.
_LISTED = [
    ("student softmax: diagonal only, y * (1 - y) * dout", "y * (1 - y) * dout keeps only the diagonal"),
    ("student attention: softmax backward without its subtraction", "missing its subtraction"),
    ("student layernorm: staged derivation with the unbiased variance", "unbiased variance"),
    ("student layernorm: not divided by sigma", "must still be divided by sigma"),
    ("student layernorm: dgamma = sum(dout)", "dgamma = sum over rows of dout * xhat"),
    ("gelu: tanh derivative for the exact form", "the tanh approximation's derivative"),
    ("gelu: x * pdf(x) missing", "x * phi(x) term"),
    ("student dpo_loss: sigmoid(+margin)", "sigmoid(+margin) where sigmoid(-margin) belongs"),
]


@pytest.mark.parametrize("bug, words", _LISTED, ids=[b for b, _ in _LISTED])
def test_the_listed_mistakes_are_named(bug, words):
    res = _check(bug)
    text = _all(res)
    assert words in text and "known wrong backward" in text, str(res)
    assert NO_PATTERN not in text


def test_student_battery_is_named_too():
    """The student-written half of the battery alone also clears 90 %."""
    hits = [_verdict(bug, _check(bug.name))[0] for bug in STUDENT_BUGS]
    assert len(STUDENT_BUGS) >= 35 and sum(hits) / len(hits) >= 0.9, \
        [b.name for b, h in zip(STUDENT_BUGS, hits) if not h]


def test_grading_diagnoses_use_the_case_when_given():
    from numpytfmr.grading.compare import diagnose_values

    x = np.random.default_rng(0).standard_normal((2, 3, 7))
    y, cache = nt.softmax_forward(x)
    dout = np.random.default_rng(1).standard_normal(y.shape)
    expected, got = nt.softmax_backward(dout, cache), y * dout
    assert diagnose_values(got, expected, dout) == []          # two arrays alone: no pattern
    text = " ".join(diagnose_values(got, expected, dout, forward=nt.softmax_forward, inputs=(x,),
                                    position=0, names=["x"], out=y))
    assert "expected - yours = c_i * y along axis -1 (d = 7)" in text
    assert "a term proportional to the output is missing" in text


def test_factor_sentences_print_no_name_when_there_is_none():
    res = check_gradients(lambda x: (x.sum() / 6.0, {}), lambda d, c: d * np.ones(6) * 1.37 / 6.0,
                          (np.arange(6.0),))
    text = _all(res)
    assert "analytic = 1.37 x numeric" in text and "(1.37 =" not in text


# =========================================================================================
# Part 3: no false alarms, and the same sentences in the autograder's feedback
# =========================================================================================

_REFERENCE = {
    "linear": (nt.linear_forward, nt.linear_backward, _linear_in),
    "softmax": (nt.softmax_forward, nt.softmax_backward, _normal(2, 3, 7)),
    "log_softmax": (nt.log_softmax_forward, nt.log_softmax_backward, _normal(3, 6)),
    "gelu": (nt.gelu_forward, nt.gelu_backward, _normal(4, 6, scale=2.0)),
    "cross_entropy": (P(nt.cross_entropy_forward, label_smoothing=0.2), nt.cross_entropy_backward, _ce_in),
    "layernorm": (nt.layernorm_forward, nt.layernorm_backward, _ln_in),
    "rmsnorm": (nt.rmsnorm_forward, nt.rmsnorm_backward,
                lambda rng: (rng.standard_normal((2, 3, 6)), rng.standard_normal(6))),
    "embedding": (nt.embedding_forward, nt.embedding_backward,
                  lambda rng: (np.array([[1, 4, 2, 4]]), rng.standard_normal((7, 3)))),
    "attention": (P(nt.attention_forward, mask=_CAUSAL), nt.attention_backward,
                  _attention_in((2, 4, 5), (2, 4, 5), (2, 4, 5))),
    "rope": (P(nt.rope_forward, positions=np.arange(5)), nt.rope_backward, _normal(2, 5, 8)),
    "lora_linear": (P(nt.lora_linear_forward, alpha=6.0), nt.lora_linear_backward, _lora_in),
}


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("op", sorted(_REFERENCE))
def test_correct_backwards_pass_with_no_diagnosis(op, seed):
    forward, backward, make = _REFERENCE[op]
    res = check_gradients(forward, backward, make(np.random.default_rng(seed)), seed=seed)
    assert res.passed and res.diagnoses == {}, str(res)


def test_grade_feedback_carries_the_row_term_sentence(tmp_path):
    from pathlib import Path

    from numpytfmr.grading import grade

    correct = (Path(__file__).parent / "grading_fixtures" / "correct.py").read_text()
    path = tmp_path / "homework.py"
    path.write_text(correct + '''

def softmax_backward(dout, cache):
    # planted: the - y * sum(dout * y) term of the Jacobian-vector product is missing
    return cache["y"] * dout
''')
    report = grade(path, config={"float32_case": False,
                                 "functions": [{"name": "softmax", "cases": [0]}]})
    backward = [t for t in report.tests if t.function == "softmax_backward"]
    assert backward and not any(t.passed for t in backward)
    out = backward[0].output()
    assert "a term proportional to the output is missing" in out, out
    assert "- y * sum(dout * y)" in out
    assert NO_PATTERN not in out


def test_grade_forward_feedback_names_factors_and_options(tmp_path):
    """The grader's forward feedback carries the checker's names: a LoRA scale built with
    the input size where the rank belongs, a loss summed where it is averaged."""
    from pathlib import Path

    from numpytfmr.grading import grade

    correct = (Path(__file__).parent / "grading_fixtures" / "correct.py").read_text()
    planted = correct.replace("    r = A.shape[1]\n    s = alpha", "    r = A.shape[0]\n    s = alpha")
    planted = planted.replace("    loss = np.where(valid, per, 0).sum() / max(n, 1)",
                              "    loss = np.where(valid, per, 0).sum()")
    assert planted.count("A.shape[0]\n    s = alpha") == 1 and "per, 0).sum()\n" in planted
    path = tmp_path / "homework.py"
    path.write_text(planted)
    report = grade(path, config={"float32_case": False,
                                 "functions": [{"name": "lora_linear", "cases": [0]},
                                               {"name": "cross_entropy", "cases": [0]}]})
    out = {t.function: t.output() for t in report.tests if not t.passed}
    backward = {t.function: t for t in report.tests}["lora_linear_backward"]
    lora = out["lora_linear_forward"]
    assert "alpha multiplied by 0.4286 (0.4286 = r/d_in, r = 3, d_in = 7)" in lora, lora
    assert "a d_in where r belongs? (e.g. alpha/d_in in place of alpha/r)" in lora
    assert "no simple pattern" not in lora
    # the backward is right for that forward: credited, and the diagnosis still names the slip
    assert backward.passed and "credited: lora_linear_backward" in backward.output()
    assert 'known wrong backward "rank taken as d_in"' in backward.output()
    ce = out["cross_entropy_forward"]
    assert "your output = 6 x the expected output (6 = N, N = 6 rows of logits (2 x 3))" in ce, ce


@pytest.mark.parametrize("bug", [b for b in BUGS if b.known], ids=lambda b: b.name)
def test_bugs_that_are_catalogue_entries_are_named_by_them(bug):
    """A planted bug that is one of its op's known wrong backwards gets that name (the
    catalogue's variant computes what the independently written bug computes)."""
    res = _check(bug.name)
    named = {s.mistake for sentences in res.diagnoses.values() for s in sentences
             if getattr(s, "kind", "") == "known_mistake"}
    assert bug.known <= named, (bug.known, named, str(res))
