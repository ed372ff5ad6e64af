"""Cross-cutting: properties every core op of the registry has (registry/core.py): float32 in,
float32 out; nothing modified; finite outputs; bad input, a wrong dout and a foreign cache
refused with the argument named. The gradient checks themselves are in test_registry.py.
"""
import copy
import re

import numpy as np
import pytest

from numpytfmr import (
    cross_entropy_forward, dropout_forward, embedding_forward, ffn_forward, gelu_forward,
    layernorm_forward, linear_forward, log_softmax_forward, relu_forward, rmsnorm_forward,
    softmax_forward,
)
from numpytfmr.registry import bind
from numpytfmr.registry.core import OPS


SPECS = {spec.name: spec for spec in OPS}


ALL_CASES = [(spec.name, i) for spec in OPS
             for i, _ in enumerate(spec.make_cases(np.random.default_rng(0), np.float64))]


def _case(name, i, dtype=np.float64, seed=0):
    return SPECS[name].make_cases(np.random.default_rng(seed), dtype)[i]


def _as_tuple(grads):
    return grads if isinstance(grads, tuple) else (grads,)


def test_every_core_op_is_registered():
    assert set(SPECS) == {"linear", "relu", "gelu", "softmax", "log_softmax", "cross_entropy",
                          "layernorm", "rmsnorm", "embedding", "dropout", "ffn", "silu",
                          "swiglu_ffn"}
    gelu_cases = SPECS["gelu"].make_cases(np.random.default_rng(0), np.float64)
    gelu_forms = {c.kwargs.get("approximate") for c in gelu_cases}
    assert gelu_forms == {"none", "tanh"}


@pytest.mark.parametrize("name,i", ALL_CASES)
def test_float32_in_float32_out(name, i):
    spec, case = SPECS[name], _case(name, i, np.float32)
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    assert np.asarray(out).dtype == np.float32
    dout = np.random.default_rng(5).standard_normal(np.shape(out)).astype(np.float32)
    grads = _as_tuple(spec.backward(dout, cache))
    assert len(grads) == len(case.args)
    for a, g in zip(case.args, grads):
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            assert g is not None and g.dtype == np.float32 and g.shape == a.shape
            assert np.all(np.isfinite(g))
        else:
            assert g is None  # absent optional inputs and integer ids take no gradient


@pytest.mark.parametrize("name,i", ALL_CASES)
def test_inputs_dout_and_cache_are_not_modified(name, i):
    spec, case = SPECS[name], _case(name, i)
    args = [a.copy() if isinstance(a, np.ndarray) else a for a in case.args]
    out, cache = bind(spec.forward, case.kwargs)(*args)
    for a, b in zip(args, case.args):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
    dout = np.random.default_rng(1).standard_normal(np.shape(out))
    dout_before, cache_before = dout.copy(), copy.deepcopy(cache)
    grads = _as_tuple(spec.backward(dout, cache))
    assert np.array_equal(dout, dout_before)
    for key, value in cache_before.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(cache[key], value, equal_nan=True), key
    for a, b in zip(args, case.args):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
    for g in grads:  # a gradient never aliases dout (a caller may add into it in place)
        assert g is None or not np.shares_memory(g, dout)


@pytest.mark.parametrize("name,i", ALL_CASES)
def test_outputs_and_gradients_are_finite_without_overflow(name, i):
    spec, case = SPECS[name], _case(name, i)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out, cache = bind(spec.forward, case.kwargs)(*case.args)
        grads = _as_tuple(spec.backward(np.ones(np.shape(out)), cache))
    assert np.all(np.isfinite(out))
    assert all(g is None or np.all(np.isfinite(g)) for g in grads)


RNG = np.random.default_rng(0)


X = RNG.standard_normal((2, 3, 7))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: linear_forward(np.ones((2, 5)), np.ones((6, 3))), ValueError,
     r"linear_forward: W has shape \(6, 3\) but x has shape \(2, 5\); the axes d_in must match"),
    (lambda: linear_forward(X, np.ones((7, 3)), np.ones(4)), ValueError,
     r"b has shape \(4,\) but W has shape \(7, 3\); the axes d_out must match"),
    (lambda: linear_forward(X, np.ones(7)), ValueError, r"W has shape \(7,\)"),
    (lambda: linear_forward(np.ones((2, 7), dtype=int), np.ones((7, 3))), TypeError, r"linear_forward: x .*int"),
    (lambda: relu_forward(np.arange(3)), TypeError, r"relu_forward: x .*int"),
    (lambda: gelu_forward(X, approximate="fast"), ValueError, r"gelu_forward: approximate is 'fast'"),
    (lambda: gelu_forward(np.arange(3)), TypeError, r"gelu_forward: x"),
    (lambda: softmax_forward(X, axis=3), ValueError, r"softmax_forward: axis is 3"),
    (lambda: softmax_forward(X, axis=1.0), TypeError, r"softmax_forward: axis"),
    (lambda: log_softmax_forward(np.arange(3)), TypeError, r"log_softmax_forward: x"),
    (lambda: cross_entropy_forward(X, np.full((2, 3), 7)), ValueError,
     r"cross_entropy_forward: targets has values in \[7, 7\]; expected class ids in \[0, 7\)"),
    (lambda: cross_entropy_forward(X, np.full((2, 3), -1)), ValueError, r"targets has values in \[-1, -1\]"),
    (lambda: cross_entropy_forward(X, np.zeros((2, 3))), TypeError, r"targets has dtype float64"),
    (lambda: cross_entropy_forward(X, np.zeros((3, 2), dtype=int)), ValueError,
     r"targets has shape \(3, 2\) but logits has shape \(2, 3, 7\)"),
    (lambda: cross_entropy_forward(X, np.zeros((2, 3), dtype=int), label_smoothing=1.5), ValueError,
     r"label_smoothing is 1.5"),
    (lambda: cross_entropy_forward(X, np.zeros((2, 3), dtype=int), ignore_index=0.5), TypeError,
     r"ignore_index is 0.5"),
    (lambda: cross_entropy_forward(np.zeros((2, 3), dtype=int), np.zeros(2, dtype=int)), TypeError, r"logits"),
    (lambda: layernorm_forward(X, np.ones(6), None), ValueError,
     r"layernorm_forward: gamma has shape \(6,\) but x has shape \(2, 3, 7\); the axes d must match"),
    (lambda: layernorm_forward(X, None, np.ones((1, 7))), ValueError, r"beta has shape \(1, 7\)"),
    (lambda: layernorm_forward(X, None, None, eps=0.0), ValueError, r"eps is 0.0"),
    (lambda: layernorm_forward(np.ones((2, 7), dtype=np.int32), None, None), TypeError, r"x has dtype int32"),
    (lambda: rmsnorm_forward(X, np.ones(8)), ValueError, r"rmsnorm_forward: gamma has shape \(8,\)"),
    (lambda: embedding_forward(np.array([0, 5]), np.ones((5, 3))), ValueError,
     r"embedding_forward: ids has values in \[0, 5\]; expected values in \[0, 5\)"),
    (lambda: embedding_forward(np.array([-1, 2]), np.ones((5, 3))), ValueError, r"ids has values in \[-1, 2\]"),
    (lambda: embedding_forward(np.array([0.0, 1.0]), np.ones((5, 3))), TypeError,
     r"embedding_forward: ids has dtype float64; expected an integer array"),
    (lambda: embedding_forward(np.array([0, 1]), np.ones((5, 3), dtype=int)), TypeError, r"table"),
    (lambda: embedding_forward(np.array([0, 1]), np.ones(5)), ValueError, r"table has shape \(5,\)"),
    (lambda: dropout_forward(X, p=1.0, rng=np.random.default_rng(0)), ValueError,
     r"dropout_forward: p is 1.0; expected a value in \[0.0, 1.0\)"),
    (lambda: dropout_forward(X, p=-0.1, rng=np.random.default_rng(0)), ValueError, r"p is -0.1"),
    (lambda: dropout_forward(X, p=0.1, rng=np.random.RandomState(0)), TypeError, r"dropout_forward: rng"),
    (lambda: dropout_forward(X, p=0.1, rng=None), TypeError, r"rng"),
    (lambda: dropout_forward(np.arange(4), p=0.1, rng=np.random.default_rng(0)), TypeError, r"x"),
    (lambda: ffn_forward(X, np.ones((7, 5)), None, np.ones((4, 7)), None), ValueError,
     r"ffn_forward: W2 has shape \(4, 7\) but W1 has shape \(7, 5\)"),
    (lambda: ffn_forward(X, np.ones((6, 5)), None, np.ones((5, 7)), None), ValueError,
     r"ffn_forward: x has shape \(2, 3, 7\) but W1 has shape \(6, 5\)"),
    (lambda: ffn_forward(X, np.ones((7, 5)), np.ones(4), np.ones((5, 7)), None), ValueError, r"b1 has shape \(4,\)"),
    (lambda: ffn_forward(X, np.ones((7, 5)), None, np.ones((5, 7)), None, activation="swish"), ValueError,
     r"ffn_forward: activation is 'swish'; expected one of 'relu', 'gelu', 'gelu_tanh'"),
])
def test_bad_input_raises_with_the_argument_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_dout_of_the_wrong_shape_is_refused_naming_dout(name):
    spec, case = SPECS[name], _case(name, 0)
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    bad = np.ones(np.shape(out) + (2,))
    with pytest.raises(ValueError, match=rf"^{name}_backward: dout has shape {re.escape(str(bad.shape))}; "
                                         rf"expected the forward output's shape"):
        spec.backward(bad, cache)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_cache_from_another_op_is_refused_naming_cache(name):
    spec, case = SPECS[name], _case(name, 0)
    out, _ = bind(spec.forward, case.kwargs)(*case.args)
    other = "relu" if name != "relu" else "silu"
    other_case = _case(other, 0)
    _, foreign = bind(SPECS[other].forward, other_case.kwargs)(*other_case.args)
    with pytest.raises(TypeError, match=rf"^{name}_backward: cache is the cache of {other}_forward; "
                                        rf"expected the cache returned by {name}_forward"):
        spec.backward(np.ones(np.shape(out)), foreign)
    with pytest.raises(TypeError, match=rf"^{name}_backward: cache is a dict"):
        spec.backward(np.ones(np.shape(out)), dict(foreign))
