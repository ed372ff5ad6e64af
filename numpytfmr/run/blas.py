"""NumPy's BLAS: how many threads it uses, and what it is.

The count is set through threadpoolctl (the ``threads`` extra), which knows OpenBLAS, MKL and
BLIS; without it the count is what :data:`THREAD_VARIABLES` said when NumPy loaded, and
:func:`limit_blas_threads` changes nothing. The same count runs the fast path's elementwise
and row-wise passes (``numpytfmr.fast.parallel``), with or without threadpoolctl. Why one
thread by default, and OpenBLAS's kernel sets: docs/commands.md, "BLAS threads".
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
    """Make NumPy's BLAS, and the fast path's passes, run ``n`` threads from now on.

    Returns the BLAS's previous count, or None when it cannot be changed while the program runs
    (no threadpoolctl, or no BLAS found). Prefer :func:`blas_threads`, which restores it.
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
    """``with blas_threads(1): ...`` runs the block with ``n`` threads (see
    :func:`limit_blas_threads`) and restores both previous counts afterwards.
    """
    workers = parallel.workers()
    previous = limit_blas_threads(n)
    try:
        yield previous
    finally:
        if previous is not None:
            limit_blas_threads(previous)
        parallel.set_workers(workers)


def blas_info():
    """What NumPy's BLAS is: ``{"library", "version", "architecture" (OpenBLAS's kernel set),
    "threads", "controlled" (threadpoolctl can change the count)}``; None where unknown."""
    blas = _controller()
    if blas is None:
        threads = next((os.environ[v] for v in THREAD_VARIABLES if os.environ.get(v)), None)
        return {"library": None, "version": None, "architecture": os.environ.get("OPENBLAS_CORETYPE"),
                "threads": int(threads) if threads and threads.isdigit() else None, "controlled": False}
    c = blas.lib_controllers[0]
    return {"library": c.internal_api, "version": c.version,
            "architecture": getattr(c, "architecture", None), "threads": c.num_threads,
            "controlled": True}
