"""The sandbox of the submission process (issue #16, item 7): an audit hook, installed before the
submission loads, keeps the reference, the grading config and escape hatches out of reach; the
Gradescope bundle adds an unprivileged user.

Each route is a function of a hostile submission (tests/grading_fixtures/hostile/reach_*.py,
appended to the correct one) that returns a right answer if it gets through: the route is closed
when its test fails with a "not allowed" message.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import numpytfmr
from numpytfmr.grading import grade, make_assignment

FIXTURES = Path(__file__).parent / "grading_fixtures"
CORRECT = FIXTURES / "correct.py"
PACKAGE = os.path.dirname(os.path.abspath(numpytfmr.__file__))
NOT_ALLOWED = "is not allowed in a graded submission"
OPS = ("softmax", "relu", "gelu", "log_softmax", "layernorm", "rmsnorm", "linear", "embedding",
       "cross_entropy", "attention", "lora_linear", "dpo_loss")


def _write(tmp_path, fixture, replace):
    text = CORRECT.read_text() + "\n\n" + (FIXTURES / "hostile" / fixture).read_text()
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "homework.py"
    path.write_text(text)
    return path


def _config(folder):
    """A grading config in its own folder: the first case of every op, no float32 case."""
    folder.mkdir()
    path = folder / "grading.json"
    path.write_text(json.dumps({"assignment": "homework", "seed": 0, "hidden_seed": None,
                                "timeout": 5, "float32_case": False,
                                "functions": [{"name": op, "cases": [0]} for op in OPS]}))
    return path


@pytest.fixture(scope="module")
def forward_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reach_forward")
    config = _config(tmp / "autograder")
    path = _write(tmp, "reach_forward.py", {"PACKAGE_DIR": PACKAGE, "CONFIG_PATH": str(config)})
    return grade(path, config=config)


@pytest.fixture(scope="module")
def backward_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reach_backward")
    config = _config(tmp / "autograder")
    escape = tmp / "escaped.txt"
    path = _write(tmp, "reach_backward.py", {"PACKAGE_DIR": PACKAGE, "ESCAPE_PATH": str(escape)})
    return grade(path, config=config), escape


def _only(report, function):
    tests = [t for t in report.tests if t.function == function]
    assert len(tests) == 1, [t.name for t in report.tests]
    return tests[0]


@pytest.mark.parametrize("function, message", [
    ("softmax_forward", f"opening {PACKAGE}/__init__.py {NOT_ALLOWED}: it belongs to the reference"),
    ("relu_forward", f"opening {PACKAGE}/activations.py {NOT_ALLOWED}"),
    ("gelu_forward", f"opening {PACKAGE}/__init__.py {NOT_ALLOWED}"),
    ("log_softmax_forward", f"opening {PACKAGE}/__init__.py {NOT_ALLOWED}"),
    ("layernorm_forward", f"grading.json {NOT_ALLOWED}: it belongs to the grading configuration"),
    ("rmsnorm_forward", f"opening {PACKAGE}/norms.py {NOT_ALLOWED}"),
    ("linear_forward", f"import of 'ctypes' {NOT_ALLOWED}"),
    ("embedding_forward", f"import of 'torch' {NOT_ALLOWED}: torch is an automatic-differentiation"),
    ("cross_entropy_forward", f"import of 'jax' {NOT_ALLOWED}"),
    ("attention_forward", f"import of 'numpytfmr' {NOT_ALLOWED}: numpytfmr is the reference"),
    ("lora_linear_forward", f"import of 'numpytfmr' {NOT_ALLOWED}"),
    ("dpo_loss_forward", f"starting another program (subprocess.Popen) {NOT_ALLOWED}"),
])
def test_routes_to_the_reference_in_a_forward_are_refused(forward_report, function, message):
    t = _only(forward_report, function)
    assert not t.passed and message in t.output(), t.output()
    backward = _only(forward_report, function.replace("_forward", "_backward"))
    assert not backward.passed and "not run" in backward.output()


@pytest.mark.parametrize("function, message", [
    ("softmax_backward", f"listing {PACKAGE} {NOT_ALLOWED}"),
    ("relu_backward", f"escaped.txt {NOT_ALLOWED}: a submission may write only in its working"),
    ("gelu_backward", f"starting another program (os.system) {NOT_ALLOWED}"),
    ("log_softmax_backward", f"{NOT_ALLOWED} (reading another process's files)"),
    ("layernorm_backward", f"opening {PACKAGE}/__init__.py {NOT_ALLOWED}"),
    ("rmsnorm_backward", f"making links (os.symlink) {NOT_ALLOWED}"),
    ("linear_backward", f"opening {PACKAGE}/__init__.py {NOT_ALLOWED}"),
    ("embedding_backward", f"opening a network connection (socket.__new__) {NOT_ALLOWED}"),
    ("cross_entropy_backward", f"opening {PACKAGE}/__init__.py {NOT_ALLOWED}"),
    ("attention_backward", f"ctypes (ctypes.dlopen) {NOT_ALLOWED}"),
    ("lora_linear_backward", f"replacing a function's __defaults__ {NOT_ALLOWED}"),
    ("dpo_loss_backward", f"opening the folder {os.path.dirname(PACKAGE)} {NOT_ALLOWED}: it holds "
                          "the reference"),
])
def test_routes_in_a_backward_are_refused_and_the_forward_keeps_its_credit(backward_report, function,
                                                                           message):
    report, escape = backward_report
    t = _only(report, function)
    assert not t.passed and message in t.output(), t.output()
    assert _only(report, function.replace("_backward", "_forward")).passed
    assert not escape.exists()


def test_numpy_lazy_imports_temporary_files_and_printing_still_work(tmp_path):
    path = tmp_path / "homework.py"
    path.write_text(CORRECT.read_text() + '''

import tempfile as _tempfile

_ok_relu_forward = relu_forward


def relu_forward(x):
    import numpy.fft, numpy.polynomial, numpy.random, numpy.testing, numpy.ma  # noqa: F401
    import subprocess, threading, json, pathlib  # noqa: F401  (importing is fine; spawning is not)
    np.testing.assert_allclose(np.fft.ifft(np.fft.fft(x.ravel())).real, x.ravel(), atol=1e-12)
    with _tempfile.TemporaryDirectory() as d:
        np.save(d + "/x.npy", x)
        y = np.load(d + "/x.npy")
    print("debug output is fine")
    return _ok_relu_forward(y)
''')
    report = grade(path, only=["relu"], config={"float32_case": False})
    failed = [t.output() for t in report.tests if not t.passed]
    assert report.tests and not failed, failed[:2]


def test_the_config_folder_and_other_students_are_protected_not_python_or_numpy(tmp_path):
    from numpytfmr.grading import make_plan

    config = _config(tmp_path / "autograder")
    plan = make_plan(config=config, protect=[(tmp_path / "class", "the submissions of the class")])
    paths = {p: why for p, why in plan.protect}
    assert paths[PACKAGE].startswith("the reference")
    assert paths[str(config)] == "the grading configuration"
    assert paths[str(config.parent)] == "the grading configuration's folder"
    assert paths[str(tmp_path / "class")] == "the submissions of the class"
    # a config folder that holds NumPy (here: /) is left out by the child, not the whole disk
    path = _write(tmp_path, "reach_forward.py", {"PACKAGE_DIR": PACKAGE, "CONFIG_PATH": "/x"})
    report = grade(path, only=["relu"], config={"float32_case": False, "functions": ["relu"]},
                   protect=[("/", "everything")])
    assert "activations.py is not allowed" in report.tests[0].output()


def test_gradescope_scripts_make_an_unprivileged_user_and_lock_the_reference(tmp_path):
    paths = make_assignment(["relu"], tmp_path / "hw", hidden_seed=1)
    setup = Path(paths["setup"]).read_text()
    run = Path(paths["run"]).read_text()
    for script in (paths["setup"], paths["run"]):
        proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert "useradd --system" in setup and "numpytfmr-student" in setup and "adduser" in setup
    assert "chmod -R go-rwx /autograder/source /autograder/submission /autograder/results" in run
    assert "chown -R root:root /autograder/source" in run and "chmod go-rwx /autograder" in run
    assert "as_user=(--child-user numpytfmr-student)" in run and '"${as_user[@]}"' in run
    assert run.index("chmod -R go-rwx") < run.index("python3 -m numpytfmr grade")


def _user_can_run_python(user):
    if os.geteuid() != 0:
        return False
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", "import numpy"], user=user,
                              capture_output=True, timeout=60, cwd="/")
    except (OSError, subprocess.SubprocessError, KeyError):
        return False
    return proc.returncode == 0


@pytest.mark.skipif(not _user_can_run_python("nobody"),
                    reason="needs root, a user 'nobody', and an interpreter that user can run")
def test_child_user_runs_the_submission_without_the_graders_rights(tmp_path):
    secret = tmp_path / "secret.txt"          # readable by root only, and not in the sandbox's list
    secret.write_text("s3cret")
    os.chmod(secret, 0o600)
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "homework.py"
    path.write_text(CORRECT.read_text() + f'''

_ok_relu_forward = relu_forward


def relu_forward(x):
    try:
        open({str(secret)!r}).read()
    except PermissionError:
        return _ok_relu_forward(x)
    raise RuntimeError("the secret was readable")
''')
    report = grade(path, only=["relu"], config={"float32_case": False}, child_user="nobody")
    assert all(t.passed for t in report.tests), [t.output() for t in report.tests][:1]
    shutil.rmtree(tmp_path, ignore_errors=True)
