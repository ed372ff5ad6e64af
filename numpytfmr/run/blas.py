"""The number of threads of NumPy's BLAS, set while the program runs (the training
commands, the notebooks and ``numpytfmr bench`` use it; see :func:`limit_blas_threads`)."""
from contextlib import contextmanager
import ctypes

import numpy as np

__all__ = ["limit_blas_threads", "blas_threads"]


def _openblas_functions():
    """``(set_num_threads, get_num_threads)`` pairs of every OpenBLAS loaded in this process."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:                  # not Linux: nothing to find this way
        return []
    found = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("openblas", ""), ("scipy_openblas", "64_"), ("openblas", "64_"),
                               ("scipy_openblas", "")):
            setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            if setter is not None and getter is not None:
                getter.restype = ctypes.c_int
                found.append((setter, getter))
                break
    return found


def limit_blas_threads(n):
    """Ask the BLAS library NumPy uses (OpenBLAS) to use ``n`` threads.

    Returns the number of threads it used before, or None when no OpenBLAS was found (MKL,
    Accelerate and other builds are left alone). Prefer the context manager
    :func:`blas_threads`, which restores the previous number.

    Why: the matrices of these small models (64 x 256) are far too small to share
    between threads. With both cores of a small machine busy, a multithreaded OpenBLAS
    spends most of its time waiting, and a training step gets several times slower than
    with one thread. ``OPENBLAS_NUM_THREADS`` works only before NumPy is imported, so this
    calls OpenBLAS's own setter, found among the loaded libraries.
    """
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"limit_blas_threads: n is {n!r}; expected an integer >= 1")
    previous = None
    for setter, getter in _openblas_functions():
        previous = int(getter())
        setter(ctypes.c_int(n))
    return previous


@contextmanager
def blas_threads(n):
    """``with blas_threads(1): ...`` runs the block with ``n`` BLAS threads (see
    :func:`limit_blas_threads`) and restores the previous number afterwards."""
    previous = limit_blas_threads(n)
    try:
        yield previous
    finally:
        if previous is not None:
            limit_blas_threads(previous)
