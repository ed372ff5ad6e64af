"""Registry entries of the core ops: linear, activations, softmax family, cross-entropy,
norms, embedding, dropout and the FFN.

Every ``make_cases(rng, dtype)`` returns small cases (odd sizes, d = 7, leading batch axes)
whose random inputs are well-conditioned for finite differences: ReLU inputs are kept
away from the kink, softmax and LayerNorm inputs are O(1).
"""
import numpy as np

from . import Case, OpSpec
from .. import activations, dropout, embedding, ffn, linear, losses, norms

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


OPS = [
    OpSpec("linear", linear.linear_forward, linear.linear_backward, _linear_cases,
           "004 eq. 17 (row form)"),
    OpSpec("relu", activations.relu_forward, activations.relu_backward, _relu_cases, "004 eq. 17"),
    OpSpec("gelu", activations.gelu_forward, activations.gelu_backward, _gelu_cases,
           "Hendrycks & Gimpel 2016 (FFN activation of GPT)"),
    OpSpec("softmax", activations.softmax_forward, activations.softmax_backward, _softmax_cases,
           "003 §5.1, 004 eq. 18"),
    OpSpec("log_softmax", activations.log_softmax_forward, activations.log_softmax_backward,
           _softmax_cases, "003 §2.1.2"),
    OpSpec("cross_entropy", losses.cross_entropy_forward, losses.cross_entropy_backward,
           _cross_entropy_cases, "003 eq. 2.2, §3.7"),
    OpSpec("layernorm", norms.layernorm_forward, norms.layernorm_backward, _layernorm_cases,
           "004 eq. 27-28"),
    OpSpec("rmsnorm", norms.rmsnorm_forward, norms.rmsnorm_backward, _rmsnorm_cases,
           "Zhang & Sennrich 2019"),
    OpSpec("embedding", embedding.embedding_forward, embedding.embedding_backward, _embedding_cases,
           "004 eq. 12 (lookup)"),
    OpSpec("dropout", dropout.dropout_forward, dropout.dropout_backward, _dropout_cases,
           "inverted dropout"),
    OpSpec("ffn", ffn.ffn_forward, ffn.ffn_backward, _ffn_cases, "004 eq. 17, 002"),
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


OPS += [
    OpSpec("silu", activations.silu_forward, activations.silu_backward, _silu_cases,
           "Elfwing et al. 2018 (SwiGLU gate)"),
    OpSpec("swiglu_ffn", ffn.swiglu_ffn_forward, ffn.swiglu_ffn_backward, _swiglu_cases,
           "Shazeer 2020 (LLaMA FFN)"),
]
