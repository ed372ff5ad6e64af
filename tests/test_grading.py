"""The autograder: ``numpytfmr grade`` and ``numpytfmr make-assignment``.

Submissions used here (tests/grading_fixtures/):
- correct.py: an independent, correct implementation of twelve forward/backward pairs and
  causal_mask; it must score full marks.
- bugs/*.py: one planted bug each, appended to correct.py (a later def replaces the earlier).
- hostile/*.py: submissions that try to hang, exit, exhaust memory, monkeypatch, forge
  results, return look-alike objects or import the reference.
"""
import ast
import inspect
import json
import stat
from pathlib import Path

import numpy as np
import pytest

from conftest import COMMAND_TIMEOUT, GRADING_TIMEOUT, HANG_TIMEOUT
from numpytfmr.run.cli import main
from numpytfmr.grading import grade, make_assignment
from numpytfmr.grading.channel import Returned, decode_value
from numpytfmr.grading.compare import check_value, diagnose_bool
from numpytfmr.grading.contracts import clean_reference_text
from numpytfmr.grading.notebook import SubmissionError, notebook_to_chunks, read_submission
from numpytfmr.grading.skeleton import function_skeleton

FIXTURES = Path(__file__).parent / "grading_fixtures"
CORRECT = FIXTURES / "correct.py"
PAIRS = ("linear", "relu", "gelu", "softmax", "log_softmax", "cross_entropy", "layernorm",
         "rmsnorm", "embedding", "attention", "lora_linear", "dpo_loss")


def _submission(tmp_path, *parts, name="homework.py", replace=None):
    """Write the concatenation of fixture files (correct.py first, then overrides)."""
    text = "\n\n".join((FIXTURES / p).read_text() for p in parts)
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def _tests(report, function):
    return [t for t in report.tests if t.function == function]


def _by_label(report, function, label):
    matches = [t for t in _tests(report, function) if t.label == label]
    assert matches, f"no test {function} [{label}] in {[t.name for t in report.tests]}"
    return matches[0]


# --- a correct submission, and the skeleton -------------------------------------------------

def test_correct_independent_submission_scores_full_marks(tmp_path):
    # how long grading takes is measured by the grade command's --summary, not here
    report = grade(CORRECT, hidden_seed=123, timeout=GRADING_TIMEOUT)
    graded = {t.item for t in report.tests}
    assert set(PAIRS) | {"causal_mask"} <= graded
    failed = [t.output() for t in report.tests if not t.passed]
    assert not failed, "\n\n".join(failed[:5])
    assert report.passed and report.score == report.max_score > 0
    # hidden cases exist and are marked for after the due date
    results = report.gradescope()
    hidden = [t for t in results["tests"] if t["visibility"] == "after_due_date"]
    assert hidden and all("hidden:" in t["name"] for t in hidden)


def test_skeleton_scores_zero_with_not_implemented_everywhere(tmp_path):
    names = ["softmax", "layernorm", "attention", "lora_linear", "dpo_loss", "causal_mask"]
    paths = make_assignment(names, tmp_path / "hw", hidden_seed=11)
    for key, only in (("skeleton", None), ("notebook", ["softmax", "causal_mask"])):
        report = grade(paths[key], config=paths["config"], only=only)
        assert report.score == 0 and report.max_score == pytest.approx(10.0 * len(only or names))
        assert {t.item for t in report.tests} == set(only or names)
        shorts = {t.short for t in report.tests}
        assert shorts == {"not implemented"}, shorts
        assert all(t.lines == [f"not implemented: {t.function} raises NotImplementedError"]
                   for t in report.tests)


def test_make_assignment_writes_skeleton_notebook_config_and_gradescope_pair(tmp_path):
    import numpytfmr

    out = tmp_path / "a1"
    assert main(["make-assignment", "attention", "softmax", "causal_mask", "-o", str(out),
                 "--hidden-seed", "99", "--weight", "attention=20", "--name", "hw1"]) == 0
    source = (out / "student" / "hw1.py").read_text()
    tree = ast.parse(source)
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    assert list(funcs) == ["attention_forward", "attention_backward", "softmax_forward",
                           "softmax_backward", "causal_mask"]
    for name, node in funcs.items():
        ref = getattr(numpytfmr, name)
        # signature kept, a student docstring (the reference's summary first), body replaced
        doc = ast.get_docstring(node)
        assert doc.splitlines()[0] == clean_reference_text(inspect.getdoc(ref)).splitlines()[0]
        assert "Required (graded):" in doc
        assert ast.unparse(node.args) == ast.unparse(ast.parse(inspect.getsource(ref)).body[0].args)
        assert isinstance(node.body[-1], ast.Raise) and "NotImplementedError" in ast.unparse(node.body[-1])
        assert len(node.body) == 2
    assert "1/sqrt(d_k)" in source and "(..., n_q, d_k)" in source   # equations and shapes kept
    assert "np.swapaxes" not in source                               # no solution left

    nb = json.loads((out / "student" / "hw1.ipynb").read_text())
    assert nb["nbformat"] == 4
    try:
        import nbformat
    except ImportError:
        pass
    else:
        nbformat.validate(nbformat.from_dict(nb))
    solution_cells = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution")]
    assert [c["metadata"]["nbgrader"]["grade_id"] for c in solution_cells] == ["attention", "softmax",
                                                                               "causal_mask"]
    config = json.loads((out / "autograder" / "grading.json").read_text())
    assert config["hidden_seed"] == 99 and config["assignment"] == "hw1"
    assert {f["name"]: f["weight"] for f in config["functions"]} == {"attention": 20.0, "softmax": 10.0,
                                                                     "causal_mask": 10.0}
    for script in ("setup.sh", "run_autograder"):
        path = out / "autograder" / script
        assert path.stat().st_mode & stat.S_IXUSR
        assert path.read_text().startswith("#!/usr/bin/env bash")
    run = (out / "autograder" / "run_autograder").read_text()
    assert 'numpytfmr grade "$root/submission"' in run and "results.json" in run
    assert 'root="${NUMPYTFMR_AUTOGRADER_ROOT:-/autograder}"' in run
    assert (out / "autograder" / "numpytfmr" / "grading" / "child.py").is_file()
    # grading a folder with the config finds hw1.py by the assignment's name
    report = grade(out / "student", config=out / "autograder" / "grading.json", only=["causal_mask"])
    assert report.submission.endswith("hw1.py") and report.score == 0


def test_solution_markers_keep_the_scaffolding(tmp_path):
    module = tmp_path / "ref_with_markers.py"
    module.write_text('''
def scaled_sum(x, *, c=2.0):
    """Return c * sum(x)."""
    x = list(x)            # scaffolding kept
    ### BEGIN SOLUTION
    total = c * sum(x)
    ### END SOLUTION
    return total
''')
    import importlib.util
    spec = importlib.util.spec_from_file_location("ref_with_markers", module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = function_skeleton(mod.scaled_sum)
    assert "x = list(x)" in text and "return total" in text
    assert "c * sum(x)" not in text.split('"""')[2]
    assert "raise NotImplementedError" in text
    compile(text, "skeleton", "exec")


# --- planted bugs ---------------------------------------------------------------------------

def _grade_bug(tmp_path, bug, name, cases=None, float32=False):
    path = _submission(tmp_path, "correct.py", f"bugs/{bug}.py")
    config = {"float32_case": float32,
              "functions": [{"name": name, "cases": cases if cases is not None else "all"}]}
    return grade(path, config=config)


def test_softmax_without_max_subtraction_fails_only_on_large_logits(tmp_path):
    report = _grade_bug(tmp_path, "softmax_no_max", "softmax")
    failed = {t.name for t in report.tests if not t.passed}
    assert failed == {"softmax_forward [logits of +-1e4]", "softmax_backward [logits of +-1e4]"}
    out = _by_label(report, "softmax_forward", "logits of +-1e4").output()
    assert "NaN or inf where the expected value is finite" in out
    assert "subtract the maximum" in out and "first mismatch at index (0, 0): got nan" in out


def test_layernorm_with_unbiased_variance_is_named(tmp_path):
    report = _grade_bug(tmp_path, "layernorm_unbiased", "layernorm", cases=[0, 1])
    for t in _tests(report, "layernorm_forward"):
        assert not t.passed
        assert "divided by n - 1 (the unbiased estimate" in t.output()
        assert "max abs error" in t.output() and "first mismatch at index" in t.output()


def test_attention_without_scale_costs_the_forward_only(tmp_path):
    """The forward's bug is the forward's: the backward, right for that forward (checked by finite
    differences of it), keeps its points, and says so."""
    report = _grade_bug(tmp_path, "attention_no_scale", "attention", cases=[0, 10])
    plain = _by_label(report, "attention_forward", "plain (2, 3, 7)")
    assert not plain.passed
    assert "a constant factor" in plain.output() and "1/sqrt(d_k)" in plain.output()
    assert "Q multiplied by sqrt(7)" in plain.output()
    back = _by_label(report, "attention_backward", "plain (2, 3, 7)")
    assert back.passed and back.score == back.max_score
    assert "credited: attention_backward is the gradient of your own attention_forward" in back.output()
    assert "PASSED -- your backward is consistent with your forward" in back.output()
    backward_points = sum(t.score for t in _tests(report, "attention_backward"))
    assert backward_points == pytest.approx(sum(t.max_score for t in _tests(report, "attention_backward")))
    # an explicit scale is honoured by the buggy code, so that case passes
    assert all(t.passed for t in report.tests if t.label.startswith("scale=0.5"))


def test_attention_backward_with_transposed_dK(tmp_path):
    report = _grade_bug(tmp_path, "attention_dk_transposed", "attention", cases=[0, 5])
    assert all(t.passed for t in _tests(report, "attention_forward"))
    plain = _by_label(report, "attention_backward", "plain (2, 3, 7)")
    assert not plain.passed and "dK: shape (2, 7, 3); expected (2, 3, 7)" in plain.output()
    assert "transposed" in plain.output()
    assert "your backward does not match your forward" in plain.output()
    # K (5, 5) is square: the shape is right, and the values are diagnosed as transposed
    square = _by_label(report, "attention_backward", "finite distance bias")
    assert not square.passed and "dK" in square.short
    assert "transposed" in square.output()


def test_causal_mask_off_by_one(tmp_path):
    report = _grade_bug(tmp_path, "causal_off_by_one", "causal_mask")
    assert report.tests and not any(t.passed for t in report.tests)
    for t in report.tests:
        assert "off by one" in t.output() and "along the last axis" in t.output()
    assert "got False, expected True" in report.tests[0].output()


def test_lora_scaled_by_alpha_instead_of_alpha_over_r(tmp_path):
    report = _grade_bug(tmp_path, "lora_alpha", "lora_linear", cases=[0, 3])
    r3 = _by_label(report, "lora_linear_forward", "x (2, 3, 7), r 3, bias")
    assert not r3.passed and "scaled by alpha instead of alpha/r" in r3.output()
    back = _by_label(report, "lora_linear_backward", "x (2, 3, 7), r 3, bias")
    assert back.passed and "your backward is consistent with your forward" in back.output()
    # with r = 1 the bug is invisible
    assert all(t.passed for t in report.tests if t.label.startswith("x (7,), r 1"))


def test_dpo_loss_with_flipped_sign(tmp_path):
    report = _grade_bug(tmp_path, "dpo_sign", "dpo_loss", cases=[0, 2])
    for t in report.tests:       # the backward is right for the flipped forward: only it loses
        assert t.passed == t.function.endswith("_backward")
    fwd = _by_label(report, "dpo_loss_forward", "sigmoid, 6 pairs, beta 0.1").output()
    assert "the sign of the loss is flipped" in fwd
    bwd = _by_label(report, "dpo_loss_backward", "sigmoid, 6 pairs, beta 0.1").output()
    assert "wrong sign" in bwd and "d_policy_chosen" in bwd


def test_wrong_dtype_and_in_place_changes_cost_only_the_slip_deduction(tmp_path):
    report = _grade_bug(tmp_path, "softmax_float64", "softmax", cases=[0], float32=True)
    f32 = _by_label(report, "softmax_forward", "float32: x (2, 3, 7), last axis")
    assert f32.passed and f32.score == pytest.approx(0.9 * f32.max_score, abs=0.006)
    assert "slip (costs 10% of this test's points): out: dtype float64; expected float32" in f32.output()
    assert _by_label(report, "softmax_forward", "x (2, 3, 7), last axis").score == \
        _by_label(report, "softmax_forward", "x (2, 3, 7), last axis").max_score
    report = _grade_bug(tmp_path, "relu_in_place", "relu", cases=[0])
    t = _by_label(report, "relu_forward", "x (2, 3, 7)")
    assert t.passed and t.deduction == 0.1 and "changed its input x in place" in t.output()


def test_a_python_float_for_a_float32_case_costs_exactly_the_slip_deduction(tmp_path):
    """dpo_loss_forward returning float(loss): right values in float64 where float32 belongs,
    the same slip as a float64 array (it cost the whole test, 5.25 of 6, before)."""
    path = _submission(tmp_path, "correct.py", replace={
        "loss = np.asarray(losses.mean(), dtype=policy_chosen.dtype)": "loss = float(losses.mean())"})
    report = grade(path, config={"float32_case": True, "slip_deduction": 0.1,
                                 "functions": [{"name": "dpo_loss", "weight": 15}]})
    assert all(t.passed for t in report.tests), [t.output() for t in report.tests if not t.passed]
    f32 = [t for t in _tests(report, "dpo_loss_forward") if t.label.startswith("float32")]
    assert len(f32) == 1 and f32[0].deduction == 0.1
    assert "returned a Python float (that is float64); expected a value of dtype float32" in f32[0].output()
    got, most = report.function_scores()["dpo_loss_forward"]
    assert most == 6.0 and got == pytest.approx(most - f32[0].max_score + round(0.9 * f32[0].max_score, 2))
    assert [t for t in report.tests if t.deduction] == f32         # nothing else is deducted


# --- the own-forward credit: for real work only ------------------------------------------------

HW1 = {"hidden_seed": 918273, "functions": [{"name": n, "weight": 10} for n in
                                            ("softmax", "layernorm", "attention", "lora_linear", "dropout")]}


def test_a_trivial_forward_with_its_exact_gradient_earns_at_most_a_tenth():
    """gaming/trivial_pair.py computes no op (out = x + sum of the other inputs) with a backward
    that is the exact gradient of that: consistent everywhere, and 27.34 of 50 under a credit
    that did not ask whether the forward is the op. Now only what is right by itself counts
    (dropout's identity cases: train=False, p = 0)."""
    report = grade(FIXTURES / "gaming" / "trivial_pair.py", config=HW1)
    assert report.max_score == 50 and report.score <= 5.0, report.function_scores()
    assert not any(t.credit for t in report.tests)
    refused = [t for t in report.tests if "not credited" in t.output()]
    assert {t.function for t in refused} >= {"softmax_backward", "layernorm_backward",
                                              "attention_backward", "lora_linear_backward"}
    assert all(not t.passed for t in refused)
    assert ("attention_backward agrees with your own attention_forward, but your attention_forward "
            "is not recognisably attention on this case") in refused[0].output() or any(
        "is not recognisably" in t.output() for t in refused)
    hidden = [t for t in refused if t.hidden]
    assert hidden, "hidden backwards are judged by the same rule"


FORWARD_BUGS = [   # (fixture, op, its cases: the last one hidden, a credited case says, the forward's test says)
    ("attention_scale_dk", "attention", [0, 1, 8], "the scores are divided by d_k instead of sqrt(d_k)",
     "divided by d_k instead of sqrt(d_k)"),
    ("lora_rank_din", "lora_linear", [0, 4, 6], "alpha/d_in (d_in = A.shape[0] = 5)", "r/d_in"),
    ("dropout_keep_p", "dropout", [0, 1, 5], "scales the kept entries by 3.33333 = 1/p instead of 1/(1-p)",
     "every kept entry is x * 3.33333"),
]


@pytest.mark.parametrize("bug, op, cases, credit, diagnosis", FORWARD_BUGS, ids=[b[0] for b in FORWARD_BUGS])
def test_a_forward_only_bug_keeps_every_backward_point(tmp_path, bug, op, cases, credit, diagnosis):
    """A student's own forward with one bug (a wrong default attention scale, LoRA's rank, the
    dropout keep probability) and its right backward, in plain NumPy (forward_bugs/, appended
    to independent/homework.py): the forward loses its points, the backward none, hidden
    cases included (LoRA's and dropout's mask statistics cost backward points before)."""
    path = tmp_path / "homework.py"
    path.write_text((FIXTURES / "independent" / "homework.py").read_text() + "\n\n"
                    + (FIXTURES / "forward_bugs" / f"{bug}.py").read_text())
    report = grade(path, config={"hidden_seed": 918273, "functions": [{"name": op, "cases": cases}]})
    assert [t.label.startswith("hidden: ") for t in _tests(report, f"{op}_backward")] == \
        [False, False, False, True]
    (f_got, f_most), (b_got, b_most) = (report.function_scores()[f"{op}_{fn}"]
                                        for fn in ("forward", "backward"))
    assert f_got <= f_most / 2 and b_got == b_most, report.function_scores()
    credited = [t for t in _tests(report, f"{op}_backward") if t.credit]
    assert credited and any(t.hidden for t in credited)
    assert all(f"is {op} with one mistake the grader names" in t.credit for t in credited)
    assert any(credit in t.credit for t in credited), credited[0].credit
    assert any(diagnosis in t.output() for t in _tests(report, f"{op}_forward") if not t.passed)


def test_the_credit_rule_names_a_near_miss_or_most_cases_and_nothing_else():
    from numpytfmr.grading.cases import resolve
    from numpytfmr.grading.grader import own_forward_credit
    item = resolve("softmax")
    assert "one mistake the grader names: a scale" in own_forward_credit(item, "a scale", 0, 5)
    assert "matches the reference on 4 of 5 cases" in own_forward_credit(item, "", 4, 5)
    assert own_forward_credit(item, "", 2, 4) is None and own_forward_credit(item, "", 0, 0) is None


def test_a_near_miss_is_recognised_and_an_unrelated_forward_is_not():
    from numpytfmr.grading.cases import make_graded_cases, resolve
    from numpytfmr.grading.grader import recognised_forward
    from numpytfmr.registry import bind
    item = resolve("attention")
    gc = make_graded_cases(item, seed=0, float32_case=False)[0]          # plain (2, 3, 7)
    Q, K, V = gc.case.args
    names = ["Q", "K", "V"]
    expected = bind(item.spec.forward, gc.case.kwargs)(Q, K, V)[0]
    scaled_dk = bind(item.spec.forward, dict(gc.case.kwargs, scale=1 / 7))(Q, K, V)[0]
    assert "divided by d_k instead of sqrt(d_k)" in recognised_forward(item, gc, scaled_dk, expected, names)
    assert "times -2" in recognised_forward(item, gc, -2 * expected, expected, names)
    for unrelated in (Q + K.sum() + V.sum(), Q, Q + K + V, np.tanh(Q) @ np.swapaxes(K, -1, -2) @ V):
        assert recognised_forward(item, gc, unrelated, expected, names) == ""


# --- no hidden verdict reaches the student before the due date -----------------------------------

def _student_view(report):
    """What Gradescope shows a student before the due date: the top output and the visible tests."""
    import re
    results = report.gradescope()
    output = re.sub(r"in \d+\.\d\d s", "in (seconds) s", results["output"])   # timing noise
    return output, [(t["name"], t["score"], t["max_score"], t["status"], t["output"])
                    for t in results["tests"] if t["visibility"] == "visible"]


def test_no_hidden_verdict_reaches_what_a_student_sees_before_the_due_date(tmp_path, monkeypatch):
    """hostile/hidden_probe.py ends its process on the grader's follow-up of a failed case (a
    second call on one input) and, with a flag, on a hidden input (a predicate of it: 4-d Q);
    another flag makes its backward wrong on the hidden cases. A failing hidden backward used to get its follow-up in
    the hidden phase's process, so the always-visible line said "3 processes started" instead
    of 2. Now every combination shows the student the same thing."""
    config = {"float32_case": False, "hidden_seed": 4242,
              "functions": [{"name": "attention", "cases": [0, 8, 9], "hidden": [8, 9]}]}
    from numpytfmr.grading import grader as grading
    views, reports, requests = {}, {}, {}
    real_request = grading._ItemGrader.request

    def logged(self, op, fn, *args, **kwargs):      # (process, request) in the order sent
        answer = real_request(self, op, fn, *args, **kwargs)
        sessions = log.setdefault("sessions", [])
        if self.session not in sessions:
            sessions.append(self.session)
        log.setdefault("sent", []).append((sessions.index(self.session), op, fn))
        return answer
    monkeypatch.setattr(grading._ItemGrader, "request", logged)
    for wrong, leave in ((False, False), (True, False), (False, True)):
        log = requests[wrong, leave] = {}
        folder = tmp_path / f"{wrong}-{leave}"
        folder.mkdir()
        path = _submission(folder, "correct.py", "hostile/hidden_probe.py", replace={
            "WRONG_ON_HIDDEN = False": f"WRONG_ON_HIDDEN = {wrong}",
            "EXIT_ON_HIDDEN_INPUT = False": f"EXIT_ON_HIDDEN_INPUT = {leave}"})
        reports[wrong, leave] = report = grade(path, config=config)
        views[wrong, leave] = _student_view(report)
    hidden_backward = {k: [t.passed for t in r.tests if t.hidden and t.function == "attention_backward"]
                       for k, r in reports.items()}
    assert hidden_backward[False, False] == [True, True]        # the hidden verdicts differ...
    assert hidden_backward[True, False] == [False, False]
    assert not any(t.passed for t in reports[False, True].tests if t.hidden)
    assert "could not finish" in _tests(reports[True, False], "attention_backward")[-1].output()
    assert all(t.passed for r in reports.values() for t in r.tests if not t.hidden)
    first = views[False, False]                                 # ...what the student sees does not
    assert all(view == first for view in views.values()), [v[0] for v in views.values()]
    assert "1 process started" in first[0] and "for loading and the visible tests" in first[0]
    assert reports[True, False].processes > reports[False, False].processes   # (the full report's)
    # the hidden phase's process (the second) gets the same requests whether its cases pass or
    # fail; the follow-up of the failures goes to a third one
    sent = {k: [(op, fn) for p, op, fn in log["sent"] if p == 1] for k, log in requests.items()}
    assert sent[False, False] == sent[True, False] and len(sent[False, False]) == 4
    assert any(p >= 2 and op in ("call", "sweep") for p, op, fn in requests[True, False]["sent"])
    assert not any(p >= 2 for p, op, fn in requests[False, False]["sent"])


# --- feedback that explains every point -------------------------------------------------------

def test_feedback_names_every_deduction_and_credit_in_results_json_and_the_report(tmp_path):
    import re
    path = _submission(tmp_path, "correct.py", "bugs/softmax_float64.py", "bugs/attention_no_scale.py")
    report = grade(path, config={"slip_deduction": 0.25,
                                 "functions": [{"name": "softmax", "cases": [0]},
                                               {"name": "attention", "cases": [0, 10]}]})
    slipped = [t for t in report.tests if t.deduction]
    credited = [t for t in report.tests if t.credit]
    assert slipped and credited
    for per_case in (False, True):
        tests = report.gradescope(per_case=per_case)["tests"]
        text = "\n".join(t["output"] for t in tests)
        for line in text.splitlines():       # no bare "PASS ... (0.72/0.80)"
            m = re.match(r"\s*PASS\s.*\((\d+\.\d\d)/(\d+\.\d\d)\)(.*)$", line)
            if m and m.group(1) != m.group(2):
                assert "for a contract slip: " in m.group(3), line
        for t in slipped:
            lost = round(t.max_score - t.score, 2)
            assert "dtype float64; expected float32" in t.slips[0]
            assert f"-{lost:.2f} points (25% of {t.max_score:.2f}) for a contract slip: {t.slips[0]}" in text
        assert ("credited: attention_backward is the gradient of your own attention_forward (checked "
                "by finite differences), and your attention_forward is attention with one mistake "
                "the grader names: ") in text
        assert "the 1/sqrt(d_k) scaling is missing" in text
    function_tests = {t["name"]: t["output"] for t in report.gradescope()["tests"]}
    for t in credited:                       # on the case's own line, not only in the details
        assert any(line.strip().startswith(f"PASS  {t.label}  (") and "credited: " in line
                   for line in function_tests[t.function].splitlines())
    table = report.table()
    assert "details of the failures, deductions and credits:" in table
    assert all(f"credited: {t.credit}" in table for t in credited)
    assert "for a contract slip: out: dtype float64" in table


SLIPS = {   # student-style code with one contract slip each, and the function it costs
    "softmax_forward": ('''
def softmax_forward(x, axis=-1):
    x -= x.max(axis=axis, keepdims=True)          # shifts the caller's array
    e = np.exp(x)
    y = e / e.sum(axis=axis, keepdims=True)
    return y, {"y": y, "axis": axis}
''', "changed its input x in place"),
    "relu_backward": ('''
def relu_backward(dout, cache):
    return (dout * (cache["x"] > 0),)               # a 1-tuple for a single input
''', "returned a tuple of one gradient"),
    "dropout_backward": ('''
def dropout_backward(dout, cache):
    dx = dout                                       # CS231n's idiom: writes into dout
    dx[~cache["keep"]] = 0
    dx /= cache["scale"]
    return dx
''', "changed dout in place"),
}


def test_each_contract_slip_costs_only_the_deduction_the_instructor_sets(tmp_path):
    source = CORRECT.read_text() + '''

def relu_forward(x):
    return np.maximum(x, 0), {"x": x}


def dropout_forward(x, *, p=0.5, train=True, rng=None):
    if not train or p == 0:
        return x.copy(), {"keep": np.ones(x.shape, bool), "scale": 1.0}
    keep = rng.random(x.shape) >= p
    return np.where(keep, x / (1 - p), 0).astype(x.dtype), {"keep": keep, "scale": 1 - p}
''' + "".join(code for code, _ in SLIPS.values())
    path = tmp_path / "homework.py"
    path.write_text(source)
    for deduction in (0.1, 0.25):
        config = {"float32_case": False, "slip_deduction": deduction,
                  "functions": [{"name": n, "cases": "all"} for n in ("softmax", "relu", "dropout")]}
        report = grade(path, config=config)
        for fn, (_, words) in SLIPS.items():
            tests = [t for t in report.tests if t.function == fn]
            slipped = [t for t in tests if t.deduction]
            assert slipped and all(t.passed for t in tests), [t.output() for t in tests][:2]
            assert all(t.deduction == deduction and words in t.output() for t in slipped)
            got = sum(t.score for t in tests)
            most = sum(t.max_score for t in tests)
            assert most * (1 - deduction) - 0.05 <= got < most, (fn, got, most)


def test_a_dropout_mask_that_ignores_rng_fails(tmp_path):
    path = tmp_path / "homework.py"
    path.write_text(CORRECT.read_text() + '''

def dropout_forward(x, *, p=0.5, train=True, rng=None):
    if not train or p == 0:
        return x.copy(), {"mask": np.ones(x.shape)}
    keep = np.random.default_rng(1234).random(x.shape) >= p     # a fixed mask: rng unused
    mask = keep / (1 - p)
    return (x * mask).astype(x.dtype), {"mask": mask.astype(x.dtype)}


def dropout_backward(dout, cache):
    return dout * cache["mask"]
''')
    report = grade(path, only=["dropout"], config={"float32_case": False})
    stats = [t for t in report.tests if t.function == "dropout_forward" and "statistics" in t.label]
    assert stats and not any(t.passed for t in stats)
    assert "mask ignores rng" in stats[0].output() and "the same every time" in stats[0].output()
    honest = tmp_path / "honest.py"
    honest.write_text(CORRECT.read_text() + '''

def dropout_forward(x, *, p=0.5, train=True, rng=None):
    if not train or p == 0:
        return x.copy(), {"mask": np.ones(x.shape, x.dtype)}
    mask = (rng.random(x.shape) < 1 - p) / (1 - p)
    return (x * mask).astype(x.dtype), {"mask": mask.astype(x.dtype)}


def dropout_backward(dout, cache):
    return dout * cache["mask"]
''')
    report = grade(honest, only=["dropout"], config={"float32_case": False})
    assert all(t.passed for t in report.tests), [t.output() for t in report.tests if not t.passed][:1]


def test_a_numerical_backward_is_flagged_for_review_not_zeroed(tmp_path):
    path = tmp_path / "homework.py"
    path.write_text(CORRECT.read_text() + '''

def softmax_forward(x, *, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    y = e / e.sum(axis=axis, keepdims=True)
    return y, {"x": x, "axis": axis}


def softmax_backward(dout, cache):          # no gradient code: central differences of the forward
    x, axis = cache["x"], cache["axis"]
    dx = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = 1e-6
        plus, _ = softmax_forward(x + e, axis=axis)
        minus, _ = softmax_forward(x - e, axis=axis)
        dx[i] = np.sum(dout * (plus - minus)) / 2e-6
    return dx
''')
    report = grade(path, only=["softmax"], config={"float32_case": False})
    backward = [t for t in report.tests if t.function == "softmax_backward"]
    assert backward and all(t.passed for t in backward)
    assert any("softmax_backward called a forward function" in r for r in report.review)
    assert "for the instructor's review" in report.table()
    assert report.gradescope()["extra_data"]["review"] == report.review
    honest = grade(CORRECT, only=["softmax"], config={"float32_case": False})
    assert honest.review == []


def test_backward_wrong_by_a_factor_is_checked_against_the_submissions_forward(tmp_path):
    path = tmp_path / "factor.py"
    path.write_text(CORRECT.read_text() + '''

_ok_attention_backward = attention_backward


def attention_backward(dout, cache):
    dQ, dK, dV = _ok_attention_backward(dout, cache)
    return 2 * dQ, dK, dV
''')
    report = grade(path, config={"float32_case": False,
                                 "functions": [{"name": "attention", "cases": [1]}]})
    out = _by_label(report, "attention_backward", "causal mask").output()
    assert "yours = 2 x expected" in out
    assert "FAILED -- your backward does not match your forward" in out
    # finite differences of the submission's forward: dQ off by 2, dK and dV right
    assert "Q: analytic = 2 x numeric" in out
    lines = {line.split()[0]: line for line in out.splitlines()
             if line.strip().startswith(("K ", "V ")) and "(2, 4, 5)" in line}
    assert lines and all(line.rstrip().endswith("PASS") for line in lines.values())


# --- hostile submissions ---------------------------------------------------------------------

@pytest.fixture
def starts(monkeypatch):
    """The submission processes a grade() call starts, counted: the count, not the clock,
    shows that a hang is waited out once and not once per case."""
    from numpytfmr.grading import grader
    started = []
    real = grader.Submission

    def counted(*args, **kwargs):
        started.append(kwargs.get("timeout"))
        return real(*args, **kwargs)
    monkeypatch.setattr(grader, "Submission", counted)
    return started


def _hostile(tmp_path, name, only, timeout=GRADING_TIMEOUT, standalone=False, **kw):
    parts = (f"hostile/{name}.py",) if standalone else ("correct.py", f"hostile/{name}.py")
    path = _submission(tmp_path, *parts, **kw)
    return grade(path, only=only, timeout=timeout,
                 config={"float32_case": False})


@pytest.mark.parametrize("name, message", [
    ("loop_at_import", f"did not finish loading within {HANG_TIMEOUT:g} s"),
    ("exit_at_import", "exited with status 0"),
    ("sys_exit_at_import", "raised SystemExit: 0"),
    ("import_reference", "import of 'numpytfmr' is not allowed in a graded submission"),
])
def test_hostile_at_load_time_fails_every_test_with_a_clear_message(tmp_path, starts, name,
                                                                     message):
    timeout = HANG_TIMEOUT if name.startswith("loop") else GRADING_TIMEOUT
    report = _hostile(tmp_path, name, ["softmax"], timeout=timeout, standalone=True)
    assert len(starts) == 1                    # loaded once, not once per test
    assert report.tests and not any(t.passed for t in report.tests)
    assert message in report.load_error
    assert all(message in t.output() for t in report.tests)


def test_infinite_loop_in_a_function_times_out_and_the_rest_is_graded(tmp_path, starts):
    report = _hostile(tmp_path, "loop_in_function", ["relu", "softmax"], timeout=HANG_TIMEOUT)
    assert len(starts) == 2                    # the first process hangs once; one more for the rest
    relu = _tests(report, "relu_forward")
    assert f"timed out: relu_forward did not finish within {HANG_TIMEOUT:g} s" in relu[0].output()
    assert all("not run" in t.output() for t in relu[1:])
    assert all(t.passed for t in report.tests if t.item == "softmax")


def test_sys_exit_and_os_exit_inside_functions(tmp_path):
    report = _hostile(tmp_path, "exits_in_functions", ["softmax", "relu", "log_softmax"])
    fwd = _tests(report, "softmax_forward")
    assert fwd and all("raised SystemExit: 0" in t.output() for t in fwd)
    relu = _tests(report, "relu_forward")
    assert "exited with status 0" in relu[0].output()
    assert not any(t.passed for t in relu)
    assert all(t.passed for t in report.tests if t.item == "log_softmax")


def test_huge_allocations_fail_with_a_memory_message(tmp_path):
    report = _hostile(tmp_path, "huge_allocation", ["softmax", "relu", "linear"])
    for fn in ("softmax_forward", "relu_forward"):
        t = _tests(report, fn)[0]
        assert not t.passed and "ran out of memory" in t.output() and "MemoryError" in t.output()
    assert all(t.passed for t in report.tests if t.item == "linear")


def test_base_exceptions_are_caught(tmp_path):
    report = _hostile(tmp_path, "base_exception", ["softmax", "relu", "gelu"])
    assert "raised Escape: caught by nobody" in _tests(report, "softmax_forward")[0].output()
    assert "raised KeyboardInterrupt" in _tests(report, "relu_forward")[0].output()
    assert all(t.passed for t in report.tests if t.item == "gelu")


def test_monkeypatching_numpy_and_builtins_does_not_help(tmp_path):
    report = _hostile(tmp_path, "monkeypatch", ["softmax", "relu", "layernorm"])
    fwd = _by_label(report, "softmax_forward", "x (2, 3, 7), last axis")
    assert not fwd.passed and "42 of 42 entries differ" in fwd.output()
    assert all(t.passed for t in report.tests if t.item in ("relu", "layernorm"))


def test_forged_results_json_is_replaced(tmp_path):
    target = tmp_path / "results" / "results.json"
    target.parent.mkdir()
    path = _submission(tmp_path, "correct.py", "hostile/forge_results.py",
                       replace={"FORGED_PATH": str(target)})
    assert main(["grade", str(path), "--only", "relu", "--json", str(target), "--brief"]) == 1
    results = json.loads(target.read_text())
    assert results["score"] == 0 and results["max_score"] == pytest.approx(10.0)
    assert all(t["status"] == "failed" and "FORGED" not in t["output"] for t in results["tests"])
    assert {t["name"].split(" ")[0] for t in results["tests"]} == {"relu_forward", "relu_backward"}


def test_lookalike_results_are_refused(tmp_path):
    report = _hostile(tmp_path, "bad_returns", ["softmax", "relu", "log_softmax", "linear", "gelu"])
    expect = {
        "softmax_forward": "returned an object of type AlwaysEqual; expected np.ndarray",
        "relu_forward": "SneakyArray (a subclass of np.ndarray); expected a plain np.ndarray",
        "log_softmax_forward": "returned a list; expected an np.ndarray of shape",
        "linear_forward": "returned np.matrix; expected np.ndarray",
        "gelu_forward": "returned an array of dtype object",
    }
    for fn, message in expect.items():
        tests = _tests(report, fn)
        assert tests and all(not t.passed and message in t.output() for t in tests), fn


def test_imports_of_the_reference_or_torch_inside_functions(tmp_path):
    report = _hostile(tmp_path, "import_inside", ["softmax", "relu", "rmsnorm"])
    assert "import of 'numpytfmr' is not allowed" in _tests(report, "softmax_forward")[0].output()
    assert "import of 'torch' is not allowed" in _tests(report, "relu_forward")[0].output()
    assert all(not t.passed for t in report.tests if t.item in ("softmax", "relu"))
    assert all(t.passed for t in report.tests if t.item == "rmsnorm")


def test_garbage_on_the_answer_channel_is_a_failure(tmp_path):
    report = _hostile(tmp_path, "channel_garbage", ["relu", "softmax"])
    relu = _tests(report, "relu_forward")
    assert not any(t.passed for t in relu)
    assert "malformed" in relu[0].output()
    assert all(t.passed for t in report.tests if t.item == "softmax")


# --- pieces ------------------------------------------------------------------------------------

def test_parent_revalidates_what_the_child_claims():
    arrays = {"r": np.zeros((2, 3)), "s": np.zeros((2,))}
    assert decode_value({"kind": "array", "key": "missing"}, arrays).kind == "refused"
    assert decode_value({"kind": "scalar", "key": "s"}, arrays).kind == "refused"   # not 0-d
    assert decode_value({"kind": "pickle", "key": "r"}, arrays).kind == "refused"
    assert decode_value(["not", "a", "dict"], arrays).kind == "refused"
    ok = decode_value({"kind": "tuple", "items": [{"kind": "array", "key": "r"}, {"kind": "none"}]}, arrays)
    assert ok.kind == "tuple" and ok.items[0].array.shape == (2, 3) and ok.items[1].kind == "none"
    # a verdict is computed here: a wrong value fails however it is described
    v = check_value(Returned("array", array=np.ones((2, 3))), np.zeros((2, 3)), "out")
    assert not v.ok and "6 of 6 entries differ" in v.lines[0]


def test_bool_diagnoses():
    expected = np.tril(np.ones((4, 4), bool))
    assert "logical NOT" in diagnose_bool(~expected, expected)[0]
    assert any("off by one" in s for s in diagnose_bool(np.tril(np.ones((4, 4), bool), -1), expected))


def test_notebook_cells_magics_and_failing_cells(tmp_path):
    nb = {"nbformat": 4, "cells": [
        {"cell_type": "markdown", "source": ["# homework"]},
        {"cell_type": "code",
         "source": ["!pip install numpy\n", "%matplotlib inline\n", "import numpy as np\n"]},
        {"cell_type": "code", "source": "%%bash\necho hi\n"},
        {"cell_type": "code", "source": "files = !ls\nfor i in range(2):\n    !echo $i\n"},
        {"cell_type": "code", "source": "print(undefined_name)\n"},
        {"cell_type": "code", "source": CORRECT.read_text()},
    ]}
    chunks = notebook_to_chunks(json.dumps(nb), "hw.ipynb")
    assert [c["filename"] for c in chunks] == ["hw.ipynb [cell 2]", "hw.ipynb [cell 4]",
                                               "hw.ipynb [cell 5]", "hw.ipynb [cell 6]"]
    assert "!pip" not in chunks[0]["source"] and "import numpy as np" in chunks[0]["source"]
    compile(chunks[1]["source"], "cell", "exec")     # the shell line in the loop became `pass`
    path = tmp_path / "hw.ipynb"
    path.write_text(json.dumps(nb))
    report = grade(path, only=["softmax"])
    assert report.passed
    assert any("hw.ipynb [cell 5] raised NameError" in w for w in report.warnings)
    with pytest.raises(SubmissionError, match="not a valid notebook"):
        notebook_to_chunks("{", "x.ipynb")
    with pytest.raises(SubmissionError, match="expected a .py file"):
        (tmp_path / "hw.txt").write_text("x = 1")
        read_submission(tmp_path / "hw.txt")


def test_cli_exit_status_and_unknown_names(tmp_path, capsys):
    assert main(["grade", str(CORRECT), "--only", "relu", "--brief"]) == 0
    out = capsys.readouterr().out
    assert "relu_forward" in out and "score 10 / 10" in out
    path = _submission(tmp_path, "correct.py", "bugs/causal_off_by_one.py")
    assert main(["grade", str(path), "--only", "causal_mask"]) == 1
    assert main(["grade", str(CORRECT), "--only", "no_such_op"]) == 2
    assert "unknown function 'no_such_op'" in capsys.readouterr().err
    missing = tmp_path / "results.json"
    # a path that does not exist is a usage error (2); an empty submission folder is graded 0
    assert main(["grade", str(tmp_path / "nothing.py"), "--only", "relu", "--json", str(missing)]) == 2
    assert "nothing.py' does not exist" in capsys.readouterr().err and not missing.exists()
    (tmp_path / "empty").mkdir()
    assert main(["grade", str(tmp_path / "empty"), "--only", "relu", "--json", str(missing)]) == 1
    results = json.loads(missing.read_text())
    assert results["score"] == 0 and "could not be read" in results["tests"][0]["output"]
    assert results["max_score"] == 10


def test_missing_functions_fail_only_their_own_tests(tmp_path):
    path = tmp_path / "partial.py"
    path.write_text("import numpy as np\n\n\ndef relu_forward(x):\n"
                    "    return np.maximum(x, 0), {'pos': x > 0}\n")
    report = grade(path, only=["relu", "softmax"], config={"float32_case": False})
    assert all(t.passed for t in _tests(report, "relu_forward"))
    for fn in ("relu_backward", "softmax_forward", "softmax_backward"):
        tests = _tests(report, fn)
        assert tests and all(t.short == "not defined" and not t.passed for t in tests)
        assert f"{fn} is not defined in the submission" in tests[0].output()
    # without --only, only what the submission defines is graded
    assert {t.item for t in grade(path).tests} == {"relu"}


def test_gradescope_run_autograder_end_to_end(tmp_path):
    import shutil
    import subprocess

    paths = make_assignment(["relu", "causal_mask"], tmp_path / "hw", hidden_seed=5)
    root = tmp_path / "gs"
    shutil.copytree(tmp_path / "hw" / "autograder", root / "source")
    (root / "submission").mkdir()
    shutil.copy(_submission(tmp_path, "correct.py", "bugs/causal_off_by_one.py"),
                root / "submission" / "homework.py")
    run = root / "source" / "run_autograder"
    run.write_text(run.read_text().replace("/autograder", str(root)))
    (root / "results").mkdir()
    (root / "results" / "results.json").write_text('{"score": 1000}')   # left over: removed first
    proc = subprocess.run(["bash", str(run)], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["max_score"] == pytest.approx(20.0) and results["score"] == pytest.approx(10.0)
    status = {t["name"]: t["status"] for t in results["tests"]}
    assert all(s == "passed" for n, s in status.items() if n.startswith("relu"))
    assert all(s == "failed" for n, s in status.items() if n.startswith("causal_mask"))
    assert {t["visibility"] for t in results["tests"]} == {"visible", "after_due_date"}
    assert set(results["tests"][0]) == {"name", "number", "score", "max_score", "status", "output",
                                        "visibility"}
    assert paths["config"].endswith("grading.json")


# --- fair isolation, load failures, exact points (issue #16) ----------------------------------

def test_a_hanging_or_crashing_backward_costs_only_the_backwards_tests(tmp_path, starts):
    report = _hostile(tmp_path, "fail_in_backward", ["softmax", "layernorm", "relu"],
                      timeout=HANG_TIMEOUT)
    assert len(starts) == 5       # the first process, one after the hang, one after each crash
    for fwd in ("softmax_forward", "layernorm_forward"):
        tests = _tests(report, fwd)
        assert len(tests) > 3 and all(t.passed for t in tests), [t.output() for t in tests if not t.passed]
    hang = _tests(report, "softmax_backward")
    assert f"timed out: softmax_backward did not finish within {HANG_TIMEOUT:g} s" in hang[0].output()
    assert all(not t.passed and "softmax_backward timed out on case" in t.output() for t in hang[1:])
    crash = _tests(report, "layernorm_backward")
    assert not any(t.passed for t in crash)
    assert "exited with status 1" in crash[0].output()
    assert any("ended 3 times while layernorm_backward ran" in t.output() for t in crash)
    assert all(t.passed for t in report.tests if t.item == "relu")
    # the points: the forwards' share of softmax and layernorm, and all of relu
    fwd_points = sum(t.max_score for t in report.tests if t.function in ("softmax_forward",
                                                                          "layernorm_forward"))
    assert report.score == pytest.approx(fwd_points + 10.0)


@pytest.mark.parametrize("source, message", [
    ("hostile/loop_at_import.py", f"did not finish loading within {HANG_TIMEOUT:g} s"),
    ("hostile/import_reference.py", "import of 'numpytfmr' is not allowed"),
    ("syntax", "raised SyntaxError"),
])
def test_a_submission_that_does_not_load_shows_every_test_at_zero_of_its_points(tmp_path, source,
                                                                                 message):
    path = tmp_path / "homework.py"
    if source == "syntax":
        path.write_text("import numpy as np\n\ndef softmax_forward(x, *, axis=-1):\n    return x +\n\n"
                        "def softmax_backward(dout, cache):\n    return dout\n")
    else:
        path.write_text((FIXTURES / source).read_text())
    timeout = HANG_TIMEOUT if "loop" in source else GRADING_TIMEOUT
    report = grade(path, timeout=timeout)        # no config and no --only: names from the source
    assert {t.item for t in report.tests} == {"softmax"}
    assert report.score == 0 and report.max_score == 10
    assert all(t.max_score > 0 and not t.passed and message in t.output() for t in report.tests)
    results = report.gradescope()
    assert results["score"] == 0 and results["max_score"] == 10
    assert message in results["output"]


def test_points_are_exact_multiples_of_a_hundredth_that_sum_to_the_weights(tmp_path):
    from decimal import Decimal
    from numpytfmr.grading.grader import split_points

    assert split_points(10, [1, 1, 1]) == [3.34, 3.33, 3.33]
    # 1 point over 7 cases: exact shares 0.0571 and 0.0857; the 9 hundredths left after rounding
    # down go to the largest remainders (every forward), then to the earliest backwards
    assert split_points(1, [0.4, 0.6] * 7) == [0.06, 0.09, 0.06, 0.09] + [0.06, 0.08] * 5
    assert sum(map(Decimal, map(str, split_points(1, [0.4, 0.6] * 7)))) == 1
    for weight in (10, 7, 33.33, 0.5, 100):
        for n in (1, 3, 7, 13, 29):
            parts = split_points(weight, [0.4, 0.6] * n)
            assert sum(Decimal(str(p)) for p in parts) == Decimal(str(weight))
            assert all(Decimal(str(p)) * 100 == int(Decimal(str(p)) * 100) for p in parts)
    paths = make_assignment(["softmax", "layernorm", "causal_mask", "attention"], tmp_path / "hw",
                            hidden_seed=3, weights={"softmax": 7, "layernorm": 33.33,
                                                    "causal_mask": 0.5, "attention": 59.17})
    report = grade(paths["skeleton"], config=paths["config"])
    results = report.gradescope()
    assert results["max_score"] == 100
    assert sum(Decimal(str(t["max_score"])) for t in results["tests"]) == Decimal(100)
    by_item = {}
    for t in report.tests:
        by_item[t.item] = by_item.get(t.item, Decimal(0)) + Decimal(str(t.max_score))
    assert by_item == {"softmax": 7, "layernorm": Decimal("33.33"), "causal_mask": Decimal("0.5"),
                       "attention": Decimal("59.17")}


def test_grade_usage_errors_exit_2_with_one_line_naming_the_file_or_flag(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"seed": 1,')
    cases = [
        (["grade", "/nonexistent.py"], "'/nonexistent.py' does not exist"),
        (["grade", str(CORRECT), "--config", "/nonexistent.json"], "--config '/nonexistent.json' does not exist"),
        (["grade", str(CORRECT), "--config", str(bad)], "is not valid JSON (Expecting property name"),
        (["grade", str(CORRECT), "--config", str(tmp_path)], "is a directory"),
        (["grade", str(CORRECT), "--seed", "-1"], "--seed is -1; expected an integer >= 0"),
        (["grade", str(CORRECT), "--timeout", "0"], "--timeout is 0; expected a finite number > 0"),
        (["grade", str(CORRECT), "--memory-mb", "100"], "--memory-mb is 100; expected an integer >= 256"),
        (["grade", str(CORRECT), "--only", "nope"], "--only: unknown function 'nope'"),
        (["grade", str(CORRECT), "--jobs", "2"], "--jobs applies to a whole class"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("numpytfmr grade: error: ") and message in err, (argv, err)
        assert err.count("\n") == 1 and "Traceback" not in err


def test_independent_gates_and_rewards_submission_scores_full_marks():
    # written from a generated skeleton's docstrings only, not from the reference's source
    path = FIXTURES / "independent" / "gates_and_rewards.py"
    report = grade(path, hidden_seed=77)
    assert {t.item for t in report.tests} == {"silu", "ffn", "bradley_terry_loss", "reward_head",
                                              "sequence_logprobs", "gru_cell"}
    failed = [t.output() for t in report.tests if not t.passed]
    assert not failed, "\n\n".join(failed[:3])
    assert report.score == report.max_score == 60


# --- hidden cases and weights the instructor sets (grading.json, make-assignment) ---------------

def test_the_instructor_chooses_which_cases_are_hidden_and_they_are_other_cases():
    from numpytfmr.grading.cases import make_graded_cases, resolve

    def split(hidden):
        cases = make_graded_cases(resolve("softmax", hidden=hidden), seed=0, hidden_seed=9,
                                  float32_case=False)
        return ([c.index for c in cases if not c.hidden], [c.index for c in cases if c.hidden])

    visible, hidden = split("auto")          # the last third: other shapes and edge cases
    assert hidden and visible and not set(hidden) & set(visible)
    assert sorted(visible + hidden) == list(range(len(visible) + len(hidden)))
    assert split("none")[1] == [] and split("all")[0] == []
    assert split([0, 2]) == ([i for i in visible + hidden if i not in (0, 2)], [0, 2])
    redraw_visible, redraw_hidden = split("redraw")
    assert redraw_visible == redraw_hidden == sorted(visible + hidden)
    with pytest.raises(ValueError, match="no graded case 99"):
        split([99])
    # without a hidden seed nothing is hidden, whatever the setting
    cases = make_graded_cases(resolve("softmax", hidden="all"), seed=0, hidden_seed=None)
    assert cases and not any(c.hidden for c in cases)


def test_hidden_settings_reach_grading_json_the_grader_and_not_the_students_folder(tmp_path, capsys):
    from numpytfmr.run.cli import main

    out = tmp_path / "hw"
    assert main(["make-assignment", "softmax", "relu", "-o", str(out), "--hidden", "softmax:all",
                 "--hidden", "relu:0", "--hidden-seed", "4", "--timeout", str(GRADING_TIMEOUT)]) == 0
    config = json.loads((out / "autograder" / "grading.json").read_text())
    entries = {f["name"]: f for f in config["functions"]}
    assert entries["softmax"]["hidden"] == "all" and entries["relu"]["hidden"] == [0]
    report = grade(CORRECT, config=out / "autograder" / "grading.json")
    assert all(t.hidden for t in report.tests if t.function.startswith("softmax")
               and not t.label.startswith("float32"))
    relu_hidden = {t.label for t in report.tests if t.function == "relu_forward" and t.hidden}
    assert len(relu_hidden) == 1
    shown = report.gradescope()
    assert all(t["visibility"] == "after_due_date" for t in shown["tests"] if "hidden" in t["name"])
    data = json.loads((out / "student" / "check_data.json").read_text())
    labels = {c["label"] for item in data["items"] for c in item["cases"]}
    assert not {label.replace("hidden: ", "") for label in relu_hidden} & labels
    assert main(["make-assignment", "relu", "-o", str(tmp_path / "bad"), "--hidden", "relu"]) == 2
    assert "--hidden 'relu'" in capsys.readouterr().err


def test_weights_per_function_and_one_function_of_a_pair(tmp_path, capsys):
    from numpytfmr.run.cli import main

    out = tmp_path / "hw"
    assert main(["make-assignment", "softmax", "relu", "-o", str(out), "--weight",
                 "softmax_backward=8", "--weight", "relu=5", "--timeout", str(GRADING_TIMEOUT)]) == 0
    entries = {f["name"]: f for f in json.loads((out / "autograder" / "grading.json").read_text())
               ["functions"]}
    assert entries["softmax"]["weights"] == {"softmax_forward": 4.0, "softmax_backward": 8.0}
    assert entries["softmax"]["weight"] == 12.0 and entries["relu"]["weight"] == 5.0
    report = grade(CORRECT, config=out / "autograder" / "grading.json")
    scores = report.function_scores()
    assert scores["softmax_backward"] == (8.0, 8.0) and scores["softmax_forward"] == (4.0, 4.0)
    assert scores["relu_forward"][1] + scores["relu_backward"][1] == pytest.approx(5.0)
    assert report.max_score == pytest.approx(17.0)
    # naming one function of a pair: the other is in the skeleton, carries no points, and says so
    capsys.readouterr()
    assert main(["make-assignment", "softmax_backward", "-o", str(tmp_path / "hw2")]) == 0
    assert "softmax_forward is in the skeleton" in capsys.readouterr().out
    entry = json.loads((tmp_path / "hw2" / "autograder" / "grading.json").read_text())["functions"][0]
    assert entry["weights"] == {"softmax_forward": 0.0, "softmax_backward": 6.0}
    assert main(["make-assignment", "softmax", "-o", str(tmp_path / "hw3"), "--weight",
                 "relu_backward=3"]) == 2


def test_a_plain_function_s_wrong_output_is_recognised_as_the_op_it_computes():
    """The grader's plain functions use the checker's recognition by behaviour: an output that
    is a registered op's (here LayerNorm's, eps 1e-5, no gain or shift) is named; one that is
    no op's gets no sentence."""
    from numpytfmr.grading.grader import _recognised_op
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6))
    mu = x.mean(-1, keepdims=True)
    normed = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    said = _recognised_op((x,), normed)
    assert "layernorm" in said and "eps=1e-05" in said, said
    assert _recognised_op((x,), x ** 3 + 0.5) == ""
    assert _recognised_op((x, 3), normed) == ""          # a non-array input: not tried
