"""The grader fails closed whatever the Python install (grading/sandbox.py): ``numpytfmr grade``
run as instructors run it -- the console script -- from installs built here:

- a ``python -m venv --copies`` environment (the interpreter beside its scripts: conda's and
  the official container images' layout);
- a pyenv-style installation in a folder only root may enter (``~/.pyenv/versions/X.Y.Z``,
  with numpytfmr and NumPy in the installation's own site-packages and the console script in
  the interpreter's folder);
- a virtual environment of a Python every user may run (the system's), for mode ``user``.

Each grades a hostile submission (tests/grading_fixtures/hostile/os_routes.py, the audit hook
switched off in the installed copy of the grader) and checks what the grader reports and that
no route earned a mark. Mode ``user``: one user ID per submission, and what a submission
leaves in any world-writable folder (``/run/lock`` too) is removed. Root and bubblewrap are
needed (CI has both); the system Python is needed for mode ``user`` only.
"""
import csv
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import numpytfmr
from numpytfmr.grading import sandbox
from test_grading_hostile import _survivors

FIXTURES = Path(__file__).parent / "grading_fixtures"
CORRECT = FIXTURES / "correct.py"
PACKAGE = Path(numpytfmr.__file__).parent
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
OPS = ("softmax", "relu", "gelu", "cross_entropy")
HOOK = "    install_sandbox(protected, os.getcwd(), blocked)\n"

_problem = sandbox.bubblewrap_problem()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the per-submission user IDs need root"),
              pytest.mark.skipif(bool(_problem), reason=f"no bubblewrap sandbox here: {_problem}")]


# --- building installs --------------------------------------------------------------------------

def _link_tree(src, dst, skip=()):
    """A copy of the folder ``src`` at ``dst``, by hard links where one file system holds both
    (a copy elsewhere); folders made 0755, links kept as links."""
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in skip and d != "__pycache__"]
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), mode=0o755, exist_ok=True)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            a, b = os.path.join(root, name), os.path.join(dst, rel, name)
            if os.path.islink(a):
                os.symlink(os.readlink(a), b)
                continue
            try:
                os.link(a, b)
            except OSError:
                shutil.copy2(a, b)


def _install(site, hook=False):
    """NumPy and numpytfmr into ``site`` (numpytfmr without the child's audit hook unless
    ``hook``: the hostile student defeated it)."""
    os.makedirs(site, mode=0o755, exist_ok=True)
    numpy_dir = Path(np.__file__).parent
    for name in ("numpy", "numpy.libs"):
        if (numpy_dir.parent / name).is_dir():
            _link_tree(numpy_dir.parent / name, os.path.join(site, name))
    shutil.copytree(PACKAGE, os.path.join(site, "numpytfmr"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    if not hook:
        child = Path(site, "numpytfmr", "grading", "child.py")
        assert HOOK in child.read_text()
        child.write_text(child.read_text().replace(HOOK, "    pass\n"))


def _console_script(bin_dir, python):
    """The ``numpytfmr`` script pip writes for the entry point numpytfmr.run.cli:main."""
    path = Path(bin_dir, "numpytfmr")
    path.write_text(f"#!{python}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                    "from numpytfmr.run.cli import main\nif __name__ == '__main__':\n"
                    "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                    "    sys.exit(main())\n")
    path.chmod(0o755)
    return path


def _base_python():
    return os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)


def _copies_venv(where, python):
    """``python -m venv --copies`` at ``where`` with numpytfmr and NumPy installed; its script."""
    subprocess.run([python, "-m", "venv", "--copies", "--without-pip", str(where)], check=True,
                   capture_output=True, timeout=120)
    site = where / "lib" / f"python{VERSION}" / "site-packages"
    _install(site)
    return _console_script(where / "bin", where / "bin" / "python")


@pytest.fixture(scope="module")
def copies_venv(tmp_path_factory):
    return _copies_venv(tmp_path_factory.mktemp("copies") / "venv", _base_python())


@pytest.fixture(scope="module")
def pyenv_layout(tmp_path_factory):
    """``<home, 0700>/.pyenv/versions/X.Y.Z``: the base installation's interpreter and standard
    library (hard links), numpytfmr and NumPy in its own site-packages, the console script in
    the interpreter's folder."""
    home = tmp_path_factory.mktemp("root_home")
    home.chmod(0o700)
    prefix = home / ".pyenv" / "versions" / "{}.{}.{}".format(*sys.version_info[:3])
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if Path(sys.base_prefix) not in stdlib.parents:
        pytest.skip(f"the standard library {stdlib} is not inside the prefix {sys.base_prefix}")
    (prefix / "bin").mkdir(parents=True)
    binary = prefix / "bin" / f"python{VERSION}"
    try:
        os.link(_base_python(), binary)
    except OSError:
        shutil.copy2(_base_python(), binary)
    (prefix / "bin" / "python3").symlink_to(binary.name)
    dest = prefix / stdlib.relative_to(sys.base_prefix)
    _link_tree(stdlib, dest, skip=("site-packages", "dist-packages", "test", "idlelib",
                                   "tkinter", "turtledemo", "ensurepip"))
    _install(dest / "site-packages")
    script = _console_script(prefix / "bin", binary)
    proc = subprocess.run([str(binary), "-c", "import sys, numpy, numpytfmr; print(sys.prefix)"],
                          capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 0 and proc.stdout.strip() == str(prefix), proc.stderr
    return script


def _any_user_python():
    """A system interpreter of this Python's version that every user may run, or None."""
    for candidate in (f"/usr/bin/python{VERSION}", f"/usr/local/bin/python{VERSION}"):
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and not sandbox._unreachable(real):
            return real
    return None


@pytest.fixture(scope="module")
def open_venv():
    """A ``venv --copies`` of a Python every user may run, in a folder every user may enter
    (mode 0755, outside pytest's root-only folder), with NumPy; numpytfmr is installed in a
    folder only root may read (as Gradescope's run_autograder leaves it)."""
    python = _any_user_python()
    if python is None:
        pytest.skip(f"no Python {VERSION} that every user may run (/usr/bin/python{VERSION}); "
                    "mode user needs one")
    top = Path(tempfile.mkdtemp(prefix="numpytfmr-anyuser-"))
    try:
        top.chmod(0o755)
        venv = top / "venv"
        script = _copies_venv(venv, python)
        site = venv / "lib" / f"python{VERSION}" / "site-packages"
        private = top / "private"
        private.mkdir(mode=0o700)
        shutil.move(str(site / "numpytfmr"), str(private / "numpytfmr"))
        yield {"python": venv / "bin" / "python", "script": script, "private": private,
               "site": site}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", sandbox.REQUIRE_ENV,
                                                             "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env.update(extra)
    return env


# --- the class -------------------------------------------------------------------------------------

def _setting(tmp_path, package_dir, mark):
    """A config with a hidden seed, a class of two honest files and a hostile one whose
    routes aim at ``package_dir`` (the installed reference), the config and the class."""
    auto = tmp_path / "autograder"
    auto.mkdir()
    config = auto / "grading.json"
    config.write_text(json.dumps({"assignment": "homework", "seed": 0, "hidden_seed": 7,
                                  "timeout": 10, "float32_case": False,
                                  "functions": [{"name": op, "cases": [0]} for op in OPS]}))
    subs = tmp_path / "class"
    subs.mkdir()
    shutil.copy(CORRECT, subs / "honest.py")
    text = CORRECT.read_text() + "\n\n" + (FIXTURES / "hostile" / "os_routes.py").read_text()
    for old, new in {"PACKAGE_DIR": str(package_dir), "CONFIG_PATH": str(config),
                     "CLASS_DIR": str(subs), "RESULTS_DIR": str(tmp_path / "out"),
                     "CANARY_PATH": str(tmp_path / "canary"), "MARK": mark, "PORT": "1"}.items():
        text = text.replace(old, new)
    (subs / "hostile.py").write_text(text)
    return config, subs


def _mark():
    return f"inst{os.getpid() % 100000}{int(time.time() * 1000) % 100000}"


def _grade_class(script, tmp_path, package_dir, *args, env=None):
    mark = _mark()
    config, subs = _setting(tmp_path, package_dir, mark)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    grades = out / "grades.csv"
    proc = subprocess.run([str(script), "grade", str(subs), "--config", str(config), "--csv",
                           str(grades), "--jobs", "2", "--summary", str(out / "summary.json"),
                           *args], capture_output=True, text=True, timeout=600,
                          env=env or _env(), cwd=tmp_path)
    rows = ({r["student"]: r for r in csv.DictReader(open(grades, newline=""))}
            if grades.exists() else {})
    return proc, rows, mark


def _assert_contained(proc, rows, mode):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert rows["honest"]["score"] == rows["honest"]["max_score"], rows["honest"]
    assert rows["honest"]["isolation"] == mode
    hostile = rows["hostile"]
    assert hostile["isolation"] == mode
    # the reference, the hidden seed, the installed grader, the classmates: no route earns a mark
    for route in ("softmax_forward", "relu_forward", "gelu_forward", "cross_entropy_forward"):
        assert float(hostile[route]) == 0, (route, hostile)
    assert f"isolation: {sandbox.DESCRIPTION[mode]}" in proc.stdout


# --- the console script, wherever the interpreter lives ------------------------------------------

def _grade_hostile_file(script, tmp_path, package):
    """``numpytfmr grade hostile.py --config ... --json ...`` by ``script``: the results."""
    config, subs = _setting(tmp_path, package, _mark())
    out = tmp_path / "results.json"
    proc = subprocess.run([str(script), "grade", str(subs / "hostile.py"), "--config",
                           str(config), "--json", str(out)], capture_output=True, text=True,
                          timeout=300, env=_env())
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["extra_data"]["isolation"] == "bubblewrap" and "warning" not in proc.stderr
    passed = {t["name"].split(" ")[0]: t["status"] == "passed" for t in results["tests"]}
    for route in ("softmax_forward", "relu_forward", "gelu_forward", "cross_entropy_forward"):
        assert not passed[route], route
    assert f"isolation: {sandbox.DESCRIPTION['bubblewrap']}" in proc.stdout


def test_the_console_script_of_a_copies_venv_grades_in_the_sandbox(copies_venv, tmp_path):
    site = copies_venv.parent.parent / "lib" / f"python{VERSION}" / "site-packages"
    _grade_hostile_file(copies_venv, tmp_path, site / "numpytfmr")
    check = subprocess.run([str(copies_venv.parent / "python"), "-m", "numpytfmr.grading",
                            "--check"], capture_output=True, text=True, timeout=300, env=_env())
    assert check.returncode == 0 and "bubblewrap sandbox" in check.stdout, check.stderr
    assert f"the console script {copies_venv} passes too" in check.stdout


def test_the_console_script_of_a_pyenv_install_in_roots_home_grades_in_the_sandbox(pyenv_layout,
                                                                                   tmp_path):
    site = pyenv_layout.parent.parent / "lib" / f"python{VERSION}" / "site-packages"
    _grade_hostile_file(pyenv_layout, tmp_path, site / "numpytfmr")


def test_where_the_submissions_user_cannot_run_python_mode_user_is_refused_in_one_line(
        pyenv_layout, tmp_path):
    """The interpreter lies in a folder only root may enter: mode user cannot start it, and
    says so at start-up instead of failing every submission."""
    shutil.copy(CORRECT, tmp_path / "homework.py")
    proc = subprocess.run([str(pyenv_layout), "grade", str(tmp_path / "homework.py"), "--only",
                           "relu", "--isolation", "user"], capture_output=True, text=True,
                          timeout=300, env=_env())
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "cannot run the interpreter" in proc.stderr and "is not searchable" in proc.stderr


def _fake_bwrap(tmp_path):
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    return _env(PATH=f"{fake}:/usr/local/bin:/usr/bin:/bin")


def test_without_bubblewrap_auto_refuses_where_user_ids_alone_would_not_hold(copies_venv, tmp_path):
    """bwrap fails and the reference lies where every user can read it (or the interpreter
    where they cannot run it): grade refuses, in one line, saying what to install."""
    shutil.copy(CORRECT, tmp_path / "homework.py")
    env = _fake_bwrap(tmp_path)
    proc = subprocess.run([str(copies_venv), "grade", str(tmp_path / "homework.py"), "--only",
                           "relu"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "apt-get install bubblewrap" in proc.stderr and "--isolation" in proc.stderr
    check = subprocess.run([str(copies_venv.parent / "python"), "-m", "numpytfmr.grading",
                            "--check"], capture_output=True, text=True, timeout=300, env=env)
    assert check.returncode == 1 and "cannot be isolated" in check.stderr


# --- mode user, with a Python every user may run -----------------------------------------------------

def test_auto_falls_back_to_user_ids_only_where_the_probe_finds_nothing_readable(open_venv):
    """bwrap fails; the reference is root's alone. While the class and the config are readable
    by every user, grade refuses; once they are not, it grades with user IDs and no route
    earns a mark."""
    top = Path(tempfile.mkdtemp(prefix="numpytfmr-fallback-"))
    try:
        top.chmod(0o755)
        env = _fake_bwrap(top)
        env["PYTHONPATH"] = str(open_venv["private"])
        package = open_venv["private"] / "numpytfmr"
        proc, rows, _ = _grade_class(open_venv["script"], top, package, env=env)
        assert proc.returncode == 2 and not rows, proc.stdout[-2000:]
        assert "can read" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        for path in (top / "class", top / "autograder"):
            path.chmod(0o700)
        shutil.rmtree(top / "out")
        (top / "out").mkdir()
        run = subprocess.run([str(open_venv["script"]), "grade", str(top / "class"), "--config",
                              str(top / "autograder" / "grading.json"), "--csv",
                              str(top / "out" / "grades.csv"), "--jobs", "2"],
                             capture_output=True, text=True, timeout=600, env=env, cwd=top)
        rows = {r["student"]: r for r in csv.DictReader(open(top / "out" / "grades.csv",
                                                            newline=""))}
        _assert_contained(run, rows, "user")
        assert "warning" in run.stderr and "bwrap" in run.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _uid_submission(path, mark):
    """A submission that reports its user ID in a visible message and leaves files in the
    world-writable folders, /run/lock among them."""
    path.write_text(CORRECT.read_text() + f'''

import os as _os


def relu_forward(x):
    for folder in ("/run/lock", "/var/tmp", "/tmp", "/dev/shm"):
        try:
            with open(folder + "/{mark}-" + str(_os.getuid()), "w") as f:
                f.write("left behind")
        except OSError:
            pass
    raise ValueError("UID=" + str(_os.getuid()) + "=")
''')


@pytest.mark.parametrize("mode", ["user", "bubblewrap"])
def test_each_submission_has_a_user_id_of_its_own_and_leaves_nothing(open_venv, tmp_path, mode):
    mark = _mark()
    subs = tmp_path / "class"
    subs.mkdir(mode=0o700)
    for name in ("a", "b"):
        _uid_submission(subs / f"{name}.py", mark)
    grades = tmp_path / "grades.csv"
    env = _env(PYTHONPATH=str(open_venv["private"]))
    proc = subprocess.run([str(open_venv["python"]), "-m", "numpytfmr", "grade", str(subs),
                           "--only", "relu", "--csv", str(grades), "--jobs", "1",
                           "--isolation", mode], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    uids = {}
    for name in ("a", "b"):
        results = (tmp_path / "grades_results" / name / "results.json").read_text()
        uids[name] = set(map(int, re.findall(r"UID=(\d+)=", results)))
        assert len(uids[name]) == 1, results[:2000]          # one user ID per submission
    every = [u for s in uids.values() for u in s]
    assert len(set(every)) == 2 and all(u >= sandbox.UID_BASE for u in every), uids
    if mode == "user":
        left = [p for folder in ("/run/lock", "/var/tmp", "/tmp", "/dev/shm")
                for p in Path(folder).glob(f"{mark}-*")]
        assert not left, f"left behind: {left}"
    for uid in every:
        assert not _survivors(uid=uid), f"a process of {uid} survived"


def test_world_writable_folders_are_found_not_listed(tmp_path):
    """The folders whose leftovers are removed come from a walk of the filesystem: a new
    world-writable folder every user can reach is among them."""
    top = Path(tempfile.mkdtemp(prefix="numpytfmr-ww-"))
    try:
        top.chmod(0o755)
        inner = top / "a" / "b"
        inner.mkdir(parents=True)
        for p in (top / "a", inner):
            p.chmod(0o755)
        inner.chmod(0o1777)
        sandbox.world_writable_folders.cache_clear()
        found = sandbox.world_writable_folders()
        assert str(inner) in found and "/tmp" in found
        if Path("/run/lock").is_dir() and stat.S_IMODE(os.stat("/run/lock").st_mode) & 0o002:
            assert "/run/lock" in found
        (inner / "left").write_text("x")
        os.chown(inner / "left", 2 ** 31 + 12345, 2 ** 31 + 12345)
        sandbox.remove_files_of(2 ** 31 + 12345)
        assert not (inner / "left").exists()
    finally:
        sandbox.world_writable_folders.cache_clear()
        shutil.rmtree(top, ignore_errors=True)


ROUTES = ("softmax", "relu", "gelu", "log_softmax", "layernorm", "rmsnorm", "linear",
          "cross_entropy", "attention", "dpo_loss")


def test_a_hostile_class_in_mode_user_gets_nothing_through(open_venv):
    """Every route of os_routes.py but the network (mode user keeps it), with a user ID per
    submission: the reference and the config (root only), the installed grader, another
    process's memory, outliving grading, a fork bomb, a file left in /dev/shm, the classmates
    and the grades, a root-owned canary through a link."""
    top = Path(tempfile.mkdtemp(prefix="numpytfmr-userclass-"))
    mark = _mark()
    try:
        top.chmod(0o755)
        (top / "autograder").mkdir(mode=0o700)
        config = top / "autograder" / "grading.json"
        config.write_text(json.dumps({"assignment": "homework", "seed": 0, "hidden_seed": 7,
                                      "timeout": 10, "float32_case": False,
                                      "functions": [{"name": op, "cases": [0]} for op in ROUTES]}))
        canary = top / "canary.txt"
        canary.write_text("root's")
        canary.chmod(0o600)
        subs = top / "class"
        subs.mkdir(mode=0o700)
        shutil.copy(CORRECT, subs / "honest.py")
        package = open_venv["private"] / "numpytfmr"
        text = CORRECT.read_text() + "\n\n" + (FIXTURES / "hostile" / "os_routes.py").read_text()
        for old, new in {"PACKAGE_DIR": str(package), "CONFIG_PATH": str(config),
                         "CLASS_DIR": str(subs), "RESULTS_DIR": str(top / "out"),
                         "CANARY_PATH": str(canary), "MARK": mark, "PORT": "1"}.items():
            text = text.replace(old, new)
        (subs / "hostile.py").write_text(text)
        (top / "out").mkdir()
        grader = package / "grading" / "compare.py"
        before = {p: p.read_bytes() for p in (config, canary, subs / "honest.py", grader)}
        proc = subprocess.run([str(open_venv["script"]), "grade", str(subs), "--config",
                               str(config), "--csv", str(top / "out" / "grades.csv"), "--jobs",
                               "2", "--isolation", "user"], capture_output=True, text=True,
                              timeout=600, cwd=top,
                              env=_env(PYTHONPATH=str(open_venv["private"])))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        rows = {r["student"]: r for r in csv.DictReader(open(top / "out" / "grades.csv",
                                                            newline=""))}
        assert rows["honest"]["score"] == rows["honest"]["max_score"], rows["honest"]
        hostile = rows["hostile"]
        assert hostile["isolation"] == "user"
        for route in ("softmax_forward", "relu_forward", "gelu_forward", "log_softmax_forward",
                      "rmsnorm_forward", "cross_entropy_forward", "dpo_loss_forward"):
            assert float(hostile[route]) == 0, (route, hostile)
        for path, data in before.items():
            assert path.read_bytes() == data, f"{path} was changed"
        assert not _survivors(mark), "a process of the submission outlived grading"
        assert not Path("/dev/shm", mark).exists(), "a file was left in /dev/shm"
    finally:
        shutil.rmtree(top, ignore_errors=True)
