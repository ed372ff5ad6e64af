"""Files written atomically: to a temporary name in the same folder, then renamed.

An interrupted run therefore leaves either the old file or the new one, never half of one.
Every file gets the mode the umask gives a new file (0o644 under umask 022, 0o600 under 077).
"""
from contextlib import contextmanager
import json
import math
import os
import secrets

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_text", "write_json", "write_summary", "save_arrays",
           "load_arrays"]


def _new_temporary(folder, name):
    """A new empty file ``.tmp-<random>-<name>`` in ``folder``, opened for writing:
    ``(fd, path)``. It is created with ``os.open(..., 0o666)``, so the kernel gives it the
    mode every new file gets, 0o666 less the umask (and a directory's default ACL), as
    ``open(path, "w")`` would; the umask itself is never read or changed (changing it to
    read it would race with other threads)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = os.path.join(folder, f".tmp-{secrets.token_hex(6)}-{name}")
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"atomic_write_bytes: no free temporary name in {folder}")


@contextmanager
def atomic_file(path):
    """A binary file to write ``path``'s new contents into, piece by piece: it is a temporary
    file in the same folder, flushed and renamed over ``path`` (``os.replace``) when the
    ``with`` block ends normally, and removed when it raises, so ``path`` never holds a
    half-written file.

    The file gets the mode the umask gives a new file (0o644 under umask 022, 0o600
    under 077), whether or not ``path`` existed before.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = _new_temporary(folder, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path, data):
    """Write ``data`` to ``path`` atomically (:func:`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_text(path, text):
    atomic_write_bytes(path, text.encode("utf-8"))


def _plain(obj):
    """Make NumPy scalars and arrays JSON-friendly; non-finite floats become null."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def write_json(path, obj):
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_text(path, json.dumps(_plain(obj), indent=2, sort_keys=False) + "\n")


def write_summary(path, metrics):
    """Write a command's final metrics as one JSON object (the ``--summary FILE`` option)."""
    if not isinstance(metrics, dict):
        raise TypeError(f"write_summary: metrics is a {type(metrics).__name__}; expected a dict")
    write_json(path, metrics)


def save_arrays(path, arrays):
    """Save a flat ``dict[str, ndarray]`` to an ``.npz``, atomically (no pickles)."""
    import io
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    atomic_write_bytes(path, buf.getvalue())


def load_arrays(path):
    """Load an ``.npz`` written by :func:`save_arrays` into a dict (``allow_pickle=False``)."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
