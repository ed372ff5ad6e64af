"""numpytfmr/run/blas.py: NumPy's BLAS threads through threadpoolctl, and the fallback to
the environment variables read when NumPy loads. No ctypes into the BLAS library."""
import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

from numpytfmr.run import blas
from numpytfmr.run.blas import blas_info, blas_threads, limit_blas_threads

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_blas_threads_restores_the_previous_number():
    pytest.importorskip("threadpoolctl", reason="the test extra installs threadpoolctl")
    before = limit_blas_threads(2)
    assert before is not None, "threadpoolctl finds no BLAS under NumPy"
    try:
        with blas_threads(1) as previous:
            assert previous == 2
            assert blas_info()["threads"] == 1
            assert limit_blas_threads(1) == 1            # inside: one thread
        assert limit_blas_threads(before) == 2           # restored on the way out
    finally:
        limit_blas_threads(before)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="limit_blas_threads: n is"):
            limit_blas_threads(bad)


def test_the_fast_passes_follow_the_blas_thread_count_and_are_restored():
    """limit_blas_threads(n) gives the fast path's passes n workers (with or without
    threadpoolctl); blas_threads gives back the workers it found."""
    from numpytfmr.fast import parallel
    before = parallel.set_workers(1)
    try:
        with blas_threads(3):
            assert parallel.workers() == 3
            limit_blas_threads(2)
            assert parallel.workers() == 2
        assert parallel.workers() == 1
    finally:
        parallel.set_workers(before)


def test_info_names_the_library_its_kernel_set_and_threads():
    pytest.importorskip("threadpoolctl", reason="the test extra installs threadpoolctl")
    info = blas_info()
    assert info["controlled"] is True
    assert info["library"] in ("openblas", "mkl", "blis", "flexiblas")
    assert isinstance(info["threads"], int) and info["threads"] >= 1
    if info["library"] == "openblas":
        assert isinstance(info["architecture"], str) and info["architecture"]


def test_without_threadpoolctl_the_environment_decides_and_nothing_changes():
    """threadpoolctl hidden: limit_blas_threads changes nothing and says so (None); the
    thread variables set before NumPy loaded are what the library runs."""
    script = (
        "import sys, json\n"
        "sys.modules['threadpoolctl'] = None\n"          # an import of it now fails
        "from numpytfmr.run.blas import limit_blas_threads, blas_info\n"
        "from numpytfmr.fast import parallel\n"
        "print(json.dumps([limit_blas_threads(2), blas_info(), parallel.workers()]))\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "3"}
    # an image may need OPENBLAS_CORETYPE to start OpenBLAS at all: it is passed on, and the
    # kernel set reported is the one it names (None where it is unset)
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True)
    previous, info, workers = json.loads(out.stdout)
    assert previous is None and workers == 2          # the fast passes follow all the same
    assert info == {"library": None, "version": None, "architecture": coretype or None,
                    "threads": 3, "controlled": False}


def test_no_ctypes_into_the_blas_library_anywhere_in_the_package():
    """No module loads the BLAS library itself: no ``ctypes`` beside a mention of BLAS, none
    of OpenBLAS's own symbols, no search of the process's mapped libraries."""
    offenders = []
    for path in (REPO / "numpytfmr").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        uses_ctypes = any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
            (a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0] == "ctypes"
            for a in n.names) for n in ast.walk(tree))
        if uses_ctypes and ("blas" in text.lower() or "lapack" in text.lower()) and \
                "CDLL(" in text and "openblas" in text.split("CDLL(", 1)[1][:200].lower():
            offenders.append(f"{path.relative_to(REPO)}: loads the BLAS library with ctypes")
        for word in ("gotoblas_", "openblas_set_num_threads", "/proc/self/maps"):
            if word in text:
                offenders.append(f"{path.relative_to(REPO)}: {word}")
    assert not offenders, offenders


def test_the_blas_module_keeps_no_kernel_switch():
    assert not [n for n in dir(blas) if "kernel" in n.lower()]
