"""The submission process's own defences (grading/child.py's audit hook, defence in depth) and
the parts of grading/sandbox.py and grading/channel.py that need no hostile class: the frames'
checks, the choice of isolation, the Gradescope scripts. The operating system's isolation is
tried route by route in test_grading_hostile.py.

The audit hook is tested without OS isolation (``isolation none``), where it is the only thing
in the way: each route is a function of a hostile submission
(tests/grading_fixtures/hostile/reach_*.py, appended to the correct one) that returns a right
answer if it gets through; the route is closed when its test fails with a "not allowed" message.
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import numpytfmr
from conftest import COMMAND_TIMEOUT, GRADING_TIMEOUT
from numpytfmr.grading import grade, make_assignment
from numpytfmr.grading.sandbox import Isolation

HOOK_ONLY = Isolation("none")

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
                                "timeout": GRADING_TIMEOUT, "float32_case": False,
                                "functions": [{"name": op, "cases": [0]} for op in OPS]}))
    return path


@pytest.fixture(scope="module")
def forward_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reach_forward")
    config = _config(tmp / "autograder")
    path = _write(tmp, "reach_forward.py", {"PACKAGE_DIR": PACKAGE, "CONFIG_PATH": str(config)})
    return grade(path, config=config, isolation=HOOK_ONLY)


@pytest.fixture(scope="module")
def backward_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reach_backward")
    config = _config(tmp / "autograder")
    escape = tmp / "escaped.txt"
    path = _write(tmp, "reach_backward.py", {"PACKAGE_DIR": PACKAGE, "ESCAPE_PATH": str(escape)})
    return grade(path, config=config, isolation=HOOK_ONLY), escape


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
                   protect=[("/", "everything")], isolation=HOOK_ONLY)
    assert "activations.py is not allowed" in report.tests[0].output()


def test_gradescope_setup_installs_bubblewrap_pins_numpy_and_checks_the_sandbox(tmp_path):
    paths = make_assignment(["relu"], tmp_path / "hw", hidden_seed=1)
    setup = Path(paths["setup"]).read_text()
    run = Path(paths["run"]).read_text()
    for script in (paths["setup"], paths["run"]):
        proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert "apt-get install -y -qq bubblewrap" in setup
    # the NumPy of the documented image's Python (grading/gradescope.json), not the grader's own
    pins = json.loads((Path(PACKAGE) / "grading" / "gradescope.json").read_text())
    assert f'numpy=={pins["numpy"]}' in setup
    assert setup.rstrip().endswith("python3 -m numpytfmr.grading --check")
    assert 'chmod -R go-rwx "$root/source" "$root/submission" "$root/results"' in run
    assert run.index("chmod -R go-rwx") < run.index("python3 -m numpytfmr grade")
    assert "child-user" not in run


def test_the_sandbox_check_says_how_submissions_are_isolated(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "numpytfmr.grading", "--check"], capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT, cwd=os.path.dirname(PACKAGE))
    from numpytfmr.grading.sandbox import bubblewrap_problem
    if bubblewrap_problem() is None:
        assert proc.returncode == 0 and "bubblewrap sandbox" in proc.stdout, proc.stderr
    else:
        assert ("bubblewrap" in proc.stdout + proc.stderr) and proc.returncode in (0, 1)


def test_a_class_without_any_isolation_is_refused_unless_asked(tmp_path, monkeypatch, capsys):
    from numpytfmr.grading import sandbox
    from numpytfmr.run.cli import main

    monkeypatch.setattr(sandbox, "bubblewrap_problem", lambda: "bwrap is not installed")
    monkeypatch.setattr(sandbox, "_is_root", lambda: False)
    monkeypatch.delenv(sandbox.REQUIRE_ENV, raising=False)
    subs = tmp_path / "class"
    subs.mkdir()
    shutil.copy(CORRECT, subs / "a.py")
    argv = ["grade", str(subs), "--only", "relu", "--csv", str(tmp_path / "g.csv")]
    assert main(argv) == 2
    assert "--no-isolation" in capsys.readouterr().err
    assert main(argv + ["--no-isolation"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "g.csv", newline="")))
    assert rows[0]["isolation"] == "not isolated"
    assert "not isolated" in (tmp_path / "g_results" / "a" / "report.txt").read_text()
    # one submission still grades on the instructor's machine, and says so
    assert main(["grade", str(subs / "a.py"), "--only", "relu", "--json",
                 str(tmp_path / "r.json")]) == 0
    assert json.load(open(tmp_path / "r.json"))["extra_data"]["isolation"] == "none"
    monkeypatch.setenv(sandbox.REQUIRE_ENV, "1")
    assert main(["grade", str(subs / "a.py"), "--only", "relu"]) == 2
    assert "NUMPYTFMR_REQUIRE_SANDBOX" in capsys.readouterr().err


@pytest.mark.parametrize("header, body, why", [
    (b"[]", 0, "malformed header"),
    (b'{"meta": {}, "arrays": [["a", "|O", [1]]]}', 8, "not a plain numeric array"),
    (b'{"meta": {}, "arrays": [["a", "<f8", [-1]]]}', 8, "not a plain numeric array"),
    (b'{"meta": {}, "arrays": [["a", "<f8", [1, true]]]}', 8, "not a plain numeric array"),
    (b'{"meta": {}, "arrays": [["a", "<f8", [4294967296, 4294967296]]]}', 8, "larger than"),
    (b'{"meta": {}, "arrays": [["a", "<f8", [2]]]}', 24, "do not fill"),
])
def test_a_frame_header_is_checked_before_anything_is_allocated(header, body, why):
    from numpytfmr.grading.child import parse_header

    with pytest.raises(ValueError, match=why):
        parse_header(header, body)


def test_frames_carry_arrays_of_every_numeric_dtype_exactly():
    import numpy as np
    from numpytfmr.grading.child import frame, parse_header, split_body

    rng = np.random.default_rng(0)
    arrays = {f"a{i}": (rng.standard_normal((2, 3)) * 100).astype(dt)
              for i, dt in enumerate(["?", "i1", "i8", "u2", "f2", "f4", "f8"])}
    arrays["scalar"] = np.float64(3.5)
    arrays["empty"] = np.zeros((0, 4), np.float32)
    data = frame({"ok": True}, arrays)
    n_head, n_body = __import__("struct").unpack("<QQ", data[:16])
    meta, specs = parse_header(data[16:16 + n_head], n_body)
    got = split_body(bytearray(data[16 + n_head:]), specs)
    assert meta == {"ok": True} and got.keys() == arrays.keys()
    for k, a in arrays.items():
        a = np.asarray(a)
        assert got[k].dtype == a.dtype and got[k].shape == a.shape
        assert got[k].tobytes() == a.tobytes()


def test_a_module_the_instructor_allows_imports_in_the_sandbox_and_others_do_not(tmp_path):
    pytest.importorskip("iniconfig")           # a small pure package the test extra brings
    path = tmp_path / "homework.py"
    path.write_text(CORRECT.read_text() + '''

_ok = relu_forward


def relu_forward(x):
    import iniconfig  # noqa: F401
    return _ok(x)
''')
    config = {"float32_case": False, "functions": ["relu"]}
    report = grade(path, config=dict(config, allow_modules=["iniconfig"]))
    assert all(t.passed for t in report.tests), [t.output() for t in report.tests][:1]
    report = grade(path, config=config)
    forward = next(t for t in report.tests if t.function == "relu_forward")
    assert not forward.passed and "iniconfig" in forward.output()


def _fresh_uid(_):
    from numpytfmr.grading import sandbox
    return sandbox.new_uid()


@pytest.mark.skipif(os.geteuid() != 0, reason="user IDs of their own need root")
def test_user_ids_are_fresh_across_forked_workers_and_within_bwraps_range():
    """One user ID per submission, never reused within a run, from a block the run claims
    before its workers fork; bwrap refuses a --uid of 2**31 or more."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from numpytfmr.grading import sandbox

    assert sandbox.UID_BASE + sandbox.UID_BLOCKS * sandbox.UID_BLOCK <= 2 ** 31 - 1
    sandbox.claim_user_ids()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        uids = list(pool.map(_fresh_uid, range(6)))
    uids += [sandbox.new_uid() for _ in range(3)]
    assert len(set(uids)) == 9 and all(sandbox.UID_BASE <= u < 2 ** 31 for u in uids), uids
    with sandbox.submission_user(Isolation("bubblewrap")) as uid:
        assert sandbox.child_uid() == sandbox.child_uid() == uid and uid not in uids
    assert sandbox.child_uid() != uid


@pytest.mark.skipif(os.geteuid() != 0, reason="user IDs of their own need root")
def test_kill_user_ends_every_process_of_the_user_id_and_stops_when_none_is_left(monkeypatch):
    """Linux's kill(-1) succeeds whenever any other process runs, so its status never said
    "nothing left" and the sweep ran all its rounds, four times a submission; now it stops as
    soon as /proc shows no live process of the ID (a zombie is not one)."""
    from numpytfmr.grading import sandbox
    uid = sandbox.new_uid()
    sleepers = [subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[])
                for _ in range(2)]
    assert sandbox._left_of(uid, os.getpid())
    assert sandbox.kill_user(uid)
    assert [p.wait(timeout=COMMAND_TIMEOUT) for p in sleepers] == [-9, -9]
    assert not sandbox._left_of(uid, os.getpid())
    monkeypatch.setattr(sandbox, "_KILL_ROUNDS", 3)     # no process of the ID: the first round
    assert sandbox.kill_user(uid)                       # finds none (the old loop: all rounds)


def test_the_cpu_time_of_a_process_tree_is_read_from_proc():
    """A sandbox's Python is reaped inside its PID namespace, so its CPU time never reaches the
    grader's count of its children: channel.process_tree_cpu reads it from /proc, descendants
    included, before the process ends."""
    from numpytfmr.grading.channel import process_tree_cpu
    burn = ("import time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\n"
            "time.sleep(60)")
    tree = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{burn}"; true'],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert tree.stdout.readline().strip() == "done"
        assert process_tree_cpu(tree.pid) >= 0.25          # the shell's child, counted
        assert process_tree_cpu(tree.pid) < 60
    finally:
        os.killpg(tree.pid, signal.SIGKILL)                 # the shell and its child
        tree.wait()


def test_the_machines_openblas_settings_reach_the_submission(monkeypatch):
    """OPENBLAS_CORETYPE is what some processors need for NumPy's OpenBLAS to start: the
    grader passes it (and OPENBLAS_L2_SIZE) to the submission's process, in every mode;
    nothing else of the grader's environment goes through."""
    from numpytfmr.grading import sandbox
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1048576")
    monkeypatch.setenv("NUMPYTFMR_SECRET_OF_THE_GRADER", "x")
    for mode in ("user", "none"):
        kw = sandbox.launch(mode, ["-c", "pass"], uid=2000000001, limits={}, workdir="/tmp")
        assert kw["env"]["OPENBLAS_CORETYPE"] == "Haswell"
        assert kw["env"]["OPENBLAS_L2_SIZE"] == "1048576"
        assert "NUMPYTFMR_SECRET_OF_THE_GRADER" not in kw["env"]
