"""The judge (numpytfmr/grading/judge.py): one module of comparison and verdict code for the
grader and the students' check.py. It imports only the standard library and NumPy, and
make-assignment hands it out unchanged beside check.py."""
import ast
import pathlib
import sys

import numpy as np
import pytest

from numpytfmr.grading import compare, judge, selfcheck
from numpytfmr.grading.skeleton import make_assignment

JUDGE = pathlib.Path(judge.__file__)


def test_judge_imports_only_the_standard_library_and_numpy():
    tree = ast.parse(JUDGE.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"a relative import in judge.py: from {'.' * node.level}{node.module or ''}"
            imported.add(node.module.split(".")[0])
    assert "numpy" in imported
    assert imported <= set(sys.stdlib_module_names) | {"numpy"}, imported - set(sys.stdlib_module_names)
    # nothing imported by name at run time either
    calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert not [f for f in calls if isinstance(f, ast.Name) and f.id == "__import__"]
    assert not [f for f in calls if isinstance(f, ast.Attribute) and f.attr == "import_module"]


def test_make_assignment_copies_the_judge_byte_for_byte(tmp_path):
    paths = make_assignment(["relu", "dropout"], tmp_path / "hw", hidden_seed=3)
    copy = pathlib.Path(paths["judge"])
    assert copy.parent == pathlib.Path(paths["check"]).parent == pathlib.Path(paths["student"])
    assert copy.name == "judge.py"
    assert copy.read_bytes() == JUDGE.read_bytes()
    # check.py is the package's selfcheck.py, which judges with that module
    assert pathlib.Path(paths["check"]).read_bytes() == pathlib.Path(selfcheck.__file__).read_bytes()
    assert selfcheck.judge is judge


def test_the_grader_and_check_py_share_the_judges_numbers_and_functions():
    """No second copy: the grader's modules hold the judge's own objects."""
    from numpytfmr.grading import cases, channel, grader
    assert compare.TOLERANCES is judge.TOLERANCES and compare.check_value is judge.check_value
    assert compare.close_at is judge.close_at and channel.Returned is judge.Returned
    assert cases.DRAWS is judge.DRAWS and grader.redraw_seeds is judge.redraw_seeds
    assert cases.DEFAULTS["slip_deduction"] == judge.SLIP_DEDUCTION
    assert grader.H == judge.FD_STEP
    for name in ("TOLERANCES", "DRAW_ALPHA", "RNG_DRAWS", "FD_STEP", "FULL_CHECK_ENTRIES"):
        assert not hasattr(selfcheck, name), name
        assert not hasattr(cases, name) or getattr(cases, name) is getattr(judge, name), name


@pytest.mark.parametrize("value, kind", [(np.zeros(3), "array"), (np.float32(1.0), "scalar"),
                                         (2.5, "pyscalar"), (None, "none"), ((np.zeros(2),), "tuple"),
                                         ([1.0], "list"), (np.array(["a"]), "refused"),
                                         (np.zeros(2).view(np.recarray), "refused"), ("x", "refused")])
def test_returned_classes_a_python_value_as_the_grader_does(value, kind):
    ret = judge.returned(value)
    assert ret.kind == kind
    assert ret.is_number == (kind in ("array", "scalar", "pyscalar"))
    if kind == "scalar":
        assert ret.describe() == "a NumPy scalar (numpy.float32)"
    if kind in ("tuple", "list"):
        assert [r.kind for r in ret.items] == ["array" if kind == "tuple" else "pyscalar"]


def test_check_value_judges_at_the_tolerance_of_the_dtype():
    exp = np.array([1.0, 2.0, 3.0])
    assert judge.check_value(judge.returned(exp + 5e-7 * exp), exp, "out").ok
    v = judge.check_value(judge.returned(exp + 1e-4), exp, "out")
    assert not v.ok and v.short == "out: wrong values" and "3 of 3 entries differ" in v.lines[0]
    f32 = exp.astype(np.float32)
    assert judge.check_value(judge.returned(f32 + np.float32(1e-4)), f32, "out", tol="float32").ok
    slip = judge.check_value(judge.returned(exp), f32, "out", tol="float32")
    assert slip.ok and "expected float32" in slip.slip
    shape = judge.check_value(judge.returned(np.zeros((3, 2))), np.zeros((2, 3)), "dW")
    assert not shape.ok and "transposed" in shape.lines[0]


def test_mask_statistics_and_rng_dependence():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 50))
    fair = rng.random(x.shape) >= 0.3
    assert judge.mask_statistics(fair, x, 0.3) == (True, [])
    ok, lines = judge.mask_statistics(~fair, x, 0.3)          # the dropped entries kept
    assert not ok and "close to p" in lines[-1]
    masks = [rng.random(x.shape) >= 0.3 for _ in range(judge.RNG_DRAWS + 1)]
    assert judge.rng_dependence(masks, x, 0.3) == (True, [])
    ok, lines = judge.rng_dependence([fair] * (judge.RNG_DRAWS + 1), x, 0.3)
    assert not ok and "the mask was the same every time" in lines[0]


def test_which_cases_draw_and_which_draw_again():
    x = np.ones((40, 50))
    assert judge.drop_probability("dropout", {"p": 0.3, "rng": 5}) == 0.3
    for kwargs in ({"p": 0.0, "rng": 5}, {"p": 0.3, "rng": 5, "train": False}, {"p": 0.3}):
        assert judge.drop_probability("dropout", kwargs) is None, kwargs
    assert judge.drop_probability("lora_linear", {"dropout": 0.25, "rng": 7}) == 0.25
    assert judge.drop_probability("softmax", {"rng": 7}) is None
    seeds = judge.redraw_seeds("dropout", (x,), {"p": 0.3, "rng": 5})
    assert len(seeds) == judge.RNG_DRAWS == len(set(seeds)) and 5 not in seeds
    assert judge.redraw_seeds("dropout", (x[:3],), {"p": 0.3, "rng": 5}) == []      # a small case
    assert judge.redraw_seeds("dropout", (x,), {"p": 0.3, "rng": np.random.default_rng(5)}) == []


def test_the_judges_random_ops_are_the_registrys():
    """judge.DRAWS (which check.py reads without the registry) names the random ops and their
    drop probability's keyword as their registrations do."""
    from numpytfmr.registry import registry
    declared = {name: spec.random for name, spec in registry().items() if spec.random}
    assert declared == {op: p_name for op, (_, p_name, _) in judge.DRAWS.items()}
