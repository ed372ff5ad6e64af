"""Every registered op, through the registry: the checks that apply to all of them."""
import numpy as np
import pytest

from numpytfmr.run.commands.check import check_op
from numpytfmr.registry import bind, registry

OPS = list(registry())


def _float_arrays(args):
    return [a for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f"]


def _as_dtype(value, dtype):
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    return value


def test_registry_is_not_empty_and_names_match_functions():
    assert len(OPS) >= 10
    for name, spec in registry().items():
        assert spec.forward.__name__ == f"{name}_forward", name
        assert spec.backward.__name__ == f"{name}_backward", name


@pytest.mark.parametrize("name", OPS)
def test_at_least_three_shapes(name):
    cases = registry()[name].make_cases(np.random.default_rng(0), np.float64)
    shapes = {tuple(a.shape for a in _float_arrays(c.args)) for c in cases}
    assert len(shapes) >= 3, f"{name}: only {len(shapes)} distinct input shapes"


@pytest.mark.parametrize("name", OPS)
def test_backward_matches_finite_differences(name):
    spec = registry()[name]
    results = check_op(spec, seed=0)
    assert results, f"{name}: no gradient-checkable case"
    for case, res in results:
        assert res.passed, f"{name} [{case.label}]\n{res}"
        assert max(res.errors.values()) <= 1e-7, f"{name} [{case.label}]\n{res}"
        assert res.diagnoses == {}, f"{name} [{case.label}]: a diagnosis for a correct backward\n{res}"


@pytest.mark.parametrize("name", OPS)
def test_float32_in_float32_out(name):
    spec = registry()[name]
    for case in spec.make_cases(np.random.default_rng(1), np.float32):
        args = [_as_dtype(a, np.float32) for a in case.args]
        kwargs = {k: _as_dtype(v, np.float32) for k, v in case.kwargs.items()}
        out, cache = bind(spec.forward, kwargs)(*args)
        assert np.asarray(out).dtype == np.float32, f"{name} [{case.label}]: out is {np.asarray(out).dtype}"
        dout = np.ones_like(np.asarray(out), dtype=np.float32)
        grads = spec.backward(dout, cache)
        if not isinstance(grads, tuple):
            grads = (grads,)
        assert len(grads) == len(args), f"{name}: {len(grads)} gradients for {len(args)} inputs"
        for a, g in zip(args, grads):
            if g is not None:
                assert g.dtype == np.float32, f"{name} [{case.label}]: gradient dtype {g.dtype}"
                assert g.shape == a.shape
                assert np.all(np.isfinite(g))


@pytest.mark.parametrize("name", OPS)
def test_forward_and_backward_leave_inputs_unchanged(name):
    spec = registry()[name]
    for case in spec.make_cases(np.random.default_rng(2), np.float64):
        before = [a.copy() if isinstance(a, np.ndarray) else a for a in case.args]
        out, cache = bind(spec.forward, case.kwargs)(*case.args)
        dout = np.random.default_rng(3).standard_normal(np.shape(out))
        dout_copy = dout.copy()
        spec.backward(dout, cache)
        for a, b in zip(case.args, before):
            if isinstance(a, np.ndarray):
                assert np.array_equal(a, b), f"{name} [{case.label}] changed an input"
        assert np.array_equal(dout, dout_copy), f"{name} changed dout"
