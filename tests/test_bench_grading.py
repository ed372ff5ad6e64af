"""``numpytfmr bench --grading-class N`` (numpytfmr/run/bench_grading.py): a class built from
the reference's code, a quarter with a planted bug, graded by ``numpytfmr grade``.

No timing is asserted: the class here is tiny, and the checks are that its figures are there
and add up (speed figures come from the benchmark command itself).
"""
import ast
import json
import math
import os

import pytest

from numpytfmr.grading.cases import resolve
from numpytfmr.grading.sandbox import REQUIRE_ENV, bubblewrap_problem
from numpytfmr.run import bench_grading
from numpytfmr.run.cli import main


def _defined(tree):
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


def test_the_reference_homework_is_plain_numpy_and_each_bug_redefines_one_graded_function():
    source = bench_grading.reference_homework()
    tree = ast.parse(source)
    imported = {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.partition(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom)}
    assert imported <= {"numpy", "math"}
    assert not any(n.decorator_list for n in tree.body if isinstance(n, ast.FunctionDef))
    graded = [f for op in bench_grading.OPS for f in resolve(op).functions]
    assert len(graded) == 20 and set(graded) <= set(_defined(tree))
    bugs = [bench_grading.planted_bug(k) for k in range(12)]
    assert len({kind for kind, _ in bugs}) == 12          # the op and the bug vary
    for _, code in bugs:
        redefined = [f for f in _defined(ast.parse(code)) if f in graded]
        assert len(redefined) == 1


@pytest.mark.slow
@pytest.mark.skipif(bool(bubblewrap_problem()) and os.environ.get(REQUIRE_ENV, "") in ("", "0"),
                    reason=f"no bubblewrap sandbox here: {bubblewrap_problem()}")
def test_a_small_class_is_graded_and_its_figures_add_up(tmp_path):
    out = tmp_path / "class.json"
    assert main(["bench", "--grading-class", "4", "--quiet", "--summary", str(out)]) == 0
    f = json.loads(out.read_text())
    g = f["grade_summary"]                      # the grade command's own --summary
    assert (f["submissions"], f["buggy"], f["graded"], f["jobs"]) == (4, 1, 4, 2)
    assert f["isolation"] == ["bubblewrap"] and "--isolation bubblewrap" in f["command"]
    # every correct submission gets the same score, the planted bug less
    low, high = f["correct_scores"]
    assert low == high > 0 and f["buggy_below_correct"] == 1
    # CPU time: the sandboxed processes' (read from /proc) and the grading's, per submission
    assert f["sandbox_cpu_seconds_per_submission"] > 0 and f["grader_cpu_seconds_per_submission"] > 0
    assert math.isclose(f["cpu_seconds_per_submission"], f["cpu_seconds"] / 4, abs_tol=1e-3)
    assert math.isclose(g["cpu_seconds_per_submission"], f["sandbox_cpu_seconds_per_submission"]
                        + f["grader_cpu_seconds_per_submission"], abs_tol=2e-3)
    assert math.isclose(g["cpu_seconds"], f["cpu_seconds"]) and g["run_cpu_seconds"] > 0
    # start-up: at least two processes a submission (visible, hidden cases), inside its wall time
    assert f["processes_per_submission"] >= 2 and f["start_seconds_per_submission"] > 0
    assert f["wall_seconds_per_submission"] > f["start_seconds_per_submission"]
    assert f["wall_seconds"] > 0 and f["run_wall_seconds"] >= f["wall_seconds"]


@pytest.mark.parametrize("argv, flag", [
    (["--jobs", "2"], "--jobs"),                              # without --grading-class
    (["--isolation", "none"], "--isolation"),
    (["--grading-class", "3", "--threads", "2"], "--threads"),   # the step benchmark's flags
    (["--grading-class", "3", "--quick"], "--quick"),
])
def test_flags_that_do_not_apply_are_refused_in_one_line(capsys, argv, flag):
    assert main(["bench"] + argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("numpytfmr bench: error: ") and flag in err[0]
