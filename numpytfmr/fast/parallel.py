"""The fast path's elementwise and row-wise passes on several threads.

NumPy releases the interpreter lock inside a ufunc's loop over a large array, so two Python
threads that each run a pass over half of the rows run on two cores. The fast kernels
hand their work to :func:`run` as independent parts (row blocks of a LayerNorm, blocks of
the GELU, the attention of a pair of sequences, pieces of the AdamW update); the calling
thread does the first part and a pool of ``workers() - 1`` threads, made once, the rest.

Each part computes exactly what the one-thread pass computes for its rows (every row, and
every element, goes through the same operations in the same order whatever the split), so
the results do not depend on the number of workers, bit for bit. Reductions over rows (the
gradients of a bias or a gain, the gradient norm) are left to BLAS in the calling thread,
or summed in a fixed order.

The number of workers follows NumPy's BLAS thread count: ``numpytfmr.run.blas``
(``limit_blas_threads``, ``blas_threads``) sets both, and :func:`set_workers` sets it alone.
It is 1 until set: one thread runs every part in turn, with no pool and no hand-over.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["workers", "set_workers", "run", "each", "row_blocks", "for_rows", "MIN_ELEMENTS",
           "SMALL_PRODUCT", "ROW_ALIGN"]

# A pass is split only when it touches at least this many elements: handing a part to
# another thread and waiting for it costs some 20-50 microseconds, a pass over 64 K float32
# elements about as much.
MIN_ELEMENTS = 1 << 16

# OpenBLAS runs a matrix product of at most this many multiply-adds (m k n) in the calling
# thread, whatever its thread count (above it, its own threads share the product, and two
# Python threads calling it at once wait for each other). Attention runs its sequences in
# parallel only while its per-head products stay at or below this size.
SMALL_PRODUCT = 1 << 18

# Row blocks start at multiples of this many rows (whole cache lines of short rows).
ROW_ALIGN = 16

_STATE = {"workers": 1, "pool": None}
_LOCAL = threading.local()
_LOCK = threading.Lock()


def workers():
    """How many threads the fast passes use (1: the calling thread only)."""
    return _STATE["workers"]


def set_workers(n):
    """Use ``n`` threads for the fast passes from now on; returns the previous number.
    The pool of ``n - 1`` threads is made here (once per count), not per call."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_workers: n is {n!r}; expected an integer >= 1")
    with _LOCK:
        previous = _STATE["workers"]
        if n != previous:
            old = _STATE["pool"]
            _STATE["pool"] = (ThreadPoolExecutor(n - 1, thread_name_prefix="numpytfmr-fast")
                              if n > 1 else None)
            _STATE["workers"] = n
            if old is not None:
                old.shutdown(wait=True)
    return previous


def _serially(fn, parts):
    for part in parts:
        fn(*part)


def _in_part(fn, part):
    _LOCAL.busy = True
    try:
        return fn(*part)
    finally:
        _LOCAL.busy = False


def run(fn, parts):
    """``fn(*part)`` for every part (a list of argument tuples), the first in this thread and
    the others on the pool; returns when all are done (the first exception is raised after
    every part has finished). A part that itself calls :func:`run` runs its parts in turn."""
    pool = _STATE["pool"]
    if pool is None or len(parts) < 2 or getattr(_LOCAL, "busy", False):
        _serially(fn, parts)
        return
    futures = [pool.submit(_in_part, fn, part) for part in parts[1:]]
    error = None
    try:
        _in_part(fn, parts[0])
    except BaseException as exc:          # noqa: BLE001 - re-raised once the others finish
        error = exc
    for f in futures:
        try:
            f.result()
        except BaseException as exc:      # noqa: BLE001
            error = error or exc
    if error is not None:
        raise error


def each(n_items, fn, parallel=True):
    """``fn(i, w)`` for i in range(n_items), item i on worker w = i mod k (k workers; each
    worker takes its items in order, so ``w`` can name its scratch arrays)."""
    k = min(workers(), n_items) if parallel else 1
    if k <= 1 or getattr(_LOCAL, "busy", False):
        for i in range(n_items):
            fn(i, 0)
        return

    def part(w):
        for i in range(w, n_items, k):
            fn(i, w)
    run(part, [(w,) for w in range(k)])


def row_blocks(n, k, align=None):
    """k (or fewer) ranges (a, b) covering 0..n, their edges multiples of ``align``
    (default :data:`ROW_ALIGN`)."""
    align = ROW_ALIGN if align is None else align
    if k <= 1 or n <= align:
        return [(0, n)]
    size = -(-n // k)
    size = -(-size // align) * align
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def for_rows(fn, n, width=1, min_elements=None):
    """``fn(a, b)`` over row blocks covering 0..n, one block per worker when the pass is
    large enough (n x width elements at least ``min_elements``, default
    :data:`MIN_ELEMENTS`), else ``fn(0, n)`` in this thread."""
    k = workers()
    limit = MIN_ELEMENTS if min_elements is None else min_elements
    if k <= 1 or n * width < limit or getattr(_LOCAL, "busy", False):
        fn(0, n)
        return
    run(fn, row_blocks(n, k))
