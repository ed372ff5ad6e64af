"""A hostile class, route by route, against the operating system's isolation (grading/sandbox.py).

Every route of tests/grading_fixtures/hostile/os_routes.py returns a right answer only when it
gets through, so a route is contained when its function gets no credit and leaves no trace.
The audit hook is switched off in these tests (the child's source is run without it), as a
student who defeats it would: what is tested is what the operating system enforces. Each route
runs in the three modes where it applies: one submission (``grade``), a whole class (``grade
DIR --csv``) and the Gradescope bundle's run_autograder in a simulated autograder folder.

They need bubblewrap (Debian's ``bubblewrap``) and, for the process limit and the per-submission
user IDs, root; elsewhere they skip with the reason, unless NUMPYTFMR_REQUIRE_SANDBOX=1 (CI)
makes a missing sandbox a failure.
"""
import csv
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import numpytfmr
from conftest import COMMAND_TIMEOUT, GRADING_TIMEOUT
from numpytfmr.grading import channel, grade, make_assignment
from numpytfmr.grading.cases import make_graded_cases, resolve
from numpytfmr.grading.channel import check
from numpytfmr.grading.sandbox import REQUIRE_ENV, Isolation, bubblewrap_problem, readable_by_all
from numpytfmr.run.cli import main

FIXTURES = Path(__file__).parent / "grading_fixtures"
CORRECT = FIXTURES / "correct.py"
PACKAGE = os.path.dirname(os.path.abspath(numpytfmr.__file__))
SANDBOX = Isolation("bubblewrap")
ROUTES = ("softmax", "relu", "gelu", "log_softmax", "layernorm", "rmsnorm", "linear", "embedding",
          "cross_entropy", "attention", "dpo_loss")
# the routes each test asserts on, by forward: what it tries
READ_REFERENCE, READ_CONFIG, WRITE_GRADER, PROC_MEM = ("softmax_forward", "relu_forward",
                                                       "gelu_forward", "log_softmax_forward")
FORK_BOMB, NETWORK, OTHERS, CANARY = ("rmsnorm_forward", "embedding_forward",
                                      "cross_entropy_forward", "dpo_loss_forward")

_problem = bubblewrap_problem()
if _problem and os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
    raise RuntimeError(f"{REQUIRE_ENV}=1 but the bubblewrap sandbox cannot run: {_problem}")
pytestmark = pytest.mark.skipif(bool(_problem), reason=f"no bubblewrap sandbox here: {_problem}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the per-submission user ID and the "
                                                          "process limit need the grader to be root")
_user_problem = check("user")[1]
MODES = [pytest.param("bubblewrap", marks=needs_root),
         pytest.param("user", marks=pytest.mark.skipif(
             bool(_user_problem), reason=f"no isolation by user ID for this Python: {_user_problem} "
                                         "(test_grading_installs.py tries mode user with a Python "
                                         "every user can run)"))]


@pytest.fixture
def no_audit_hook(monkeypatch):
    """Run the child without its audit hook: the student defeated it."""
    call = "    install_sandbox(protected, os.getcwd(), blocked)\n"
    assert call in channel.CHILD_SOURCE
    monkeypatch.setattr(channel, "CHILD_SOURCE", channel.CHILD_SOURCE.replace(call, "    pass\n"))


def _digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# How long a process killed by the grader may take to be reaped on a busy machine; well below
# the escapee's own 60 s sleep, so a survivor is still found.
REAP_SECONDS = 20


def _survivors(mark=None, *, uid=None):
    """Living processes on this machine named ``mark`` (the escapee renames itself), or owned
    by ``uid``; a killed one is a zombie until it is reaped, so the look is repeated for up to
    REAP_SECONDS."""
    deadline = time.monotonic() + REAP_SECONDS
    while True:
        found = []
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and (Path(f"/proc/{pid}/comm").read_text().strip() == mark
                                      if uid is None else os.stat(f"/proc/{pid}").st_uid == uid):
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state not in ("Z", "X"):
                        found.append(int(pid))
            except OSError:
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.fixture
def server():
    """A TCP server on this machine's loopback: the network route's target."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


def _setting(tmp_path, mark, port=1):
    """The course's files: the config, a canary only root may change, another student's folder,
    and the results folder; the hostile submission with their paths filled in."""
    auto = tmp_path / "autograder"
    auto.mkdir()
    config = auto / "grading.json"
    config.write_text(json.dumps({"assignment": "homework", "seed": 0, "hidden_seed": 7,
                                  "timeout": GRADING_TIMEOUT, "float32_case": False,
                                  "functions": [{"name": op, "cases": [0]} for op in ROUTES]}))
    canary = tmp_path / "canary.txt"
    canary.write_text("root's")
    os.chmod(canary, 0o600)
    subs = tmp_path / "class"
    subs.mkdir()
    for name in ("honest_a", "honest_b"):
        shutil.copy(CORRECT, subs / f"{name}.py")
    text = CORRECT.read_text() + "\n\n" + (FIXTURES / "hostile" / "os_routes.py").read_text()
    for old, new in {"PACKAGE_DIR": PACKAGE, "CONFIG_PATH": str(config), "CLASS_DIR": str(subs),
                     "RESULTS_DIR": str(tmp_path / "out"), "CANARY_PATH": str(canary),
                     "MARK": mark, "PORT": str(port)}.items():
        text = text.replace(old, new)
    (subs / "hostile.py").write_text(text)
    return config, canary, subs


def _mark():
    return f"esc{os.getpid() % 100000}{int(time.time() * 1000) % 100000}"


def _before(config, canary, subs):
    watched = [config, canary, *sorted(subs.glob("honest_*.py")), Path(PACKAGE, "grading",
                                                                       "compare.py")]
    return {p: _digest(p) for p in watched}


def _assert_contained(passed, mark, digests, mode="bubblewrap"):
    """Every route got no credit, and left nothing behind. A user ID of its own does not take
    the network away, nor files every user may read (docs/sandbox.md): where the reference is
    such a file, and for the network, only bubblewrap stands in the way."""
    routes = [READ_CONFIG, WRITE_GRADER, PROC_MEM, OTHERS, CANARY, FORK_BOMB]
    if mode == "bubblewrap":
        routes += [NETWORK, READ_REFERENCE]
    elif not readable_by_all(os.path.join(PACKAGE, "__init__.py")):
        routes += [READ_REFERENCE]
    for route in routes:
        assert not passed[route], f"{route} got through"
    for path, digest in digests.items():
        assert _digest(path) == digest, f"{path} was changed"
    assert not _survivors(mark), "a process of the submission outlived grading"
    assert not Path("/dev/shm", mark).exists(), "a file was left in /dev/shm"


# --- one submission -------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_one_submission_gets_nothing_through_any_route(tmp_path, no_audit_hook, server, mode):
    mark = _mark()
    config, canary, subs = _setting(tmp_path, mark, server)
    digests = _before(config, canary, subs)
    report = grade(subs / "hostile.py", config=config, isolation=Isolation(mode))
    passed = {t.function: t.passed for t in report.tests if t.function.endswith("_forward")}
    _assert_contained(passed, mark, digests, mode)
    assert report.isolation == mode and f"isolation: {Isolation(mode).description}" in report.table()


def test_without_isolation_the_same_routes_get_through(tmp_path, no_audit_hook, server):
    """The suite can fail: without the operating system's isolation (and the hook off), reading
    the reference and the hidden seed, and the network, earn the marks."""
    config, canary, subs = _setting(tmp_path, _mark(), server)
    report = grade(subs / "hostile.py", config=config, only=["softmax", "relu", "embedding"],
                   isolation=Isolation("none"))
    passed = {t.function: t.passed for t in report.tests}
    assert passed[READ_REFERENCE] and passed[READ_CONFIG] and passed[NETWORK]


# --- a whole class --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_a_class_keeps_its_students_apart(tmp_path, no_audit_hook, server, capsys, mode):
    mark = _mark()
    config, canary, subs = _setting(tmp_path, mark, server)
    digests = _before(config, canary, subs)
    out = tmp_path / "out"
    out.mkdir()
    grades, summary = out / "grades.csv", out / "summary.json"
    argv = ["grade", str(subs), "--config", str(config), "--csv", str(grades), "--jobs", "2",
            "--summary", str(summary), "--isolation", mode]
    assert main(argv) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(grades, newline=""))}
    for honest in ("honest_a", "honest_b"):
        assert rows[honest]["score"] == rows[honest]["max_score"], rows[honest]
        assert rows[honest]["isolation"] == mode
        results = json.loads((out / "grades_results" / honest / "results.json").read_text())
        assert results["score"] == float(rows[honest]["max_score"])
    hostile = rows["hostile"]
    passed = {f: float(hostile[f]) > 0 for f in hostile if f.endswith("_forward")}
    _assert_contained(passed, mark, digests, mode)
    # the results were not forged: a second run reuses every row, as the grader wrote it
    assert main(argv) == 0
    again = {r["student"]: r for r in csv.DictReader(open(grades, newline=""))}
    assert again == rows
    data = json.loads(summary.read_text())
    assert data["isolation"] == [mode] and data["start_seconds_per_submission"] > 0
    # the cost of the sandbox beside the work (#35): wall and CPU time, start-up per submission
    assert data["wall_seconds_per_submission"] > data["start_seconds_per_submission"]
    assert data["cpu_seconds_per_submission"] > 0 and data["cpu_seconds"] > 0


# --- the Gradescope bundle ------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_the_gradescope_run_gets_nothing_through_and_root_follows_no_link(tmp_path, server, mode):
    mark = _mark()
    config, canary, subs = _setting(tmp_path, mark, server)
    paths = make_assignment(list(ROUTES), tmp_path / "hw", hidden_seed=7)
    root = tmp_path / "ag"
    source = root / "source"
    shutil.copytree(Path(paths["config"]).parent, source)
    (root / "submission").mkdir()
    shutil.copy(subs / "hostile.py", root / "submission" / "homework.py")
    # the student's process defeats the hook in the copy of the grader that Gradescope runs
    child = source / "numpytfmr" / "grading" / "child.py"
    child.write_text(child.read_text().replace("    install_sandbox(protected, os.getcwd(), blocked)\n",
                                               "    pass\n"))
    digests = _before(Path(paths["config"]), canary, subs)
    path = [os.path.dirname(sys.executable), os.environ["PATH"]]
    if mode == "user":                  # an image where bubblewrap cannot start: the fallback
        fake = tmp_path / "fakebin"
        fake.mkdir()
        (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions' >&2\nexit 1\n")
        os.chmod(fake / "bwrap", 0o755)
        path.insert(0, str(fake))
    env = dict(os.environ, NUMPYTFMR_AUTOGRADER_ROOT=str(root), PATH=os.pathsep.join(path))
    env.pop(REQUIRE_ENV, None)
    proc = subprocess.run(["bash", str(source / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["extra_data"]["isolation"] == mode, results["output"]
    passed = {t["name"].split(" ")[0]: t["status"] == "passed" for t in results["tests"]}
    _assert_contained(passed, mark, digests, mode)
    assert results["score"] < results["max_score"]
    assert "root's" == canary.read_text() and "hidden_seed" not in json.dumps(results["tests"])


# --- the channel: answers are checked before anything is allocated ---------------------------

def _raw_answer_submission(tmp_path, payload):
    """A submission whose relu_forward writes ``payload`` (Python source of bytes) straight into
    the answer pipe, then waits."""
    path = tmp_path / "homework.py"
    path.write_text(CORRECT.read_text() + f'''

import os as _os, sys as _sys, time as _time


def relu_forward(x):
    _os.write(int(_sys.argv[2]), {payload})
    _time.sleep(30)
''')
    return path


@pytest.mark.parametrize("payload, why", [
    ('__import__("struct").pack("<QQ", 1 << 40, 0)', "claims"),
    ('(lambda h: __import__("struct").pack("<QQ", len(h), 8) + h + bytes(8))('
     'b\'{"meta": {}, "arrays": [["r", "<f8", [1073741824, 3]]]}\')', "larger than the message"),
    ('__import__("struct").pack("<QQ", 2, 0) + b"[]"', "malformed"),
])
def test_an_answer_declaring_more_than_it_holds_is_refused_without_allocating(
        tmp_path, no_audit_hook, payload, why):
    import resource
    path = _raw_answer_submission(tmp_path, payload)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = grade(path, only=["relu"], config={"float32_case": False}, timeout=GRADING_TIMEOUT,
                   isolation=SANDBOX)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    forward = next(t for t in report.tests if t.function == "relu_forward")
    assert not forward.passed and why in forward.output(), forward.output()
    assert grown_mb < 200


def test_output_and_garbage_go_to_pipes_the_grader_reads_up_to_a_cap(tmp_path, no_audit_hook):
    path = tmp_path / "homework.py"
    path.write_text(CORRECT.read_text() + '''

_ok = relu_forward


def relu_forward(x):
    print("x" * (1 << 22))          # 4 MB of output: more than the pipe holds
    return _ok(x)
''')
    report = grade(path, only=["relu"], config={"float32_case": False}, isolation=SANDBOX)
    assert all(t.passed for t in report.tests), [t.output() for t in report.tests][:1]
    session = channel.Submission([{"filename": "h.py", "source": "print('y' * 300000)",
                                   "continue_on_error": False}], timeout=GRADING_TIMEOUT,
                                 limits={"cpu_seconds": 30, "memory_bytes": 2 << 30,
                                         "file_bytes": 1 << 20}, isolation=SANDBOX)
    try:
        deadline = time.monotonic() + 2
        while session._out is not None and time.monotonic() < deadline:
            if select.select([session._out], [], [], 0.2)[0]:
                session._drain()
        assert session.load_error is None and 0 < len(session._output) <= channel.OUTPUT_CAP
    finally:
        session.close()


# --- hidden cases ---------------------------------------------------------------------------

def test_hidden_inputs_never_reach_visible_feedback_even_across_runs(tmp_path, no_audit_hook):
    """The submission records every input it sees in its home folder (a file, or sqlite) and
    puts all it has recorded into the message of a visible test; it is graded twice. Hidden
    cases run after the visible ones, in fresh sandboxes, and nothing persists between runs."""
    path = tmp_path / "homework.py"
    path.write_text(CORRECT.read_text() + '''

import os as _os, sqlite3 as _sqlite3

_ok = softmax_forward


def softmax_forward(x, axis=-1):
    db = _sqlite3.connect(_os.path.expanduser("~/seen.db"))
    db.execute("create table if not exists seen (h text)")
    db.execute("insert into seen values (?)", (x.tobytes().hex()[:24],))
    db.commit()
    seen = [r[0] for r in db.execute("select h from seen")]
    raise ValueError("SEEN " + " ".join(seen))
''')
    config = {"float32_case": False, "hidden_seed": 3,
              "functions": [{"name": "softmax", "cases": "all"}]}
    hidden = {gc.case.args[0].tobytes().hex()[:24]
              for gc in make_graded_cases(resolve("softmax"), seed=0, hidden_seed=3,
                                          float32_case=False) if gc.hidden}
    assert hidden
    for _ in range(2):
        results = grade(path, config=config, isolation=SANDBOX).gradescope()
        visible = results["output"] + json.dumps([t for t in results["tests"]
                                                  if t["visibility"] == "visible"])
        assert "SEEN" in visible and not any(h in visible for h in hidden)
    assert "hidden" not in results["output"].split(";")[0]      # no count of hidden tests


def test_the_visible_summary_counts_only_visible_tests(tmp_path):
    path = tmp_path / "homework.py"
    shutil.copy(CORRECT, path)
    report = grade(path, only=["relu"], hidden_seed=5, config={"float32_case": False},
                   isolation=SANDBOX)
    n_visible = sum(not t.hidden for t in report.tests)
    assert n_visible < len(report.tests)
    line = report.gradescope()["output"].splitlines()[0]
    assert f"{n_visible} of {n_visible} passed" in line and f"of {len(report.tests)}" not in line
