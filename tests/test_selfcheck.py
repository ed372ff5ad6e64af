"""The students' self-check (numpytfmr/grading/selfcheck.py, shipped as check.py): the folder
``make-assignment`` hands out holds neither the reference nor a hidden case, check.py runs
without numpytfmr, and its verdicts on the visible cases are the grader's.

Submissions: tests/grading_fixtures/selfcheck/ (slips and bugs planted in a solution written
from the skeleton's docstrings), correct.py with planted bugs, and independent/.
"""
import ast
import hashlib
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import COMMAND_TIMEOUT
from numpytfmr.grading import grade, make_assignment
from numpytfmr.grading.cases import make_graded_cases, resolve

FIXTURES = pathlib.Path(__file__).parent / "grading_fixtures"
NAMES = ["relu", "softmax", "dropout", "layernorm", "attention", "lora_linear", "causal_mask"]


@pytest.fixture(scope="module")
def assignment(tmp_path_factory):
    out = tmp_path_factory.mktemp("selfcheck") / "hw"
    paths = make_assignment(NAMES, out, hidden_seed=4242)
    return out, paths


# check.py run as a student would: another directory, isolated mode (no PYTHONPATH, no user
# site), and numpytfmr made unimportable even where it is installed (an import of it fails)
_NO_NUMPYTFMR = ("import runpy, sys; sys.modules['numpytfmr'] = None; sys.argv = sys.argv[1:]; "
                 "runpy.run_path(sys.argv[0], run_name='__main__')")


def _check(paths, submission, tmp_path, *extra):
    """Run check.py where numpytfmr cannot be imported."""
    out = tmp_path / f"{pathlib.Path(submission).stem}.json"
    proc = subprocess.run([sys.executable, "-I", "-c", _NO_NUMPYTFMR, paths["check"], str(submission),
                           "--json", str(out), *extra], cwd=tmp_path, capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def _reference_functions():
    for name in NAMES:
        item = resolve(name)
        yield from ([item.spec.forward, item.spec.backward] if item.kind == "op"
                    else [item.spec.reference])


def _body_lines(fn):
    """The reference body's code lines (no docstring, no comment, no trivial line)."""
    src = inspect.getsource(fn)
    tree = ast.parse(src.lstrip() if src[0] == " " else src)
    node = tree.body[0]
    body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
    out = []
    for stmt in body:
        for line in ast.get_source_segment(src.lstrip() if src[0] == " " else src, stmt).splitlines():
            code = line.split("#")[0].strip()
            if len(code) >= 25:
                out.append(code)
    return out


def test_the_student_folder_holds_no_reference_code_and_no_hidden_case(assignment):
    out, paths = assignment
    student = pathlib.Path(paths["student"])
    assert sorted(p.name for p in student.iterdir()) == ["check.py", "check_data.json", "check_data.npz",
                                                         "homework.ipynb", "homework.py", "judge.py"]
    texts = {p.name: p.read_text(errors="replace") for p in student.iterdir() if p.suffix != ".npz"}
    # no line of a reference body, and nothing of numpytfmr imported
    lines = [line for fn in _reference_functions() for line in _body_lines(fn)]
    assert len(lines) > 20
    for name, text in texts.items():
        flat = "\n".join(t.strip() for t in text.splitlines())
        leaked = [line for line in lines if line in flat]
        assert not leaked, (name, leaked[:3])
    for name in ("check.py", "homework.py", "judge.py"):
        tree = ast.parse(texts[name])
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                     and not n.level}
        # check.py's one import beyond them is its judge, judge.py beside it (``from . import
        # judge`` inside the package)
        sibling = {"judge"} if name == "check.py" else set()
        assert imported <= set(sys.stdlib_module_names) | {"numpy"} | sibling, (name, imported)
        relative = [(n.module, [a.name for a in n.names]) for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.level]
        assert relative == ([(None, ["judge"])] if name == "check.py" else []), (name, relative)
    # the data holds the visible cases only: no hidden label, no hidden input
    data = json.loads(texts["check_data.json"])
    assert not any("hidden" in c["label"] for i in data["items"] for c in i["cases"])
    with np.load(student / "check_data.npz") as z:
        stored = {hashlib.sha256(np.ascontiguousarray(z[k]).tobytes()).hexdigest() for k in z.files}
    config = json.loads((out / "autograder" / "grading.json").read_text())
    def digests(hidden):
        out = set()
        for name in NAMES:
            for gc in make_graded_cases(resolve(name), seed=0, hidden_seed=config["hidden_seed"]):
                for a in list(gc.case.args) + list(gc.case.kwargs.values()):
                    if gc.hidden == hidden and isinstance(a, np.ndarray) and a.size > 4:
                        out.add(hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
        return out
    secret = digests(True) - digests(False)     # a fixed mask both use is no secret
    assert len(secret) > 20 and not secret & stored
    # the skeleton's last line points to the check, not to the grader
    skeleton = texts["homework.py"]
    assert skeleton.rstrip().splitlines()[-1] == "# Check your work on the visible cases:   python check.py homework.py"
    assert "numpytfmr grade" not in skeleton and "python check.py homework.ipynb" in texts["homework.ipynb"]


def _submission(tmp_path, *parts):
    path = tmp_path / f"{pathlib.Path(parts[-1]).stem}.py"
    path.write_text("\n\n".join((FIXTURES / p).read_text() for p in parts))
    return path


BASE = "selfcheck/correct.py"
SUBMISSIONS = [(BASE,), (BASE, "selfcheck/dropout_unscaled.py"),
               (BASE, "selfcheck/dropout_backward_unscaled.py"),
               (BASE, "selfcheck/dropout_dout_in_place.py"), (BASE, "selfcheck/softmax_tuple.py"),
               (BASE, "selfcheck/softmax_in_place.py"), (BASE, "selfcheck/relu_wrong_backward.py"),
               ("selfcheck/not_loading.py",),
               ("correct.py",), ("correct.py", "bugs/attention_no_scale.py"),
               ("correct.py", "bugs/layernorm_unbiased.py"), ("correct.py", "bugs/causal_off_by_one.py"),
               ("correct.py", "bugs/lora_alpha.py"), ("independent/homework.py",),
               ("independent/dropout_binomial.py",), ("independent/lora_other_draw.py",),
               # forward-only bugs whose backward keeps its points, and a trivial pair that must
               # earn nothing (issue #32, item 6)
               ("independent/homework.py", "forward_bugs/attention_scale_dk.py"),
               ("independent/homework.py", "forward_bugs/lora_rank_din.py"),
               ("independent/homework.py", "forward_bugs/dropout_keep_p.py"),
               ("gaming/trivial_pair.py",)]


@pytest.mark.parametrize("parts", SUBMISSIONS, ids=lambda p: "+".join(pathlib.Path(x).stem for x in p))
def test_check_py_gives_the_graders_visible_verdicts(assignment, tmp_path, parts):
    out, paths = assignment
    path = _submission(tmp_path, *parts)
    report = grade(path, config=paths["config"])
    graded = {}
    for t in report.tests:
        if not t.hidden:
            graded[t.function] = graded.get(t.function, True) and t.passed
    proc, verdicts = _check(paths, path, tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    checked = {f: r["passed"] for f, r in verdicts["functions"].items()}
    assert checked == graded, proc.stdout
    assert proc.returncode == (0 if all(checked.values()) else 1)
    # case by case too, under the grader's labels, with the grader's points (a slip's deduction)
    for t in report.tests:
        if not t.hidden:
            case = [c for c in verdicts["functions"][t.function]["cases"] if c["label"] == t.label]
            assert len(case) == 1 and case[0]["passed"] == t.passed, (t.function, t.label, t.output())
            assert round(t.max_score * case[0]["share"], 2) == t.score, (t.function, t.label)
            # a credit is named by both, in the grader's words
            if t.credit:
                assert any(line == f"credited: {t.credit}" for line in case[0]["lines"]), case[0]


def test_check_py_says_what_is_wrong_with_the_students_own_functions(assignment, tmp_path):
    _, paths = assignment
    proc, verdicts = _check(paths, _submission(tmp_path, BASE, "selfcheck/dropout_backward_unscaled.py"),
                            tmp_path)
    assert proc.returncode == 1
    assert "differ from finite differences of your forward" in proc.stdout
    assert "0.7 times the finite differences everywhere" in proc.stdout
    proc, _ = _check(paths, FIXTURES / "correct.py", tmp_path, "--only", "attention")
    assert "PASS" in proc.stdout and "relu" not in proc.stdout
    # a forward bug: the backward is consistent with it, keeps its points, and the check says to
    # fix the forward
    path = _submission(tmp_path, "correct.py", "bugs/attention_no_scale.py")
    proc, verdicts = _check(paths, path, tmp_path, "--only", "attention")
    assert "your backward is consistent with your forward, so the mismatch comes from " \
           "attention_forward" in proc.stdout and "credited: attention_backward" in proc.stdout
    assert verdicts["functions"]["attention_backward"]["passed"]
    assert not verdicts["functions"]["attention_forward"]["passed"]
    # contract slips pass, named
    proc, _ = _check(paths, _submission(tmp_path, BASE, "selfcheck/softmax_tuple.py"), tmp_path)
    assert "PASS, contract slip" in proc.stdout and "returned a tuple of one gradient" in proc.stdout
    proc, _ = _check(paths, _submission(tmp_path, BASE, "selfcheck/dropout_dout_in_place.py"), tmp_path)
    assert "dropout_backward changed dout in place" in proc.stdout


def test_check_py_runs_where_numpytfmr_cannot_be_imported(assignment, tmp_path):
    proc = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.modules['numpytfmr'] = None; "
                           "import numpytfmr"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT)
    assert proc.returncode != 0 and "numpytfmr" in proc.stderr
    _, paths = assignment
    proc, verdicts = _check(paths, _submission(tmp_path, "selfcheck/correct.py"), tmp_path,
                            "--only", "relu", "softmax", "dropout")
    assert proc.returncode == 0 and len(verdicts["functions"]) == 6, proc.stdout


def test_check_py_usage_errors_exit_2(assignment, tmp_path):
    _, paths = assignment
    proc, _ = _check(paths, tmp_path / "missing.py", tmp_path)
    assert proc.returncode == 2 and "missing.py" in proc.stderr and "Traceback" not in proc.stderr
    other = tmp_path / "data"
    other.mkdir()
    proc, _ = _check(paths, FIXTURES / "correct.py", tmp_path, "--data", str(other))
    assert proc.returncode == 2 and "check_data.json" in proc.stderr


def test_a_case_whose_inputs_cannot_be_stored_is_left_to_the_grader_and_said(tmp_path, monkeypatch):
    import numpytfmr.grading.skeleton as sk
    from numpytfmr.registry import Case

    real = sk.make_graded_cases

    def with_a_generator(item, **kw):
        cases = real(item, **kw)
        gc = cases[0]
        odd = type(gc)(gc.index, Case(gc.case.args, dict(gc.case.kwargs, rng=np.random.default_rng(1)),
                                      "a Generator object"), "a Generator object")
        return cases + [odd]
    monkeypatch.setattr(sk, "make_graded_cases", with_a_generator)
    data, arrays = sk.check_data([resolve("dropout")], seed=0)
    assert data["skipped"] == [{"functions": ["dropout_forward", "dropout_backward"],
                                "label": "a Generator object",
                                "why": "a case holds Generator, which the self-check cannot store"}]
    assert "a Generator object" not in [c["label"] for c in data["items"][0]["cases"]]
    paths = sk.make_assignment(["dropout"], tmp_path / "hw", hidden_seed=1)
    proc, verdicts = _check(paths, FIXTURES / "selfcheck" / "correct.py", tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert "judged by the grader only (their inputs cannot be stored here): dropout_forward, " \
           "dropout_backward on case 'a Generator object'" in proc.stdout


# --- hidden-only functions and a time limit per function (issue #32, item 8) -------------------

HANGS = '''

def relu_forward(x):
    while True:          # never returns
        pass


def softmax_backward(dout, cache):
    import time
    while True:
        time.sleep(0.01)
'''


@pytest.fixture(scope="module")
def quick_assignment(tmp_path_factory):
    out = tmp_path_factory.mktemp("selfcheck_hidden") / "hw"
    paths = make_assignment(["relu", "softmax"], out, hidden_seed=4242, timeout=2,
                            hidden={"relu": "all"})
    return paths


def test_a_function_whose_cases_are_all_hidden_does_not_fail_the_check(quick_assignment, tmp_path):
    paths = quick_assignment
    data = json.loads(pathlib.Path(paths["check_data"]).read_text())
    relu = next(i for i in data["items"] if i["name"] == "relu")
    assert relu["cases"] == [] and relu["hidden_cases"] > 0 and data["timeout"] == 2
    proc, verdicts = _check(paths, FIXTURES / "selfcheck" / "correct.py", tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert re.search(r"relu_forward +hidden: graded after the due date", proc.stdout)
    assert "FAIL" not in proc.stdout and "0 of 0" not in proc.stdout
    assert verdicts["functions"]["relu_backward"]["passed"] is None
    assert verdicts["functions"]["softmax_forward"]["passed"] is True
    assert "2 of 2 functions pass every visible case; 2 are graded after the due date only" in proc.stdout


def test_a_function_that_hangs_is_reported_as_a_timeout_and_the_others_still_run(tmp_path):
    paths = make_assignment(["relu", "softmax"], tmp_path / "hw", hidden_seed=1, timeout=1.5)
    path = tmp_path / "homework.py"
    path.write_text((FIXTURES / "selfcheck" / "correct.py").read_text() + HANGS)
    proc, verdicts = _check(paths, path, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    f = verdicts["functions"]
    # the backward hangs on every case: each is a timeout, and its forward is graded on all
    assert f["softmax_forward"]["passed"] and len(f["softmax_forward"]["cases"]) >= 3
    back = f["softmax_backward"]["cases"]
    assert back[0]["short"] == "timed out" and "did not finish within 1.5 s" in back[0]["lines"][0]
    assert all(c["short"] == "not run" for c in back[1:])
    # the forward hangs: its backward cannot run (it needs the cache)
    assert f["relu_forward"]["cases"][0]["short"] == "timed out"
    assert {c["short"] for c in f["relu_backward"]["cases"]} == {"not run"}
    assert "relu_forward on this case did not finish within 1.5 s" in proc.stdout
    # --timeout changes the limit
    proc, _ = _check(paths, path, tmp_path, "--only", "relu", "--timeout", "0.5")
    assert "did not finish within 0.5 s" in proc.stdout
    proc, _ = _check(paths, path, tmp_path, "--timeout", "0")
    assert proc.returncode == 2 and "--timeout" in proc.stderr


@pytest.fixture(scope="module")
def numpy_only_python(tmp_path_factory):
    """A virtual environment that holds NumPy and nothing else: a new venv (without pip), whose
    site-packages reaches one folder with links to this NumPy (and its bundled libraries), so
    no download is needed. Skipped where links or venvs cannot be made."""
    import venv
    base = tmp_path_factory.mktemp("numpy_only")
    where, only = base / "venv", base / "numpy_only"
    try:
        venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(where)
        only.mkdir()
        site = pathlib.Path(np.__file__).resolve().parent.parent
        for name in ("numpy", "numpy.libs"):
            if (site / name).exists():
                (only / name).symlink_to(site / name, target_is_directory=True)
    except (OSError, NotImplementedError) as exc:
        pytest.skip(f"cannot make a NumPy-only virtual environment here: {exc}")
    python = where / ("Scripts" if os.name == "nt" else "bin") / "python"
    lib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60).stdout.strip()
    (pathlib.Path(lib) / "numpy_only.pth").write_text(str(only) + "\n")
    return python


def test_check_py_in_a_numpy_only_virtualenv_with_hidden_functions_and_a_hang(quick_assignment,
                                                                              numpy_only_python,
                                                                              tmp_path):
    paths = quick_assignment
    # NumPy is there; numpytfmr and everything else of the test environment is not
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    probe = subprocess.run([str(numpy_only_python), "-c", "import importlib.metadata as m, numpy; "
                            "print(sorted(d.metadata['Name'].lower() for d in m.distributions()))"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert probe.returncode == 0, probe.stderr
    assert "pytest" not in probe.stdout and "torch" not in probe.stdout
    for module in ("numpytfmr", "pytest"):
        assert subprocess.run([str(numpy_only_python), "-c", f"import {module}"], cwd=tmp_path,
                              capture_output=True, timeout=60, env=env).returncode != 0
    path = tmp_path / "homework.py"
    path.write_text((FIXTURES / "selfcheck" / "correct.py").read_text() + HANGS)
    proc = subprocess.run([str(numpy_only_python), paths["check"], str(path), "--json",
                           str(tmp_path / "v.json")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"relu_forward +hidden: graded after the due date", proc.stdout)
    assert "softmax_backward on this case did not finish within 2 s" in proc.stdout
    verdicts = json.loads((tmp_path / "v.json").read_text())["functions"]
    assert verdicts["softmax_forward"]["passed"] and not verdicts["softmax_backward"]["passed"]
    assert verdicts["relu_forward"]["passed"] is None


def test_where_no_second_python_starts_check_runs_in_its_own_process_and_says_so(quick_assignment,
                                                                                monkeypatch):
    from numpytfmr.grading import selfcheck

    def refuse(job):
        raise OSError("no fork here")
    monkeypatch.setattr(selfcheck, "_start_worker", refuse)
    result = selfcheck.run(str(FIXTURES / "selfcheck" / "correct.py"),
                           pathlib.Path(quick_assignment["check"]).parent)
    assert result["notes"] and "no time limit" in result["notes"][0] and "no fork here" in result["notes"][0]
    assert result["functions"]["softmax_forward"]["passed"] and result["functions"]["relu_forward"]["passed"] is None
    assert selfcheck.table(result).splitlines()[1].startswith("note: no time limit")


# --- the own-forward credit, as the grader gives it (issue #32, items 6 and 7) -----------------

def test_check_py_does_not_credit_a_trivial_pair(assignment, tmp_path):
    """gaming/trivial_pair.py: every forward is out = x + sum(others), every backward its exact
    gradient. check.py says so for each backward and credits none of them."""
    _, paths = assignment
    proc, verdicts = _check(paths, _submission(tmp_path, "gaming/trivial_pair.py"), tmp_path)
    assert proc.returncode == 1
    assert "credited: " not in proc.stdout.replace("not credited: ", "")
    refused = {f for f, r in verdicts["functions"].items() for c in r["cases"]
               if any(line.startswith("not credited: ") for line in c["lines"])}
    assert {"softmax_backward", "layernorm_backward", "attention_backward"} <= refused, refused
    assert "is not recognisably softmax on this case" in proc.stdout
    for f in refused:
        cases = verdicts["functions"][f]["cases"]
        # only what is right by itself passes (dropout's identity case)
        assert sum(c["passed"] for c in cases) <= 1 and not verdicts["functions"][f]["passed"]


def test_check_py_names_a_forward_bug_and_credits_its_backward(assignment, tmp_path):
    _, paths = assignment
    path = _submission(tmp_path, "independent/homework.py", "forward_bugs/dropout_keep_p.py")
    proc, verdicts = _check(paths, path, tmp_path, "--only", "dropout")
    assert verdicts["functions"]["dropout_backward"]["passed"], proc.stdout
    assert not verdicts["functions"]["dropout_forward"]["passed"]
    assert ("credited: dropout_backward is the gradient of your own dropout_forward (checked by "
            "finite differences), and your dropout_forward is dropout with one mistake the grader "
            "names: dropout that scales the kept entries by 3.33333 = 1/p") in proc.stdout


def test_check_py_recognises_the_near_misses_the_grader_recognises(assignment):
    """check.py's recognition (stored variants, a scale, a solved option) against the grader's
    recognised_forward, on outputs of each kind and on unrelated ones."""
    from numpytfmr.grading import selfcheck
    from numpytfmr.grading.cases import input_names
    from numpytfmr.grading.grader import near_miss_candidates, recognised_forward
    from numpytfmr.registry import bind
    _, paths = assignment
    data, arrays = selfcheck._read_data(pathlib.Path(paths["check"]).parent)
    tried = named = 0
    for entry in data["items"]:
        if entry["kind"] != "op" or entry["name"] in ("dropout",):
            continue
        item = resolve(entry["name"])
        visible = [gc for gc in make_graded_cases(item, seed=0, hidden_seed=4242) if not gc.hidden]
        for case, gc in zip(entry["cases"], visible):
            assert case["label"] == gc.label
            names = input_names(item.spec)[:len(gc.case.args)]
            names += [f"input {i}" for i in range(len(names), len(gc.case.args))]
            expected = np.asarray(bind(item.spec.forward, gc.case.kwargs)(*gc.case.args)[0])
            outputs = [-0.5 * expected, expected + 1.0, np.tanh(expected)]
            outputs += [np.asarray(thunk(), dtype=expected.dtype) for _, thunk in
                        near_miss_candidates(item, gc, names)[:40:7]]
            for key, value in gc.case.kwargs.items():
                if isinstance(value, float) and value and key not in ("rng",):
                    outputs.append(np.asarray(bind(item.spec.forward, dict(gc.case.kwargs, **{
                        key: 1.7 * value}))(*gc.case.args)[0]))
            for got in outputs:
                if got.shape != expected.shape or not np.isfinite(got).all():
                    continue
                tried += 1
                theirs = recognised_forward(item, gc, got, expected, names)
                ours = selfcheck.recognised(case, arrays, got, gc.dtype, entry["sentences"])
                assert ours == theirs, (entry["name"], gc.label, theirs, ours)
                named += bool(ours)
    assert tried > 100 and named > 50, (tried, named)


@pytest.mark.parametrize("parts", [("independent/homework.py", "forward_bugs/dropout_keep_p.py"),
                                   ("independent/homework.py", "forward_bugs/lora_rank_din.py"),
                                   ("independent/homework.py",)], ids=lambda p: pathlib.Path(p[-1]).stem)
def test_mask_statistics_cases_made_visible_are_judged_as_the_grader_judges_them(tmp_path, parts):
    """The mask-statistics cases of dropout and LoRA (check=True, more than 1000 input entries:
    checked along random directions) when an instructor makes every case visible."""
    paths = make_assignment(["dropout", "lora_linear"], tmp_path / "hw", hidden_seed=7,
                            hidden={"dropout": "none", "lora_linear": "none"})
    data = json.loads(pathlib.Path(paths["check_data"]).read_text())
    stats = [c for i in data["items"] for c in i["cases"] if "statistics of the mask" in c["label"]]
    assert len(stats) == 2 and all(c["check"] for c in stats)
    path = _submission(tmp_path, *parts)
    report = grade(path, config=paths["config"])
    proc, verdicts = _check(paths, path, tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    for t in report.tests:
        case = [c for c in verdicts["functions"][t.function]["cases"] if c["label"] == t.label]
        assert len(case) == 1 and case[0]["passed"] == t.passed, (t.function, t.label, t.output(), case)
        assert round(t.max_score * case[0]["share"], 2) == t.score


@pytest.mark.parametrize("value", [1.25, np.float64(1.25), np.array(1.25)], ids=["float", "np.float64", "array"])
def test_a_float64_value_for_a_float32_case_is_a_slip_that_costs_the_deduction(value):
    """A Python float, an np.float64 scalar or a float64 array with the right value for a
    float32 case passes, named, less the slip deduction (the grader's rule)."""
    from numpytfmr.grading import selfcheck
    ok, short, lines = selfcheck.check_value(value, np.array(1.25, dtype=np.float32), "out", "float32")
    assert ok and len(lines) == 1 and lines[0].startswith(selfcheck.SLIP)
    if isinstance(value, float) and type(value) is float:
        assert "returned a Python float" in lines[0]
    case = selfcheck._case_result(selfcheck._with_slips("c", ok, short, lines, []), 0.1)
    assert case["passed"] and case["share"] == pytest.approx(0.9)
    assert case["lines"] == [f"slip (costs 10% of this test's points): {lines[0][len(selfcheck.SLIP):]}"]
    wrong = selfcheck.check_value(1.5, np.array(1.25, dtype=np.float32), "out", "float32")
    assert not wrong[0]
