"""NumPy's BLAS: how many threads it uses, and what it is.

The training commands, ``generate`` and ``numpytfmr bench`` run NumPy's BLAS with one
thread by default (``--threads``): the matrices of these small models (64 x 256) are far
too small to share between threads, and with both cores of a small machine busy a
multithreaded OpenBLAS spends most of its time waiting.

The count is set through threadpoolctl (``pip install "numpytfmr[threads]"``), which knows
OpenBLAS, MKL and BLIS. Without it the count is what the standard environment variables
said when NumPy loaded (``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OMP_NUM_THREADS``),
and :func:`limit_blas_threads` changes nothing: set them before starting, e.g.
``OPENBLAS_NUM_THREADS=1 numpytfmr train``.

The same count of threads runs the fast path's elementwise and row-wise passes
(``numpytfmr.fast.parallel``: LayerNorm, GELU, softmax and attention per pair of sequences,
AdamW in row blocks): :func:`limit_blas_threads` and :func:`blas_threads` set it too, with or
without threadpoolctl.

Which of OpenBLAS's kernel sets runs (it picks one per CPU when it loads) is the library's
business: ``OPENBLAS_CORETYPE`` set before NumPy loads chooses another, and
``numpytfmr bench --blas-coretype`` measures what that changes on the training step.
"""
import os
from contextlib import contextmanager

import numpy as np

from ..fast import parallel

__all__ = ["limit_blas_threads", "blas_threads", "blas_info", "THREAD_VARIABLES"]

# The variables BLAS libraries read when they load (NumPy's OpenBLAS reads the first).
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")


def _controller():
    """threadpoolctl's view of the BLAS libraries loaded in this process, or None."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    blas = ThreadpoolController().select(user_api="blas")
    return blas if blas.lib_controllers else None


def limit_blas_threads(n):
    """Make the BLAS library NumPy uses run ``n`` threads from now on.

    Returns the number it used before, or None when the count cannot be changed while the
    program runs (threadpoolctl is not installed, or it finds no BLAS); the environment
    variables of :data:`THREAD_VARIABLES`, read when NumPy loaded, then decide. Prefer the
    context manager :func:`blas_threads`, which restores the previous number.
    The fast path's passes run on ``n`` threads from now on in either case
    (``fast.parallel.set_workers``).
    """
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"limit_blas_threads: n is {n!r}; expected an integer >= 1")
    parallel.set_workers(int(n))
    blas = _controller()
    if blas is None:
        return None
    previous = max(c.num_threads for c in blas.lib_controllers)
    blas.limit(limits=int(n))
    return previous


@contextmanager
def blas_threads(n):
    """``with blas_threads(1): ...`` runs the block with ``n`` BLAS threads (see
    :func:`limit_blas_threads`) and restores the previous number afterwards (and the fast
    path's previous number of workers)."""
    workers = parallel.workers()
    previous = limit_blas_threads(n)
    try:
        yield previous
    finally:
        if previous is not None:
            limit_blas_threads(previous)
        parallel.set_workers(workers)


def blas_info():
    """What NumPy's BLAS is: ``{"library", "version", "architecture", "threads",
    "controlled"}``; ``architecture`` is OpenBLAS's kernel set ("Haswell", "SkylakeX", ...).
    ``controlled`` says whether threadpoolctl can change the thread count; without it the
    other fields come from the environment and are None where unknown."""
    blas = _controller()
    if blas is None:
        threads = next((os.environ[v] for v in THREAD_VARIABLES if os.environ.get(v)), None)
        return {"library": None, "version": None, "architecture": os.environ.get("OPENBLAS_CORETYPE"),
                "threads": int(threads) if threads and threads.isdigit() else None, "controlled": False}
    c = blas.lib_controllers[0]
    return {"library": c.internal_api, "version": c.version,
            "architecture": getattr(c, "architecture", None), "threads": c.num_threads,
            "controlled": True}
