"""Registry entries of the core ops: linear, activations, softmax family, cross-entropy,
norms, embedding, dropout and the FFN.

Every ``make_cases(rng, dtype)`` returns small cases (odd sizes, d = 7, leading batch axes)
whose random inputs are well-conditioned for finite differences: ReLU inputs are kept
away from the kink, softmax and LayerNorm inputs are O(1).
"""
import math

import numpy as np

from . import Case, Mistake, OpSpec, wrong
from .. import activations, dropout, embedding, ffn, linear, losses, norms
from ..activations import normal_cdf, normal_pdf, sigmoid

_SHAPES = ((2, 3, 7), (5, 7), (2, 1, 3, 7))  # (..., d) with d = 7


def _normal(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _off_kink(rng, shape, dtype, low=0.1, high=2.0):
    """Random values with |v| in [low, high]: no element near a kink at 0."""
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return (sign * rng.uniform(low, high, shape)).astype(dtype)


def _linear_cases(rng, dtype):
    return [
        Case((_normal(rng, (2, 3, 7), dtype), _normal(rng, (7, 5), dtype), _normal(rng, (5,), dtype)),
             label="x (2, 3, 7), W (7, 5), b"),
        Case((_normal(rng, (5, 7), dtype), _normal(rng, (7, 3), dtype), None),
             label="x (5, 7), W (7, 3), no bias"),
        Case((_normal(rng, (2, 1, 3, 7), dtype), _normal(rng, (7, 7), dtype), _normal(rng, (7,), dtype)),
             label="x (2, 1, 3, 7), W (7, 7), b"),
        Case((_normal(rng, (7,), dtype), _normal(rng, (7, 3), dtype), _normal(rng, (3,), dtype)),
             label="single row x (7,)"),
    ]


def _relu_cases(rng, dtype):
    return [Case((_off_kink(rng, s, dtype),), label=f"x {s}") for s in _SHAPES]


def _gelu_cases(rng, dtype):
    cases = []
    for form in ("none", "tanh"):
        cases += [Case((_normal(rng, s, dtype, 2.0),), {"approximate": form}, f"x {s}, {form}")
                  for s in _SHAPES]
        tails = np.array([-50.0, -30.0, -9.0, -5.0, 5.0, 9.0, 30.0, 50.0], dtype=dtype)
        cases.append(Case((tails.reshape(2, 4),), {"approximate": form}, f"tails +-50, {form}"))
    return cases


def _softmax_cases(rng, dtype):
    big = _normal(rng, (2, 7), dtype) * 1e4
    return [
        Case((_normal(rng, (2, 3, 7), dtype),), {"axis": -1}, "x (2, 3, 7), last axis"),
        Case((_normal(rng, (5, 7), dtype),), {"axis": 0}, "x (5, 7), axis 0"),
        Case((_normal(rng, (2, 1, 3, 7), dtype),), {"axis": 2}, "x (2, 1, 3, 7), axis 2"),
        Case((big,), {"axis": -1}, "logits of +-1e4", check=False),
    ]


def _cross_entropy_cases(rng, dtype):
    t = lambda shape, K=7: rng.integers(0, K, size=shape)  # noqa: E731
    ignored = t((2, 5))
    ignored[0, 1] = ignored[1, 3] = ignored[1, 4] = -100
    return [
        Case((_normal(rng, (2, 3, 7), dtype), t((2, 3))), {}, "logits (2, 3, 7)"),
        Case((_normal(rng, (5, 7), dtype), t((5,))), {"label_smoothing": 0.1},
             "logits (5, 7), label smoothing 0.1"),
        Case((_normal(rng, (2, 5, 7), dtype), ignored), {"label_smoothing": 0.2, "ignore_index": -100},
             "logits (2, 5, 7), 3 positions ignored, smoothing 0.2"),
        Case((_normal(rng, (3, 7), dtype), np.full((3,), -100)), {"ignore_index": -100},
             "every position ignored"),
        Case((_normal(rng, (1, 2, 3, 7), dtype), t((1, 2, 3))), {"label_smoothing": 1.0},
             "logits (1, 2, 3, 7), label smoothing 1"),
        Case((_normal(rng, (2, 7), dtype) * 1e4, t((2,))), {"label_smoothing": 0.1},
             "logits of +-1e4", check=False),
    ]


def _layernorm_cases(rng, dtype):
    const = _normal(rng, (2, 7), dtype)
    const[1] = 3.0  # a constant row: sigma = sqrt(eps)
    return [
        Case((_normal(rng, (2, 3, 7), dtype), _normal(rng, (7,), dtype), _normal(rng, (7,), dtype)),
             label="x (2, 3, 7), gamma, beta"),
        Case((_normal(rng, (5, 7), dtype), None, None), label="x (5, 7), no gamma, no beta"),
        Case((_normal(rng, (2, 1, 3, 7), dtype), _normal(rng, (7,), dtype), None), {"eps": 1e-3},
             label="x (2, 1, 3, 7), gamma only, eps 1e-3"),
        Case((_normal(rng, (3, 7), dtype), None, _normal(rng, (7,), dtype)), label="beta only"),
        Case((const, _normal(rng, (7,), dtype), _normal(rng, (7,), dtype)),
             label="a constant row", check=False),
    ]


def _rmsnorm_cases(rng, dtype):
    return [
        Case((_normal(rng, (2, 3, 7), dtype), _normal(rng, (7,), dtype)), label="x (2, 3, 7), gamma"),
        Case((_normal(rng, (5, 7), dtype), None), label="x (5, 7), no gamma"),
        Case((_normal(rng, (2, 1, 3, 7), dtype), _normal(rng, (7,), dtype)), {"eps": 1e-3},
             label="x (2, 1, 3, 7), gamma, eps 1e-3"),
    ]


def _embedding_cases(rng, dtype):
    repeated = np.array([[1, 4, 1], [9, 1, 4]])  # ids 1 and 4 repeat: their gradients accumulate
    return [
        Case((repeated, _normal(rng, (11, 7), dtype)), label="ids (2, 3) with repeats, table (11, 7)"),
        Case((rng.integers(0, 5, size=(5,)), _normal(rng, (5, 3), dtype)),
             label="ids (5,), table (5, 3)"),
        Case((rng.integers(0, 7, size=(2, 2, 3)), _normal(rng, (7, 5), dtype)),
             label="ids (2, 2, 3), table (7, 5)"),
    ]


def _dropout_cases(rng, dtype):
    return [
        Case((_normal(rng, (2, 3, 7), dtype),), {"p": 0.3, "rng": 0}, "x (2, 3, 7), p 0.3"),
        Case((_normal(rng, (5, 7), dtype),), {"p": 0.5, "rng": 1}, "x (5, 7), p 0.5"),
        Case((_normal(rng, (2, 1, 3, 7), dtype),), {"p": 0.1, "rng": 2}, "x (2, 1, 3, 7), p 0.1"),
        Case((_normal(rng, (3, 7), dtype),), {"p": 0.5, "rng": 3, "train": False}, "train=False"),
        Case((_normal(rng, (3, 5), dtype),), {"p": 0.0, "rng": 4}, "p 0"),
    ]


def _ffn_inputs(rng, dtype, lead, d_ff, d_out, bias1, bias2, relu):
    """x, W1, b1, W2, b2; for ReLU, redrawn until every pre-activation is off the kink."""
    for _ in range(1000):
        x = rng.standard_normal(lead + (7,))
        W1 = rng.standard_normal((7, d_ff)) / np.sqrt(7)
        b1 = rng.standard_normal(d_ff) if bias1 else None
        h = x @ W1 + (0 if b1 is None else b1)
        if not relu or np.min(np.abs(h)) > 0.05:
            break
    W2 = rng.standard_normal((d_ff, d_out)) / np.sqrt(d_ff)
    b2 = rng.standard_normal(d_out) if bias2 else None
    cast = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
    return tuple(cast(a) for a in (x, W1, b1, W2, b2))


def _ffn_cases(rng, dtype):
    return [
        Case(_ffn_inputs(rng, dtype, (2, 3), 11, 7, True, True, True), {"activation": "relu"},
             "x (2, 3, 7), d_ff 11, relu"),
        Case(_ffn_inputs(rng, dtype, (5,), 9, 7, False, True, False), {"activation": "gelu"},
             "x (5, 7), d_ff 9, gelu, no b1"),
        Case(_ffn_inputs(rng, dtype, (2, 1, 3), 5, 3, True, False, False), {"activation": "gelu_tanh"},
             "x (2, 1, 3, 7), d_ff 5, d_out 3, gelu_tanh, no b2"),
    ]


# ---------------------------------------------------------------------------------------
# Known wrong backwards (the catalogue the gradient checker names): each computes, from the
# reference cache, the gradient a student with that mistake returns.
# ---------------------------------------------------------------------------------------

def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _linear_mistakes():
    names = ("x", "W", "b")

    def dx_with_W(dout, c):
        W = c["W"]
        if W.shape[0] != W.shape[1]:
            raise ValueError("W is not square")
        return (dout @ W, None, None)                 # dout @ W where dout @ W.T belongs

    def mean_over_rows(dout, c):
        x2, d2 = _rows(c["x"]), _rows(dout)
        return (None, x2.T @ d2 / len(d2), d2.sum(axis=0) / len(d2))
    return (wrong("W not transposed in dx", "dx = dout @ W uses W where its transpose belongs: "
                  "for y = x @ W, dx = dout @ W.T", dx_with_W, names, ("x",))
            + wrong("mean over the rows", "the weight gradients are averaged over the rows (N = "
                    "all leading axes): the forward adds each row's contribution, so dW = x^T "
                    "dout and db = dout summed over the rows, with no 1/N", mean_over_rows, names,
                    ("W", "b")))


_RELU = (Mistake("times the output", "x", lambda dout, c: dout * np.maximum(c["x"], 0.0),
                 "dx = dout * relu(x) multiplies by the output; relu'(x) is the indicator "
                 "[x > 0]: dx = dout * (x > 0)"),
         Mistake("inverted mask", "x", lambda dout, c: dout * (c["x"] < 0),
                 "dx = dout * (x < 0) passes the gradient where the ReLU is off; it flows where "
                 "x > 0: dx = dout * (x > 0)"))


def _gelu_tanh_parts(x):
    """s = sigmoid(2u) and du/dx of the tanh form, u = sqrt(2/pi) (x + 0.044715 x^3)."""
    k = math.sqrt(2 / math.pi)
    u = k * (x + 0.044715 * x ** 3)
    return sigmoid(2 * u), k * (1 + 3 * 0.044715 * x ** 2)


def _gelu_tanh_derivative(dout, c):
    if c["approximate"] != "none":
        raise ValueError("only for the exact form")
    s, du = _gelu_tanh_parts(c["x"])
    return dout * (s + c["x"] * s * (1 - s) * 2 * du)


def _gelu_exact_derivative(dout, c):
    if c["approximate"] != "tanh":
        raise ValueError("only for the tanh form")
    x = c["x"]
    return dout * (normal_cdf(x) + x * normal_pdf(x))


def _gelu_no_x_term(dout, c):
    x = c["x"]
    if c["approximate"] == "none":
        return dout * c["Phi"]
    return dout * _gelu_tanh_parts(x)[0]


def _gelu_no_chain(dout, c):
    if c["approximate"] != "tanh":
        raise ValueError("only for the tanh form")
    x = c["x"]
    s, _ = _gelu_tanh_parts(x)
    return dout * (s + x * s * (1 - s) * 2 * math.sqrt(2 / math.pi))


_GELU = (Mistake("tanh derivative for the exact GELU", "x", _gelu_tanh_derivative,
                 "the exact GELU x Phi(x) is differentiated with the tanh approximation's "
                 "derivative; its derivative is Phi(x) + x phi(x) (phi the normal density), "
                 "dx = dout * (Phi + x * normal_pdf(x))"),
         Mistake("exact derivative for the tanh GELU", "x", _gelu_exact_derivative,
                 "the tanh-form GELU is differentiated as the exact x Phi(x); differentiate the "
                 "form the forward computes: s + x s (1 - s) 2 du/dx, s = sigmoid(2u)"),
         Mistake("product rule without the x term", "x", _gelu_no_x_term,
                 "half of the product rule: d(x Phi(x))/dx = Phi(x) + x phi(x), and the x * phi(x) "
                 "term (x times the derivative of the gate) is missing"),
         Mistake("chain rule without du/dx's cubic term", "x", _gelu_no_chain,
                 "the chain rule through u = sqrt(2/pi) (x + 0.044715 x^3) stops at sqrt(2/pi): "
                 "du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)"))

_SOFTMAX = (Mistake("diagonal only", "x", lambda dout, c: c["y"] * (1 - c["y"]) * dout,
                    "y * (1 - y) * dout keeps only the diagonal of the softmax Jacobian; every "
                    "output depends on every input of the row (J = diag(y) - y y^T): "
                    "dx = y * (dout - sum(dout * y, axis, keepdims=True))"),
            Mistake("without the subtraction", "x", lambda dout, c: c["y"] * dout,
                    "y * dout is the Jacobian-vector product without its subtraction: "
                    "dx = y * (dout - sum(dout * y, axis, keepdims=True))"),
            Mistake("plain mean", "x",
                    lambda dout, c: c["y"] * (dout - dout.mean(c["axis"], keepdims=True)),
                    "the row term is the plain mean of dout; it is the y-weighted sum: "
                    "dx = y * (dout - sum(dout * y, axis, keepdims=True))"),
            Mistake("log-softmax's backward", "x",
                    lambda dout, c: dout - c["y"] * dout.sum(c["axis"], keepdims=True),
                    "dout - y * sum(dout) is the backward of log-softmax; softmax's is "
                    "dx = y * (dout - sum(dout * y, axis, keepdims=True))"))

_LOG_SOFTMAX = (Mistake("without the subtraction", "x", lambda dout, c: dout.copy(),
                        "dx = dout leaves out the normaliser's term: dx = dout - softmax(x) * "
                        "sum(dout, axis, keepdims=True), softmax(x) = exp(out)"),
                Mistake("diagonal only", "x", lambda dout, c: dout * (1 - np.exp(c["out"])),
                        "dout * (1 - softmax(x)) keeps only the diagonal of the Jacobian "
                        "delta_ij - softmax_j: dx = dout - softmax(x) * sum(dout, axis, "
                        "keepdims=True)"),
                Mistake("softmax's backward", "x",
                        lambda dout, c: np.exp(c["out"]) * (
                            dout - (dout * np.exp(c["out"])).sum(c["axis"], keepdims=True)),
                        "this is the backward of softmax; log-softmax's is dx = dout - "
                        "softmax(x) * sum(dout, axis, keepdims=True)"))


def _cross_entropy_variant(dout, c, bug):
    """The reference dlogits = (p - q') * w, w = dout * valid / N, with one part changed."""
    right, _ = losses.cross_entropy_backward(dout, c)
    logp, eps, n = c["logp"], c["eps"], max(c["n_valid"], 1)
    w = (dout * c["valid"] / n)[..., None]
    onehot = np.arange(logp.shape[-1]) == c["targets"][..., None]
    if bug == "sum":                                   # w without the 1/N
        return right * n, None
    if bug == "logp":                                  # log p where p belongs
        return right + (logp - np.exp(logp)) * w, None
    if bug == "no smoothing":                          # q' = onehot
        if eps == 0:
            raise ValueError("no label smoothing")
        return right + (eps / logp.shape[-1] - eps * onehot) * w, None
    if bug == "ignored kept":                          # w without the valid mask
        q = (1 - eps) * onehot + eps / logp.shape[-1]
        return (np.exp(logp) - q) * (dout / n)[..., None], None
    return right * n / c["valid"].size, None            # "all positions": N = every position


def _ce(bug, name, text):
    return wrong(name, text, lambda dout, c: _cross_entropy_variant(dout, c, bug),
                 ("logits", "targets"), ("logits",))


_CROSS_ENTROPY = (
    _ce("sum", "sum instead of mean", "the loss is the mean over the N counted positions, so "
        "dlogits = (softmax - onehot) * dout / N: the 1/N is missing")
    + _ce("logp", "log-probabilities for probabilities", "log_softmax(z) - onehot uses the "
          "log-probabilities where the probabilities belong: dlogits = (softmax(z) - onehot) "
          "* dout / N")
    + _ce("no smoothing", "label smoothing left out", "with label smoothing the target is "
          "q' = (1 - eps) onehot + eps / K, and dlogits = (softmax - q') * dout / N")
    + _ce("ignored kept", "ignored positions not zeroed", "positions whose target is "
          "ignore_index take no part in the loss: zero their rows of dlogits")
    + _ce("all positions", "divided by every position", "the mean runs over the counted "
          "positions only: divide by their number n_valid, not by every position"))


def _layernorm_variant(dout, c, bug):
    xhat, sigma, gamma = c["xhat"], c["sigma"], c["gamma"]
    d = xhat.shape[-1]
    g = dout if gamma is None or bug == "no gamma" else dout * gamma
    if bug == "no gamma" and gamma is None:
        raise ValueError("no gamma")
    mean_term = g.mean(-1, keepdims=True)
    xhat_term = xhat * (g * xhat).mean(-1, keepdims=True)
    dgamma = None if gamma is None else _rows(dout * xhat).sum(axis=0)
    if bug == "unbiased":
        xhat_term = xhat * (g * xhat).sum(-1, keepdims=True) / (d - 1)
    elif bug == "no mean":
        mean_term = 0.0
    elif bug == "no xhat":
        xhat_term = 0.0
    elif bug == "neither":
        mean_term = xhat_term = 0.0
    elif bug == "dgamma":
        dgamma = None if gamma is None else _rows(dout).sum(axis=0)
    dx = g - mean_term - xhat_term
    if bug != "no sigma":
        dx = dx / sigma
    return dx, dgamma, None


def _ln(bug, name, text, of=("x",)):
    return wrong(name, text, lambda dout, c: _layernorm_variant(dout, c, bug),
                 ("x", "gamma", "beta"), of)


_LAYERNORM = (
    _ln("unbiased", "unbiased variance", "the xhat term is divided by d - 1 (the unbiased "
        "variance); LayerNorm's variance is the population one, a mean over d: "
        "dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / sigma")
    + _ln("no sigma", "not divided by sigma", "dxhat - mean(dxhat) - xhat * mean(dxhat * xhat) "
          "must still be divided by sigma = sqrt(var + eps): xhat = (x - mu) / sigma")
    + _ln("dgamma", "dgamma = sum(dout)", "dgamma = sum(dout) is dbeta's formula; gamma "
          "multiplies xhat, so dgamma = sum over rows of dout * xhat", of=("gamma",))
    + _ln("no mean", "without the mean term", "the gradient through the row mean is missing: "
          "dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / sigma")
    + _ln("no xhat", "without the xhat term", "the gradient through sigma is missing: "
          "dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / sigma")
    + _ln("neither", "dxhat / sigma only", "dx = dxhat / sigma treats mu and sigma as "
          "constants; both depend on x: dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) "
          "/ sigma")
    + _ln("no gamma", "gamma forgotten", "dxhat = dout * gamma, not dout: the gain multiplies "
          "xhat in the forward"))


def _rmsnorm_variant(dout, c, bug):
    xhat, rms, gamma = c["xhat"], c["rms"], c["gamma"]
    if bug == "no gamma" and gamma is None:
        raise ValueError("no gamma")
    g = dout if gamma is None or bug == "no gamma" else dout * gamma
    dgamma = None if gamma is None else _rows(dout * xhat).sum(axis=0)
    xhat_term = xhat * (g * xhat).mean(-1, keepdims=True)
    if bug == "no xhat":
        dx = g / rms
    elif bug == "layernorm":
        dx = (g - g.mean(-1, keepdims=True) - xhat_term) / rms
    elif bug == "no rms":
        dx = g - xhat_term
    elif bug == "dgamma":
        dx, dgamma = None, None if gamma is None else _rows(dout).sum(axis=0)
    else:
        dx = (g - xhat_term) / rms
    return dx, dgamma


def _rms(bug, name, text, of=("x",)):
    return wrong(name, text, lambda dout, c: _rmsnorm_variant(dout, c, bug), ("x", "gamma"), of)


_RMSNORM = (
    _rms("no xhat", "without the xhat term", "rms depends on x too: dx = (dxhat - xhat * "
         "mean(dxhat * xhat)) / rms")
    + _rms("layernorm", "LayerNorm's mean term", "RMSNorm does not centre x, so there is no "
           "- mean(dxhat) term: dx = (dxhat - xhat * mean(dxhat * xhat)) / rms")
    + _rms("no rms", "not divided by rms", "the bracket must still be divided by rms = "
           "sqrt(mean(x^2) + eps)")
    + _rms("dgamma", "dgamma = sum(dout)", "gamma multiplies xhat, so dgamma = sum over rows "
           "of dout * xhat", of=("gamma",))
    + _rms("no gamma", "gamma forgotten", "dxhat = dout * gamma, not dout: the gain multiplies "
           "xhat in the forward"))


def _embedding_overwrite(dout, c):
    dtable = np.zeros(c["table_shape"])
    dtable[c["ids"]] += dout                       # fancy-index +=: a repeated id keeps one row
    return dtable


_EMBEDDING = (Mistake("dtable[ids] += dout", "table", _embedding_overwrite,
                      "with fancy indexing a repeated id is written, not added, once per "
                      "occurrence; accumulate every occurrence with np.add.at(dtable, ids, dout)"),)


def _dropout_variant(dout, c, factor):
    if c["mask"] is None:
        raise ValueError("no mask")
    p = 1.0 - 1.0 / c["scale"]
    return dout * c["mask"] * {"none": 1.0, "p": 1.0 / p, "times": 1.0 - p}[factor]


_DROPOUT = (Mistake("not rescaled", "x", lambda dout, c: _dropout_variant(dout, c, "none"),
                    "inverted dropout scales the kept units by 1/(1 - p) in the forward, so "
                    "dx = dout * mask / (1 - p): the 1/(1 - p) is missing"),
            Mistake("divided by p", "x", lambda dout, c: _dropout_variant(dout, c, "p"),
                    "the kept units are scaled by 1/(1 - p), not 1/p: dx = dout * mask / (1 - p)"),
            Mistake("multiplied by 1 - p", "x", lambda dout, c: _dropout_variant(dout, c, "times"),
                    "inverted dropout divides by 1 - p (the expectation is kept in training, "
                    "not at test time): dx = dout * mask / (1 - p)"))


# the backward of each activation name of ffn and swiglu_ffn (the cache holds the form)
_ACTIVATION_BACKWARDS = {"relu": activations.relu_backward, "gelu": activations.gelu_backward,
                         "gelu_tanh": activations.gelu_backward, "silu": activations.silu_backward}


def _ffn_variant(dout, c, bug):
    act_backward = _ACTIVATION_BACKWARDS[c["activation"]]
    da, dW2, db2 = linear.linear_backward(dout, c["lin2"])
    if bug == "dW2 from h":
        dW2 = _rows(c["act"]["x"]).T @ _rows(dout)
    dh = da if bug == "no activation" else act_backward(da, c["act"])
    dx, dW1, db1 = linear.linear_backward(dh, c["lin1"])
    return dx, dW1, db1, dW2, db2


_FFN_NAMES = ("x", "W1", "b1", "W2", "b2")
_FFN = (wrong("activation derivative left out", "the backward of a = act(h) is missing: "
              "dh = act'(h) * da before the first layer's backward",
              lambda dout, c: _ffn_variant(dout, c, "no activation"), _FFN_NAMES,
              ("x", "W1", "b1"))
        + wrong("dW2 from the pre-activation", "the second layer's input is a = act(h), not h: "
                "dW2 = a^T dout", lambda dout, c: _ffn_variant(dout, c, "dW2 from h"),
                _FFN_NAMES, ("W2",)))


# ---------------------------------------------------------------------------------------
# The options a forward written independently of the package may compute (the recogniser of
# checking/recognise.py runs the op with each, the usual ones first)
# ---------------------------------------------------------------------------------------

def _gelu_options(inputs, out):
    return [{"approximate": "none"}, {"approximate": "tanh"}]


def _axis_options(inputs, out):
    ndim = np.ndim(inputs[0])
    return [{"axis": a} for a in range(-1, -ndim - 1, -1)]


def _cross_entropy_options(inputs, out):
    targets = inputs[1] if len(inputs) > 1 else None
    ignore = [None]
    if isinstance(targets, np.ndarray) and targets.dtype.kind in "iu" and (targets < 0).any():
        ignore = [int(targets.min()), None]
    return [{"label_smoothing": eps, "ignore_index": i} for i in ignore for eps in (0.0, 0.1)]


def _eps_options(*values):
    return lambda inputs, out: [{"eps": v} for v in values]


def _dropout_options(inputs, out):
    """p read off the output (kept entries are x / (1 - p)), and the first few seeds."""
    x, y = np.asarray(inputs[0], dtype=np.float64), np.asarray(out, dtype=np.float64)
    kept = (x != 0) & (y != 0)
    if not kept.any():
        return []
    scale = float(np.median(y[kept] / x[kept]))
    if not scale >= 1.0:
        return []
    p = 1.0 - 1.0 / scale
    return [{"p": p, "rng": seed} for seed in range(4)]


def _ffn_options(inputs, out):
    return [{"activation": a} for a in ffn.FFN_ACTIVATIONS]


def _swiglu_options(inputs, out):
    return [{"activation": a} for a in ("silu", "gelu_tanh", "gelu", "relu")]


# ---------------------------------------------------------------------------------------
# Named wrong forwards (OpSpec.slips) and grading-only cases (OpSpec.extra_cases)
# ---------------------------------------------------------------------------------------

def _layernorm_slip(x, gamma, beta, eps, *, ddof=0, eps_outside=False):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).sum(axis=-1, keepdims=True) / (x.shape[-1] - ddof)
    y = (x - mu) / (np.sqrt(var) + eps) if eps_outside else (x - mu) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def _layernorm_slips(forward, args, kwargs):
    x, gamma, beta = args[:3]
    eps = kwargs.get("eps", 1e-5)
    return [("the variance is divided by n - 1 (the unbiased estimate, ddof=1); LayerNorm uses "
             "the population variance, divided by n (np.var's default ddof=0)",
             lambda: _layernorm_slip(x, gamma, beta, eps, ddof=1)),
            ("eps is added to the standard deviation; it belongs inside the square root: "
             "(x - mu) / sqrt(var + eps)",
             lambda: _layernorm_slip(x, gamma, beta, eps, eps_outside=True))]


def _rmsnorm_slip(x, gamma, eps, *, eps_outside=False, centered=False):
    if centered:
        x = x - x.mean(axis=-1, keepdims=True)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    y = x / (np.sqrt(ms) + eps) if eps_outside else x / np.sqrt(ms + eps)
    return y if gamma is None else y * gamma


def _rmsnorm_slips(forward, args, kwargs):
    x, gamma = args[:2]
    eps = kwargs.get("eps", 1e-6)
    return [("eps is added outside the square root; RMSNorm divides by sqrt(mean(x^2) + eps)",
             lambda: _rmsnorm_slip(x, gamma, eps, eps_outside=True)),
            ("the mean is subtracted first: that is LayerNorm; RMSNorm does not centre x",
             lambda: _rmsnorm_slip(x, gamma, eps, centered=True))]


def _dropout_extra(rng, dtype):
    return [Case((rng.standard_normal((40, 50)).astype(dtype),), {"p": 0.3, "rng": 5},
                 "x (40, 50), p 0.3: statistics of the mask")]


OPS = [
    OpSpec("linear", linear.linear_forward, linear.linear_backward, _linear_cases,
           "004 eq. 17 (row form)", mistakes=_linear_mistakes()),
    OpSpec("relu", activations.relu_forward, activations.relu_backward, _relu_cases, "004 eq. 17",
           mistakes=_RELU),
    OpSpec("gelu", activations.gelu_forward, activations.gelu_backward, _gelu_cases,
           "Hendrycks & Gimpel 2016 (FFN activation of GPT)", mistakes=_GELU,
           options=_gelu_options),
    OpSpec("softmax", activations.softmax_forward, activations.softmax_backward, _softmax_cases,
           "003 §5.1, 004 eq. 18", mistakes=_SOFTMAX, options=_axis_options),
    OpSpec("log_softmax", activations.log_softmax_forward, activations.log_softmax_backward,
           _softmax_cases, "003 §2.1.2", mistakes=_LOG_SOFTMAX, options=_axis_options),
    OpSpec("cross_entropy", losses.cross_entropy_forward, losses.cross_entropy_backward,
           _cross_entropy_cases, "003 eq. 2.2, §3.7", mistakes=_CROSS_ENTROPY,
           options=_cross_entropy_options, tune=(("label_smoothing", 1e-4, 1.0),)),
    OpSpec("layernorm", norms.layernorm_forward, norms.layernorm_backward, _layernorm_cases,
           "004 eq. 27-28", mistakes=_LAYERNORM,
           options=_eps_options(1e-5, 1e-6, 1e-8, 1e-12, 1e-3, 0.0), tune=(("eps", 1e-14, 1.0),),
           slips=_layernorm_slips),
    OpSpec("rmsnorm", norms.rmsnorm_forward, norms.rmsnorm_backward, _rmsnorm_cases,
           "Zhang & Sennrich 2019", mistakes=_RMSNORM,
           options=_eps_options(1e-6, 1e-5, 1e-8, 1e-12, 0.0), tune=(("eps", 1e-14, 1.0),),
           slips=_rmsnorm_slips),
    OpSpec("embedding", embedding.embedding_forward, embedding.embedding_backward, _embedding_cases,
           "004 eq. 12 (lookup)", mistakes=_EMBEDDING),
    OpSpec("dropout", dropout.dropout_forward, dropout.dropout_backward, _dropout_cases,
           "inverted dropout", mistakes=_DROPOUT, options=_dropout_options,
           extra_cases=_dropout_extra, random="p"),
    OpSpec("ffn", ffn.ffn_forward, ffn.ffn_backward, _ffn_cases, "004 eq. 17, 002",
           mistakes=_FFN, options=_ffn_options),
]


# ---------------------------------------------------------------------------------------
# The gated feed-forward layer of LLaMA: SiLU and SwiGLU
# ---------------------------------------------------------------------------------------

def _silu_cases(rng, dtype):
    cases = [Case((_normal(rng, s, dtype, 2.0),), label=f"x {s}") for s in _SHAPES]
    tails = np.array([-800.0, -50.0, -20.0, -5.0, 5.0, 20.0, 50.0, 800.0], dtype=dtype)
    cases.append(Case((tails.reshape(2, 4),), label="tails +-800"))
    return cases


def _swiglu_inputs(rng, dtype, lead, d_ff, d_out):
    x = rng.standard_normal(lead + (7,))
    W_gate = rng.standard_normal((7, d_ff)) / np.sqrt(7)
    W_up = rng.standard_normal((7, d_ff)) / np.sqrt(7)
    W_down = rng.standard_normal((d_ff, d_out)) / np.sqrt(d_ff)
    return tuple(a.astype(dtype) for a in (x, W_gate, W_up, W_down))


def _swiglu_cases(rng, dtype):
    return [
        Case(_swiglu_inputs(rng, dtype, (2, 3), 11, 7), {}, "x (2, 3, 7), d_ff 11"),
        Case(_swiglu_inputs(rng, dtype, (5,), 9, 7), {}, "x (5, 7), d_ff 9"),
        Case(_swiglu_inputs(rng, dtype, (2, 1, 3), 5, 3), {}, "x (2, 1, 3, 7), d_ff 5, d_out 3"),
        Case(_swiglu_inputs(rng, dtype, (3,), 5, 7), {"activation": "gelu_tanh"},
             "x (3, 7), GEGLU (gelu_tanh gate)"),
    ]


_SILU = (Mistake("product rule without the x term", "x", lambda dout, c: dout * c["s"],
                 "half of the product rule: d(x sigmoid(x))/dx = s + x s (1 - s), and the "
                 "x s (1 - s) term is missing"),
         Mistake("sigmoid's derivative only", "x", lambda dout, c: dout * c["s"] * (1 - c["s"]),
                 "s (1 - s) is the derivative of the sigmoid alone; silu(x) = x s, so "
                 "dx = dout * (s + x * s * (1 - s))"),
         Mistake("product rule without x", "x",
                 lambda dout, c: dout * (c["s"] + c["s"] * (1 - c["s"])),
                 "the second term of the product rule lost its x: "
                 "dx = dout * (s + x * s * (1 - s))"))


def _swiglu_variant(dout, c, bug):
    act_backward = _ACTIVATION_BACKWARDS[c["activation"]]
    dh, dW_down, _ = linear.linear_backward(dout, c["down"])
    da, du = dh * c["u"], dh * c["a"]
    if bug == "swapped":
        da, du = dh * c["a"], dh * c["u"]
    dg = da if bug == "no activation" else act_backward(da, c["act"])
    dx_gate, dW_gate, _ = linear.linear_backward(dg, c["gate"])
    dx_up, dW_up, _ = linear.linear_backward(du, c["up"])
    dx = {"gate only": dx_gate, "up only": dx_up}.get(bug, dx_gate + dx_up)
    return dx, dW_gate, dW_up, dW_down


def _sw(bug, name, text, of):
    return wrong(name, text, lambda dout, c: _swiglu_variant(dout, c, bug),
                 ("x", "W_gate", "W_up", "W_down"), of)


_SWIGLU = (_sw("gate only", "x through the gate only", "x feeds both projections, so dx is the "
               "sum of both paths: dx = dg W_gate^T + du W_up^T", ("x",))
           + _sw("up only", "x through the up projection only", "x feeds both projections, so "
                 "dx is the sum of both paths: dx = dg W_gate^T + du W_up^T", ("x",))
           + _sw("no activation", "gate's activation derivative left out", "a = act(g), so "
                 "dg = act'(g) * da before the gate's linear backward", ("x", "W_gate"))
           + _sw("swapped", "product rule factors swapped", "for h = a * u, dh/da = u and dh/du "
                 "= a: da = dh * u, du = dh * a", ("x", "W_gate", "W_up")))


def _swiglu_extra(rng, dtype):
    x = rng.standard_normal((2, 3, 7))
    W_gate = rng.standard_normal((7, 5)) / np.sqrt(7)
    W_up = rng.standard_normal((7, 5)) / np.sqrt(7)
    W_down = rng.standard_normal((5, 7)) / np.sqrt(5)
    args = tuple(a.astype(dtype) for a in (x, W_gate, W_up, W_down))
    return [Case(args, {"activation": "gelu"}, "x (2, 3, 7), d_ff 5, GEGLU (exact gelu gate)")]


OPS += [
    OpSpec("silu", activations.silu_forward, activations.silu_backward, _silu_cases,
           "Elfwing et al. 2018 (SwiGLU gate)", mistakes=_SILU),
    OpSpec("swiglu_ffn", ffn.swiglu_ffn_forward, ffn.swiglu_ffn_backward, _swiglu_cases,
           "Shazeer 2020 (LLaMA FFN)", mistakes=_SWIGLU, options=_swiglu_options,
           extra_cases=_swiglu_extra),
]
