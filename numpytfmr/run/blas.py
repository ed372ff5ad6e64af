"""NumPy's BLAS, set while the program runs: its number of threads (the training commands,
the notebooks and ``numpytfmr bench`` use it; see :func:`limit_blas_threads`) and, for
OpenBLAS, which of its kernel sets does the products (:func:`choose_blas_kernels`)."""
from contextlib import contextmanager
import ctypes
import functools
import os
import time

import numpy as np

__all__ = ["limit_blas_threads", "blas_threads", "blas_kernels", "openblas_kernels",
           "choose_blas_kernels", "preferred_blas_kernels", "set_blas_kernels", "kept_blas_kernels",
           "tuned_blas"]


def _openblas_libraries():
    """Every OpenBLAS library loaded in this process, as ``ctypes.CDLL`` objects."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:                  # not Linux: nothing to find this way
        return []
    libs = []
    for path in sorted(paths):
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            continue
    return libs


def _openblas_functions():
    """``(set_num_threads, get_num_threads)`` pairs of every OpenBLAS loaded in this process."""
    found = []
    for lib in _openblas_libraries():
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


# ---------------------------------------------------------------------------------------
# OpenBLAS's kernel sets
# ---------------------------------------------------------------------------------------

# An OpenBLAS built for every x86 CPU (DYNAMIC_ARCH, as NumPy's wheels are) carries one
# kernel set per CPU family and picks one when it loads, by the instructions the CPU has.
# A CPU with AVX-512 gets the SkylakeX set. AMD's Zen 4 (family 25 with AVX-512) runs
# 512-bit operations in two 256-bit halves, and there OpenBLAS's AVX2 set (Haswell's, the
# one it uses for the other Zen CPUs) is about 10 % faster on a transformer's float32
# products. What may replace the set OpenBLAS chose: the AVX2 set, for the AVX-512 ones
# (every CPU with AVX-512 has AVX2 and FMA).
_ALTERNATIVES = {"SapphireRapids": ("Haswell",), "Cooperlake": ("Haswell",),
                 "SkylakeX": ("Haswell",)}
# the set OpenBLAS chose when it loaded, per library, remembered at the first change
_CHOSEN_BY_OPENBLAS = {}


def _cpu():
    """(vendor, family) of the first CPU in /proc/cpuinfo, or (None, None)."""
    vendor = family = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id":
                    vendor = value.strip()
                elif key == "cpu family":
                    family = int(value)
                if vendor is not None and family is not None:
                    break
    except (OSError, ValueError):
        pass
    return vendor, family


@functools.lru_cache(maxsize=1)
def _kernel_library():
    """The loaded OpenBLAS whose kernel set can be changed (DYNAMIC_ARCH), or None; looked
    up once (NumPy, imported above, has loaded its BLAS for good)."""
    for lib in _openblas_libraries():
        if all(hasattr(lib, f) for f in ("gotoblas_corename", "gotoblas_dynamic_init",
                                          "gotoblas_dynamic_quit")):
            lib.gotoblas_corename.restype = ctypes.c_char_p
            return lib
    return None


def blas_kernels():
    """The name of the kernel set OpenBLAS is using ("SkylakeX", "Haswell", ...), or None
    when NumPy's BLAS is not a DYNAMIC_ARCH OpenBLAS."""
    lib = _kernel_library()
    return None if lib is None else lib.gotoblas_corename().decode()


def openblas_kernels():
    """The kernel set OpenBLAS chose when it loaded (None without a DYNAMIC_ARCH OpenBLAS)."""
    lib = _kernel_library()
    return None if lib is None else _CHOSEN_BY_OPENBLAS.get(lib._name, blas_kernels())


def set_blas_kernels(name):
    """Make OpenBLAS use the kernel set ``name`` from now on; returns the set it used before.

    Only sets the CPU runs are accepted: the one OpenBLAS chose and, on an AVX-512 CPU, the
    AVX2 set ("Haswell"). Call it while no other thread is in a BLAS call (OpenBLAS
    re-initialises its tables; ``OPENBLAS_CORETYPE`` is how it learns the name).
    """
    lib = _kernel_library()
    if lib is None:
        raise ValueError("set_blas_kernels: NumPy's BLAS is not an OpenBLAS with several "
                         "kernel sets (DYNAMIC_ARCH); nothing to choose")
    current = lib.gotoblas_corename().decode()
    first = _CHOSEN_BY_OPENBLAS.setdefault(lib._name, current)
    allowed = (first,) + _ALTERNATIVES.get(first, ())
    if not isinstance(name, str) or name.lower() not in {a.lower() for a in allowed}:
        raise ValueError(f"set_blas_kernels: name is {name!r}; expected one of {list(allowed)} "
                         "(the kernel set OpenBLAS chose for this CPU, or one the CPU also runs)")
    if name.lower() == current.lower():
        return current
    before = os.environ.get("OPENBLAS_CORETYPE")
    os.environ["OPENBLAS_CORETYPE"] = name
    try:
        lib.gotoblas_dynamic_quit()
        lib.gotoblas_dynamic_init()
    finally:
        if before is None:
            del os.environ["OPENBLAS_CORETYPE"]
        else:
            os.environ["OPENBLAS_CORETYPE"] = before
    return current


def _products_seconds(rng):
    """CPU seconds of a transformer's typical float32 products: a projection (1024 x 256)
    (256 x 1024) and per-head scores (64 x (128 x 32) (32 x 128)), best of a few runs."""
    a = rng.standard_normal((1024, 256), dtype=np.float32)
    b = rng.standard_normal((256, 1024), dtype=np.float32)
    q = rng.standard_normal((64, 128, 32), dtype=np.float32)
    out, s, o = (np.empty((1024, 1024), np.float32), np.empty((64, 128, 128), np.float32),
                 np.empty((64, 128, 32), np.float32))
    best = float("inf")
    for _ in range(6):
        t0 = time.process_time()
        np.matmul(a, b, out=out)
        np.matmul(q, q.swapaxes(-1, -2), out=s)
        np.matmul(s, q, out=o)
        best = min(best, time.process_time() - t0)
    return best


def preferred_blas_kernels():
    """The kernel set this CPU should use: "Haswell" (AVX2) on an AMD Zen 4 where OpenBLAS
    chose an AVX-512 set, else OpenBLAS's own choice (None without a DYNAMIC_ARCH OpenBLAS).
    A rule, not a measurement, so that every run of a training command on a machine does
    the same arithmetic (a resumed run continues bit for bit)."""
    lib = _kernel_library()
    if lib is None:
        return None
    chosen = openblas_kernels()
    if _cpu() == ("AuthenticAMD", 25) and "Haswell" in _ALTERNATIVES.get(chosen, ()):
        return "Haswell"
    return chosen


def choose_blas_kernels(*, measure=False):
    """Use :func:`preferred_blas_kernels`, unless ``OPENBLAS_CORETYPE`` is set (the user's
    choice, left alone). With ``measure``, also time every set the CPU runs on a
    projection (1024 x 256) (256 x 1024) and a batch of per-head products (about 0.2 s).

    Returns ``{"chosen_by_openblas", "used", "seconds": {name: s}}``, or None without a
    DYNAMIC_ARCH OpenBLAS (MKL, Accelerate, a single-target build).
    """
    lib = _kernel_library()
    if lib is None:
        return None
    first = openblas_kernels()
    report = {"chosen_by_openblas": first, "used": blas_kernels(), "seconds": {}}
    if measure:
        rng = np.random.default_rng(0)
        for name in (first,) + _ALTERNATIVES.get(first, ()):
            set_blas_kernels(name)
            report["seconds"][name] = _products_seconds(rng)
        set_blas_kernels(report["used"])
    if not os.environ.get("OPENBLAS_CORETYPE"):
        set_blas_kernels(preferred_blas_kernels())
    report["used"] = blas_kernels()
    return report


@contextmanager
def kept_blas_kernels():
    """``with kept_blas_kernels() as before: ...``: whatever the block does to OpenBLAS's
    kernel set, it is ``before`` again afterwards (None without a DYNAMIC_ARCH OpenBLAS)."""
    before = blas_kernels()
    try:
        yield before
    finally:
        if before is not None and blas_kernels() != before:
            set_blas_kernels(before)


@contextmanager
def tuned_blas(threads):
    """``with tuned_blas(1): ...``: ``threads`` BLAS threads and the preferred kernel set
    (:func:`choose_blas_kernels`) inside the block; both as they were afterwards. Yields the
    report of the kernel choice."""
    with blas_threads(threads), kept_blas_kernels():
        yield choose_blas_kernels()
