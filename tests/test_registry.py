"""Every registered op, through the registry: the checks that apply to all of them."""
import ast
import inspect
import pathlib

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


# --- one truth per op: what the machinery knows of an op is read from its registration ----------
# An op's cases, grading-only cases, catalogue of wrong backwards, named wrong forwards (slips),
# the options a forward may take, the options no skeleton shows and the ones dropped together
# are all fields of its OpSpec, in one registry topic file; its student notes are a table of the
# TOML file beside it. The consumers read them from there.

_PKG = pathlib.Path(__file__).resolve().parents[1] / "numpytfmr"
# Files that stand alone (copied into a student folder, run with only NumPy): they cannot read
# the registry, and are given what they need in the check data.
_STANDALONE = {"selfcheck.py", "judge.py"}


def _op_keyed_tables(path, ops):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if any(k in ops for k in keys if isinstance(k, str)):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_op_keyed_tables_finds_a_table_of_ops(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('P = {"dropout": "p", "lora_linear": "dropout"}\nQ = {"other": 1}\n')
    assert _op_keyed_tables(f, {"dropout", "lora_linear"}) == ["m.py:1"]


def test_the_grader_keeps_no_table_of_ops_of_its_own():
    ops = set(registry())
    found = [hit for path in sorted((_PKG / "grading").glob("*.py")) if path.name not in _STANDALONE
             for hit in _op_keyed_tables(path, ops)]
    assert not found, "per-op tables outside the registry (declare them on the OpSpec): " + \
        ", ".join(found)
    assert not (_PKG / "grading" / "mistakes.py").exists()


def test_the_grader_reads_each_ops_declarations_from_its_registration():
    from numpytfmr.grading import cases, contracts
    ops = registry()
    assert cases.EXTRA_CASES == {n: s.extra_cases for n, s in ops.items() if s.extra_cases}
    for name, spec in ops.items():
        notes = contracts.notes_for(name)
        assert notes.omit == tuple(spec.omit), name
        assert notes.depends == dict(spec.depends), name
        assert cases.resolve(name).spec is spec
    for name, helper in cases.helpers().items():
        assert contracts.notes_for(name).omit == tuple(helper.omit), name
    # the random ops are the ones that declare the keyword of their drop probability
    assert {n for n, s in ops.items() if s.random} == {"dropout", "lora_linear"}
    for name in ("dropout", "lora_linear"):
        assert ops[name].random in inspect.signature(ops[name].forward).parameters


@pytest.mark.parametrize("name", [n for n, s in registry().items() if s.slips])
def test_each_named_slip_is_a_wrong_output_the_grader_offers(name):
    """Every slip an op declares differs from the right output on some case, and the grader's
    near-miss candidates of that case carry its sentence."""
    from numpytfmr.grading import cases, grader
    spec = registry()[name]
    item = cases.resolve(name)
    seen, offered = set(), set()
    for gc in cases.make_graded_cases(item, seed=0):
        right = bind(spec.forward, gc.case.kwargs)(*gc.case.args)[0]
        for sentence, thunk in spec.slips(lambda *a, **kw: bind(spec.forward, kw)(*a),
                                         gc.case.args, gc.case.kwargs):
            seen.add(sentence)
            if not np.allclose(thunk(), right):
                offered.update(s for s, _ in grader.near_miss_candidates(
                    item, gc, cases.input_names(spec)))
    assert seen, f"{name}: no case where its slips apply"
    assert seen <= offered, f"{name}: slips the grader does not offer: {seen - offered}"
