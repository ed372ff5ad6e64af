"""The process that runs a submission: loads it, calls its functions on request, answers.

The grader starts it as ``python -I child.py REQUEST_FD ANSWER_FD`` in a fresh temporary
directory holding ``submission.json`` (the code to run, in chunks: one for a .py file, one
per code cell of a notebook). This file is a standalone script: it imports only the
standard library and NumPy, never numpytfmr.

Messages in both directions are an 8-byte little-endian length followed by an ``.npz``
whose entry ``__meta__`` is a JSON header (uint8) and whose other entries are arrays. The
grader loads answers with ``allow_pickle=False`` and judges everything itself: this process
only runs student code and reports what came back (or what went wrong) honestly.

Student code can replace attributes of NumPy or ``builtins``; the values this script needs
are saved before the submission is loaded and put back after each call, so a monkeypatch
cannot break the answer channel (it still affects the student's own results).
"""
import builtins
import inspect
import io
import json
import linecache
import os
import struct
import sys
import time
import traceback
import types
import zipfile

import numpy as np

_BaseException = BaseException
_NotImplementedError = NotImplementedError
_MemoryError = MemoryError
_isinstance, _type, _len, _str = isinstance, type, len, str
_ndarray, _generic, _matrix = np.ndarray, np.generic, np.matrix

# Packages a submission may not import: the reference itself and autodiff libraries.
BLOCKED = ("numpytfmr", "torch", "jax", "tensorflow", "autograd")
MAX_MESSAGE = 64 << 20           # bytes; larger answers are refused
MAX_ELEMENTS = 4_000_000         # elements of one returned array
STUDENT_MODULE = "submission"


class _Blocker:
    """A meta-path finder, first in ``sys.meta_path``, that refuses the blocked packages."""

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.partition(".")[0]
        if root in BLOCKED:
            what = ("the reference implementation" if root == "numpytfmr"
                    else "an automatic-differentiation library")
            raise ImportError(f"import of {fullname!r} is not allowed in a graded submission: "
                              f"{root} is {what}; write the function with NumPy only",
                              name=fullname)
        return None


def _install_blocker():
    sys.meta_path.insert(0, _Blocker())
    # Drop finders that serve the reference from an editable install, so removing the
    # blocker from sys.meta_path is not enough to reach it.
    def serves_reference(finder):
        names = (getattr(finder, "__module__", ""), _type(finder).__module__,
                 getattr(finder, "__name__", ""), _type(finder).__name__)
        return any("numpytfmr" in str(n) for n in names)
    sys.meta_path[:] = [f for f in sys.meta_path if not serves_reference(f)]
    for name in list(sys.modules):
        if name.partition(".")[0] in BLOCKED:
            del sys.modules[name]


# --- the answer channel, protected from monkeypatching ---------------------------------

_SAVED = []


def _save_modules():
    npyio = sys.modules.get(np.savez.__module__)
    mods = [builtins, np, np.lib.format, zipfile, io, json, os, struct, time, traceback,
            linecache, types, inspect]
    if npyio is not None:
        mods.append(npyio)
    for m in mods:
        _SAVED.append((m, dict(vars(m))))


def _restore():
    for m, saved in _SAVED:
        vars(m).update(saved)


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            raise EOFError("the grader closed the request channel")
        chunks.append(b)
        got += _len(b)
    return b"".join(chunks)


def _write_all(fd, data):
    view = memoryview(data)
    while _len(view):
        n = os.write(fd, view)
        view = view[n:]


def _recv(fd):
    (n,) = struct.unpack("<Q", _read_exact(fd, 8))
    if n > MAX_MESSAGE:
        raise ValueError("request too large")
    with np.load(io.BytesIO(_read_exact(fd, n)), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("__meta__").tobytes().decode("utf-8"))
    return meta, arrays


def _send(fd, meta, arrays=None):
    buf = io.BytesIO()
    header = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    np.savez(buf, __meta__=header, **(arrays or {}))
    data = buf.getvalue()
    if _len(data) > MAX_MESSAGE:
        buf = io.BytesIO()
        np.savez(buf, __meta__=np.frombuffer(json.dumps(
            {"ok": False, "error": {"kind": "too_large",
                                    "message": f"the answer is {_len(data)} bytes; at most "
                                               f"{MAX_MESSAGE} are accepted"}}).encode("utf-8"),
            dtype=np.uint8))
        data = buf.getvalue()
    _write_all(fd, struct.pack("<Q", _len(data)) + data)


# --- values in and out ------------------------------------------------------------------

def _decode(enc, arrays):
    """Rebuild a value encoded by the grader: arrays by key, plain data from JSON."""
    t = enc["t"]
    if t == "none":
        return None
    if t in ("bool", "int", "float", "str"):
        return enc["v"]
    if t == "array":
        a = arrays[enc["k"]]
        return a[()] if enc.get("scalar") else a.copy()
    if t == "list":
        return [_decode(e, arrays) for e in enc["v"]]
    if t == "tuple":
        return tuple(_decode(e, arrays) for e in enc["v"])
    if t == "dict":
        return {k: _decode(e, arrays) for k, e in enc["v"].items()}
    raise ValueError(f"unknown encoding {t!r}")


def _fresh_kwargs(kwargs):
    """Options for one call: an int ``rng`` is a seed, made a new Generator every time."""
    kw = dict(kwargs)
    rng = kw.get("rng")
    if _type(rng) is int:
        kw["rng"] = np.random.default_rng(rng)
    return kw


def _type_name(v):
    t = _type(v)
    mod = getattr(t, "__module__", "") or ""
    return t.__qualname__ if mod in ("builtins", STUDENT_MODULE) else f"{mod}.{t.__qualname__}"


def _describe_value(v, out, prefix, depth=0):
    """A JSON description of a returned value; accepted arrays go into ``out``.

    Only plain ``np.ndarray`` (numeric or bool), NumPy scalars, exact Python numbers,
    None and tuples/lists of those are accepted; anything else is reported by type.
    """
    t = _type(v)
    if v is None:
        return {"kind": "none"}
    if t is _ndarray:
        if v.dtype.kind not in "biuf":
            return {"kind": "refused", "type": "numpy.ndarray", "dtype": _str(v.dtype),
                    "why": f"returned an array of dtype {v.dtype}; expected a numeric array"}
        if v.size > MAX_ELEMENTS:
            return {"kind": "refused", "type": "numpy.ndarray", "shape": list(v.shape),
                    "why": f"returned an array of shape {v.shape} ({v.size} elements); far more "
                           "than expected"}
        key = f"{prefix}"
        out[key] = np.array(v, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        return {"kind": "array", "key": key}
    if _isinstance(v, _matrix):
        return {"kind": "refused", "type": "numpy.matrix",
                "why": "returned np.matrix; expected np.ndarray (np.matrix changes what * and "
                       "indexing mean: use plain arrays and @)"}
    if _isinstance(v, _ndarray):
        return {"kind": "refused", "type": _type_name(v),
                "why": f"returned an object of type {_type_name(v)} (a subclass of np.ndarray); "
                       "expected a plain np.ndarray"}
    if _isinstance(v, _generic) and t.__module__ == "numpy":
        if np.dtype(t).kind not in "biuf":
            return {"kind": "refused", "type": _type_name(v),
                    "why": f"returned a NumPy scalar of type {_type_name(v)}; expected a number"}
        out[prefix] = np.asarray(v)
        return {"kind": "scalar", "key": prefix, "type": _type_name(v)}
    if t in (float, int, bool):
        out[prefix] = np.asarray(v)
        return {"kind": "pyscalar", "key": prefix, "type": t.__name__}
    if t in (tuple, list) and depth < 2:
        if _len(v) > 64:
            return {"kind": "refused", "type": t.__name__,
                    "why": f"returned a {t.__name__} of {_len(v)} items"}
        items = [_describe_value(item, out, f"{prefix}_{i}", depth + 1) for i, item in enumerate(v)]
        return {"kind": t.__name__, "items": items}
    return {"kind": "refused", "type": _type_name(v),
            "why": f"returned an object of type {_type_name(v)}; expected np.ndarray"}


def _copy(obj, depth=0):
    """Copy arrays inside dict/list/tuple containers (other objects are shared)."""
    if depth > 6:
        return obj
    t = _type(obj)
    if _isinstance(obj, _ndarray):
        return obj.copy()
    if t is dict:
        return {k: _copy(v, depth + 1) for k, v in obj.items()}
    if t is list:
        return [_copy(v, depth + 1) for v in obj]
    if t is tuple:
        return tuple(_copy(v, depth + 1) for v in obj)
    return obj


def _same(a, b, depth=0):
    """Whether ``b`` still equals the copy ``a`` (arrays bitwise; others by identity)."""
    if depth > 6:
        return True
    if _isinstance(a, _ndarray):
        return (_isinstance(b, _ndarray) and a.shape == b.shape and a.dtype == b.dtype
                and a.tobytes() == b.tobytes())
    t = _type(a)
    if t is dict:
        return _type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if t in (list, tuple):
        return _type(b) is t and _len(a) == _len(b) and all(
            _same(u, v, depth + 1) for u, v in zip(a, b))
    return a is b


def _error(exc, filenames, elapsed=None):
    """A JSON report of an exception: its type, message and the submission's own frames."""
    try:
        message = _str(exc)
    except _BaseException:
        message = "(the exception's message could not be turned into text)"
    if _len(message) > 2000:
        message = message[:2000] + " ..."
    frames = []
    try:
        for f in traceback.extract_tb(exc.__traceback__):
            if f.filename in filenames:
                frames.append([f.filename, f.lineno, f.name, (f.line or "").strip()[:200]])
    except _BaseException:
        pass
    t = _type(exc)
    if _isinstance(exc, _NotImplementedError):
        kind = "not_implemented"
    elif _isinstance(exc, _MemoryError):
        kind = "memory"
    else:
        kind = "exception"
    report = {"kind": kind, "type": getattr(t, "__name__", "?"), "message": message,
              "frames": frames[-12:], "base": not _isinstance(exc, Exception)}
    if elapsed is not None:
        report["elapsed"] = elapsed
    return report


# --- the submission -----------------------------------------------------------------------

def _load(chunks):
    """Execute the submission's chunks in a fresh module; return (module, error, warnings).

    A .py file is one chunk: an exception there is a load error. A notebook has one chunk per
    code cell: a failing cell is a warning and the next cells still run, as in a notebook.
    """
    module = types.ModuleType(STUDENT_MODULE)
    module.__file__ = chunks[0]["filename"] if chunks else STUDENT_MODULE
    sys.modules[STUDENT_MODULE] = module
    filenames = {c["filename"] for c in chunks}
    warnings = []
    for chunk in chunks:
        source, filename = chunk["source"], chunk["filename"]
        linecache.cache[filename] = (_len(source), None, source.splitlines(True), filename)
        try:
            code = compile(source, filename, "exec")
            exec(code, module.__dict__)
        except _BaseException as exc:  # SystemExit and KeyboardInterrupt included
            _restore()
            report = _error(exc, filenames)
            if _isinstance(exc, SyntaxError):
                report["frames"] = [[filename, exc.lineno, "<module>", (exc.text or "").strip()]]
            if not chunk.get("continue_on_error"):
                return module, report, warnings
            report["where"] = filename
            warnings.append(report)
        _restore()
    return module, None, warnings


def _defined(module):
    names = []
    for name, obj in list(module.__dict__.items()):
        if _type(name) is str and not name.startswith("_") and callable(obj):
            names.append(name)
    return sorted(names)[:2000]


def _arg_names(fn, n):
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except _BaseException:
        params = []
    return [params[i] if i < _len(params) else f"input {i}" for i in range(n)]


class Server:
    """Answers the grader's requests against the loaded submission."""

    def __init__(self, module, filenames, fd_in, fd_out):
        self.module, self.filenames = module, filenames
        self.fd_in, self.fd_out = fd_in, fd_out
        self.caches = {}           # id -> pristine copy of a cache returned by a forward
        self.next_id = 1

    def function(self, name):
        fn = self.module.__dict__.get(name)
        if fn is None or not callable(fn):
            return None
        return fn

    def run(self):
        while True:
            try:
                meta, arrays = _recv(self.fd_in)
            except EOFError:
                return
            handler = {"call": self.call, "backward": self.backward, "sweep": self.sweep,
                       "reset": self.reset}.get(meta.get("op"))
            if handler is None:
                _send(self.fd_out, {"ok": False, "error": {"kind": "protocol",
                                                            "message": f"unknown op {meta.get('op')!r}"}})
                continue
            answer, out = handler(meta, arrays)
            _restore()
            _send(self.fd_out, answer, out)

    def reset(self, meta, arrays):
        self.caches.clear()
        return {"ok": True}, {}

    def _missing(self, name):
        return {"ok": False, "error": {"kind": "not_defined", "message": f"{name} is not defined"}}, {}

    def call(self, meta, arrays):
        """Call a function; a forward's (out, cache) keeps the cache here under an id."""
        name = meta["fn"]
        fn = self.function(name)
        if fn is None:
            return self._missing(name)
        args = [_decode(e, arrays) for e in meta["args"]]
        kwargs = _fresh_kwargs({k: _decode(e, arrays) for k, e in meta["kwargs"].items()})
        before = [_copy(a) for a in args]
        start = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except _BaseException as exc:
            _restore()
            return {"ok": False, "error": _error(exc, self.filenames, time.perf_counter() - start)}, {}
        elapsed = time.perf_counter() - start
        _restore()
        flags = []
        names = _arg_names(fn, _len(args))
        for i, (a, b) in enumerate(zip(before, args)):
            if not _same(a, b):
                flags.append(f"{name} changed its input {names[i]} in place; a function must not "
                             "modify its inputs (copy first, e.g. x = x.copy())")
        out = {}
        answer = {"ok": True, "elapsed": elapsed, "flags": flags}
        if meta.get("pair"):
            if _type(result) not in (tuple, list) or _len(result) != 2:
                answer["value"] = _describe_value(result, out, "r")
                answer["not_pair"] = True
                return answer, out
            value, cache = result
            answer["value"] = _describe_value(value, out, "r")
            if meta.get("keep"):
                cache_id = self.next_id
                self.next_id += 1
                self.caches[cache_id] = _copy(cache)
                while _len(self.caches) > 8:
                    del self.caches[min(self.caches)]
                answer["cache_id"] = cache_id
            answer["cache_type"] = _type_name(cache)
        else:
            answer["value"] = _describe_value(result, out, "r")
        return answer, out

    def backward(self, meta, arrays):
        name = meta["fn"]
        fn = self.function(name)
        if fn is None:
            return self._missing(name)
        if meta.get("empty_cache"):       # to tell "not implemented" from "needs a cache"
            self.caches[0] = {}
        pristine = self.caches.get(meta["cache_id"])
        if pristine is None and meta["cache_id"] not in self.caches:
            return {"ok": False, "error": {"kind": "protocol", "message": "unknown cache id"}}, {}
        cache = _copy(pristine)
        dout = arrays["dout"]
        dout_given = dout.copy()
        start = time.perf_counter()
        try:
            result = fn(dout, cache)
        except _BaseException as exc:
            _restore()
            return {"ok": False, "error": _error(exc, self.filenames, time.perf_counter() - start)}, {}
        elapsed = time.perf_counter() - start
        _restore()
        flags = []
        if not _same(pristine, cache):
            flags.append(f"{name} changed its cache in place; a backward must leave the cache "
                         "as the forward returned it (a second backward call would see other values)")
        if not _same(dout_given, dout):
            flags.append(f"{name} changed dout in place; dout belongs to the caller -- copy it "
                         "before modifying it")
        out = {}
        answer = {"ok": True, "elapsed": elapsed, "flags": flags,
                  "value": _describe_value(result, out, "g")}
        return answer, out

    def sweep(self, meta, arrays):
        """Forward outputs at many points that differ from the base inputs in one entry.

        ``values`` (n_coords, n_steps) holds the new value of entry ``coords[i]`` of input
        ``input``; the outputs come back as float64, shape (n_done, *out_shape), in row-major
        order of (coord, step). Stops at the first call that fails or after ``budget`` seconds.
        """
        name = meta["fn"]
        fn = self.function(name)
        if fn is None:
            return self._missing(name)
        base = [_decode(e, arrays) for e in meta["args"]]
        kwargs = {k: _decode(e, arrays) for k, e in meta["kwargs"].items()}
        p, coords, values = meta["input"], meta["coords"], arrays["values"]
        x = base[p]
        deadline = time.perf_counter() + float(meta.get("budget", 1.0))
        outs, shape = [], None
        for i, j in enumerate(coords):
            for k in range(values.shape[1]):
                args = [a.copy() if _isinstance(a, _ndarray) else a for a in base]
                xp = x.copy()
                xp.reshape(-1)[j] = values[i, k]
                args[p] = xp
                try:
                    result = fn(*args, **_fresh_kwargs(kwargs))
                except _BaseException:
                    _restore()
                    return self._swept(outs)
                _restore()
                if _type(result) not in (tuple, list) or _len(result) != 2:
                    return self._swept(outs)
                y = result[0]
                if not (_type(y) is _ndarray or (_isinstance(y, _generic) and _type(y).__module__ == "numpy")
                        or _type(y) in (float, int)):
                    return self._swept(outs)
                y = np.asarray(y)
                if y.dtype.kind not in "biuf" or (shape is not None and y.shape != shape):
                    return self._swept(outs)
                shape = y.shape
                outs.append(np.array(y, dtype=np.float64))
                if time.perf_counter() > deadline:
                    return self._swept(outs)
        return self._swept(outs)

    @staticmethod
    def _swept(outs):
        if not outs:
            return {"ok": True, "n_done": 0}, {}
        return {"ok": True, "n_done": _len(outs)}, {"outs": np.stack(outs)}


def main(argv):
    fd_in, fd_out = int(argv[1]), int(argv[2])
    try:
        with open("submission.json", encoding="utf-8") as f:
            chunks = json.load(f)["chunks"]
    except _BaseException as exc:
        _send(fd_out, {"ok": False, "error": {"kind": "protocol", "message": f"cannot read the "
                                                                          f"submission: {exc}"}})
        return 0
    _install_blocker()
    _save_modules()
    _send(fd_out, {"ok": True, "started": True})   # the time limit of loading starts now
    module, error, warnings = _load(chunks)
    _restore()
    filenames = {c["filename"] for c in chunks}
    if error is not None:
        _send(fd_out, {"ok": False, "error": error, "warnings": warnings})
        return 0
    _send(fd_out, {"ok": True, "defined": _defined(module), "warnings": warnings})
    Server(module, filenames, fd_in, fd_out).run()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    os._exit(code)  # skip interpreter shutdown: atexit handlers of the submission do not run
